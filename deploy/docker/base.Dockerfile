# A stand-in for python:3.11-slim-bookworm, for machines that reach a Debian mirror and PyPI but
# no container registry. scripts/images.py makes DEBIAN_IMAGE with mmdebstrap (Debian bookworm,
# minbase, python3 and ca-certificates from the mirror) and `podman import`, then builds this:
#
#   podman build --format docker -f deploy/docker/base.Dockerfile \
#       --build-arg DEBIAN_IMAGE=localhost/dpfl-debian:bookworm -t localhost/dpfl-python:3.11-bookworm .
#
# Like the official image, `python` and `pip` are first on PATH and pip may install into the
# interpreter's environment (Debian's own python3 refuses that, PEP 668): a virtual environment
# at /opt/python. The coordinator and agent Dockerfiles build on it unchanged.
ARG DEBIAN_IMAGE=localhost/dpfl-debian:bookworm
FROM ${DEBIAN_IMAGE}

RUN python3 -m venv /opt/python \
 && /opt/python/bin/python -m pip --version

ENV PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8

CMD ["python3"]
