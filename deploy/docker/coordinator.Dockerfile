# syntax=docker/dockerfile:1
# The dpfl coordinator: gRPC for the agents (50051) and the REST API + dashboard (8080), served
# with TLS and mutual TLS by default. Build from the repository root (docs/deploy.md):
#
#   docker build -f deploy/docker/coordinator.Dockerfile -t dpfl-coordinator .
#
# Mount the federation's certificates (`dpfl-coordinator certs init`) at /etc/dpfl/tls and keep
# /var/lib/dpfl on a volume: the SQLite database (the default DPFL_DATABASE_URL) and any data
# set files live there. Set DPFL_ADMIN_TOKEN; set DPFL_DATABASE_URL=postgresql://... for
# PostgreSQL (the driver is installed). Migrations run at every start.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}

# PyTorch comes first, in its own layer, as the CPU wheel: the coordinator builds, averages and
# evaluates models (and trains students for PATE-style jobs), on the CPU. The lines up to this
# RUN are the agent Dockerfile's, word for word, so that both images share the torch layer when
# built on the same base (scripts/images.py). TORCH_INDEX_URL selects another build.
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
RUN pip install "./src[postgres]" && rm -rf ./src
COPY examples ./examples

RUN groupadd --system --gid 10001 dpfl \
 && useradd --system --uid 10001 --gid dpfl --home-dir /var/lib/dpfl --shell /usr/sbin/nologin dpfl \
 && mkdir -p /var/lib/dpfl /etc/dpfl/tls \
 && chown dpfl:dpfl /var/lib/dpfl
USER dpfl
VOLUME ["/var/lib/dpfl"]

ENV DPFL_DATABASE_URL=sqlite:////var/lib/dpfl/dpfl.db \
    DPFL_DATA_DIR=/var/lib/dpfl/data \
    DPFL_GRPC_HOST=0.0.0.0 \
    DPFL_GRPC_PORT=50051 \
    DPFL_API_HOST=0.0.0.0 \
    DPFL_API_PORT=8080
EXPOSE 50051 8080

# https when the coordinator serves TLS (plain http only for one started with --insecure)
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["dpfl-coordinator", "healthcheck"]

ENTRYPOINT ["dpfl-coordinator"]
CMD ["serve", "--host", "0.0.0.0", "--tls-cert", "/etc/dpfl/tls/coordinator.pem", "--tls-key", "/etc/dpfl/tls/coordinator.key", "--client-ca", "/etc/dpfl/tls/ca.pem", "--require-client-cert"]
