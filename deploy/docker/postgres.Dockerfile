# PostgreSQL from Debian's own package, for machines with a Debian mirror and no registry
# (scripts/image_test.py runs the containerised federation on it). Where a registry answers,
# the official postgres image does the same job. It takes the official image's variables:
# POSTGRES_USER, POSTGRES_DB and POSTGRES_PASSWORD (from the environment, never a flag); the
# cluster is made at the first start in the volume /var/lib/postgresql/data.
#
#   podman build --format docker -f deploy/docker/postgres.Dockerfile -t localhost/dpfl-postgres:15 .
ARG DEBIAN_IMAGE=localhost/dpfl-debian:bookworm
FROM ${DEBIAN_IMAGE}

# uid and gid 999, as in the official image, which deploy/k8s/coordinator/postgres.yaml runs as
# (runAsUser: 999); the package keeps an existing postgres user
RUN groupadd --system --gid 999 postgres \
 && useradd --system --uid 999 --gid postgres --home-dir /var/lib/postgresql --shell /bin/sh postgres \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql-15 \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /var/lib/postgresql/data /run/postgresql \
 && chown -R postgres:postgres /var/lib/postgresql /run/postgresql

COPY deploy/docker/postgres/entrypoint.sh /usr/local/bin/dpfl-postgres
ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PGDATA=/var/lib/postgresql/data
USER postgres
VOLUME ["/var/lib/postgresql/data"]
EXPOSE 5432
HEALTHCHECK --interval=5s --timeout=5s --retries=30 \
    CMD ["pg_isready", "--host", "127.0.0.1"]
ENTRYPOINT ["/bin/sh", "/usr/local/bin/dpfl-postgres"]
