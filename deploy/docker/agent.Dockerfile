# syntax=docker/dockerfile:1
# The dpfl agent, one per silo: trains on the silo's data and takes part in secure aggregation.
# Build from the repository root (docs/deploy.md):
#
#   docker build -f deploy/docker/agent.Dockerfile -t dpfl-agent .                    # CPU
#   docker build -f deploy/docker/agent.Dockerfile -t dpfl-agent:cuda \
#       --build-arg BASE_IMAGE=pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime .      # GPU
#
# With a CUDA PyTorch base the base's torch is kept (any torch >= 2.6); run the container with
# the GPU visible (`docker run --gpus all`, or a `nvidia.com/gpu` limit on Kubernetes) and the
# agent trains on `cuda` (`--device auto`). Mount the silo's data read-only at /data, its
# certificates at /etc/dpfl/tls and keep /var/lib/dpfl-agent (credential + local privacy
# ledger) on a volume of its own.
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

# The CPU wheel unless the base image already has PyTorch (a CUDA base keeps its own).
ARG TORCH_SPEC=torch==2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN python -c "import torch" 2>/dev/null \
 || pip install --index-url "${TORCH_INDEX_URL}" "${TORCH_SPEC}"

WORKDIR /opt/dpfl
COPY pyproject.toml README.md ./src/
COPY accounting ./src/accounting
COPY secagg ./src/secagg
COPY mechanisms ./src/mechanisms
COPY learning ./src/learning
COPY protos ./src/protos
COPY server ./src/server
COPY client ./src/client
COPY cli ./src/cli
COPY cmdline ./src/cmdline
COPY api ./src/api
RUN pip install ./src && rm -rf ./src

RUN groupadd --system --gid 10001 dpfl \
 && useradd --system --uid 10001 --gid dpfl --home-dir /var/lib/dpfl-agent --shell /usr/sbin/nologin dpfl \
 && mkdir -p /var/lib/dpfl-agent /etc/dpfl/tls /data \
 && chown dpfl:dpfl /var/lib/dpfl-agent
USER dpfl
VOLUME ["/var/lib/dpfl-agent"]
ENV DPFL_DATA_DIR=/data

# The agent listens on no port: it dials the coordinator, reconnects with backoff on its own,
# and exits (non-zero) only on errors a restart cannot fix without a person (docs/agent.md).
ENTRYPOINT ["dpfl-agent"]
CMD ["run", "--help"]
