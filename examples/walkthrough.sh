#!/usr/bin/env bash
# A federation on one machine, as a deployment runs it: the coordinator's CA and the federation
# CA, a key made on each silo with its TLS and peer certificates, the coordinator with mutual TLS,
# one enrolment token and one agent per silo, a job that fits its 3 agents, the budgets and the
# REST API. Run it from the repository root; it stops what it started. WORK (default: a fresh
# temporary folder), GRPC_PORT, API_PORT, AGENTS, JOB_FILE and POLICY (each silo's policy) may
# be set: AGENTS=30 JOB_FILE=examples/dp-fedavg-malicious.yaml runs 30 agents with the
# malicious-secure protocol (its verified ε is 11.3: add max_epsilon_per_job: 12 to POLICY).
set -euo pipefail
REPO=$PWD
WORK="${WORK:-$(mktemp -d)}"
AGENTS="${AGENTS:-3}"
JOB_FILE="${JOB_FILE:-examples/dp-fedsgd.yaml}"
POLICY="${POLICY:-max_colluding_peers: 0}"  # each silo's own trust assumption (docs/agent.md)
GRPC_PORT="${GRPC_PORT:-50051}"
API_PORT="${API_PORT:-8080}"
WAIT_LIMIT="${WAIT_LIMIT:-600}"
cd "$WORK"
export DPFL_ADMIN_TOKEN=${DPFL_ADMIN_TOKEN:-$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')}
export DPFL_DATABASE_URL=sqlite:///$WORK/dpfl.db
started=()
trap 'kill "${started[@]}" 2>/dev/null || true; wait' EXIT
wait_for() {  # wait_for WHAT COMMAND...: retry COMMAND until it succeeds, at most WAIT_LIMIT s
    local what=$1 deadline=$((SECONDS + WAIT_LIMIT)); shift
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS > deadline)); then echo "gave up after ${WAIT_LIMIT} s waiting for $what" >&2; exit 1; fi
        sleep 0.5
    done
}

# 1. certificates: the coordinator's CA and its own (for localhost, 127.0.0.1); the federation
#    CA, which the coordinator's operator never holds; each silo's key, made on the silo, and
#    its one CSR signed by both: a TLS certificate and a peer certificate
dpfl-coordinator certs init --out pki
dpfl federation init --out federation
for i in $(seq "$AGENTS"); do
    dpfl-agent keygen "silo-$i" --out "silo-$i"
    dpfl-coordinator certs sign "silo-$i/silo-$i.csr" --ca-dir pki --out "silo-$i"
    dpfl federation sign "silo-$i/silo-$i.csr" --ca-dir federation --out "silo-$i"
    printf '%s\n' "$POLICY" >"silo-$i/policy.yaml"
done

# 2. the coordinator, mutual TLS on gRPC and HTTPS on REST
dpfl-coordinator serve --host 127.0.0.1 --grpc-port "$GRPC_PORT" --api-port "$API_PORT" \
    --tls-cert pki/coordinator.pem --tls-key pki/coordinator.key \
    --client-ca pki/ca.pem --require-client-cert >coordinator.log 2>&1 &
started+=($!)
wait_for "the coordinator to serve (coordinator.log)" dpfl-coordinator healthcheck --port "$API_PORT"

# 3. one enrolment token per agent, then each agent with its certificate and its token
dpfl-coordinator enroll-token --count "$AGENTS" --budget-epsilon 8 >tokens.txt
for i in $(seq "$AGENTS"); do
    sed -n "${i}p" tokens.txt >"silo-$i/token"
    dpfl-agent run --coordinator "127.0.0.1:$GRPC_PORT" --name "silo-$i" --state-dir "silo-$i/state" \
        --data "digits#index=$((i - 1))&agents=$AGENTS&partition=iid&seed=0&public_fraction=0.0" \
        --enrollment-token-file "silo-$i/token" \
        --ca "silo-$i/ca.pem" --cert "silo-$i/silo-$i.pem" --key "silo-$i/silo-$i.key" \
        --peer-ca "silo-$i/federation-ca.pem" --peer-cert "silo-$i/silo-$i.peer.pem" \
        --policy "silo-$i/policy.yaml" >"silo-$i/agent.log" 2>&1 &
    started+=($!)
done
enrolled() { [ "$(dpfl-coordinator agent list --status active | wc -l)" -ge "$AGENTS" ]; }
wait_for "$AGENTS agents to enrol (silo-*/agent.log)" enrolled

# 4. a job that fits its agents: by default DP-FedSGD on digits, record-level ε = 4, 5 rounds
JOB=$(dpfl-coordinator job submit "$REPO/$JOB_FILE" --start | cut -f1)
finished() { dpfl-coordinator job list | grep -q "^$JOB.*\(completed\|failed\|stopped\)"; }
wait_for "job $JOB to finish (coordinator.log)" finished
dpfl-coordinator job list | grep "^$JOB"
dpfl-coordinator job list | grep -q "^$JOB.*completed"

# 5. the budgets every agent has spent, and the job through the REST API
DPFL_TOKEN=$DPFL_ADMIN_TOKEN dpfl budget --coordinator "https://127.0.0.1:$API_PORT" --ca pki/ca.pem
curl --fail --silent --show-error --cacert pki/ca.pem -H "Authorization: Bearer $DPFL_ADMIN_TOKEN" \
    "https://127.0.0.1:$API_PORT/api/v1/jobs/$JOB"
echo
