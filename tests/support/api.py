"""The REST API under test: a coordinator store holding a real finished job, the app over it, and
a live uvicorn server.

``build_finished_job(store)`` goes through the store's public API only, as the coordinator
would: agents enrol with one-time tokens (getting their REST tokens), a DP-FedAvg job runs three
rounds with every stage recorded (a dropout in round 2, an aborted first attempt of round 3 that
is redone), each round commits real privacy events to the ledger before it completes with an
accuracy and a model version; a second, PATE-FL job charges two of the clients again, so their
budgets compose two jobs. The DP-FedAvg entries carry their round's own-noise fraction f₁
(:data:`FEDAVG_OWN_FRACTION`); the PATE-FL entries carry none, as entries written before the
coordinator recorded it, so those two clients' own-share figures are unknown.

``make_app(store)`` / ``app_for_url(url)`` build the app the way ``dpfl-coordinator serve`` does
(a later end-to-end test over ``dpfl simulate`` can point ``app_for_url`` at the simulation's
database); ``live_server(app)`` serves it with uvicorn on a free loopback port.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
import uvicorn
from fastapi import FastAPI

from dpfl.accounting import GaussianEvent, PoissonSampledEvent, VotingEvent
from dpfl.learning.jobs import parse_job
from dpfl.server.api import create_app
from dpfl.server.jobs_control import StoreJobControl
from dpfl.server.metrics import Metrics
from dpfl.server.settings import Settings
from dpfl.server.store import (
    ROUND_SETUP_VERSION,
    STAGES,
    Budget,
    Charge,
    Enrollment,
    Job,
    JobStatus,
    ProtectedUnit,
    Round,
    RoundSetup,
    Store,
    open_store,
)
from support.paths import ROOT

#: ``make demo``'s job file.
DEMO_PATH = ROOT / "examples" / "demo-dpfedavg.yaml"
FEDAVG_YAML = """\
name: dashboard-dpfedavg
algorithm: dp-fedavg
data: {dataset: digits, partition: {scheme: shards, classes_per_agent: 3}, public_fraction: 0.0}
model: logreg
rounds: 3
privacy: {unit: agent, delta: 1.0e-5, noise_multiplier: 2.0, honest_fraction: 1.0, noise: skellam}
secagg: {enabled: true, corrupt_fraction: 0.05, dropout_fraction: 0.05}
params: {clip: 1.0, sampling_rate: 0.8, local_steps: 5, learning_rate: 0.5}
"""
PATE_YAML = """\
name: dashboard-pate
algorithm: pate-fl
data: {dataset: digits, partition: iid, public_fraction: 0.2}
rounds: 1
privacy: {unit: agent, delta: 1.0e-5, target_epsilon: 8.0}
params: {queries: 50, sigma: 40.0}
"""
#: The DP-FedAvg round's charge to every member: Poisson-sampled Gaussian sum (agent level).
FEDAVG_EVENT = PoissonSampledEvent(0.8, GaussianEvent(sigma=2.0))
#: The PATE-FL round's charge to each voter: 50 noisy votes at agent level (add/remove its vote
#: block: the same relation as the DP-FedAvg job's, so the clients' figures compose tightly).
PATE_EVENT = VotingEvent(queries=50, sigma=40.0, level="agent")
#: f₁ of the DP-FedAvg rounds: one agent's share carries a quarter of the charged noise variance
FEDAVG_OWN_FRACTION = 0.25
ACCURACY = {1: 0.52, 2: 0.71, 3: 0.78}
BUDGETS: tuple[Budget | None, ...] = (
    Budget(epsilon=4.5, delta=1e-5),
    Budget(epsilon=10.0, delta=1e-5),
    Budget(epsilon=10.0, delta=1e-6),
    Budget(epsilon=20.0, delta=1e-5),
    None,  # no limit: remaining is null
)


@dataclass(frozen=True)
class FinishedJob:
    """What :func:`build_finished_job` stored."""

    job: Job
    pate_job: Job
    enrollments: dict[str, Enrollment]
    rounds: list[Round] = field(default_factory=list)

    @property
    def client_ids(self) -> list[str]:
        return list(self.enrollments)

    def api_token(self, client_id: str) -> str:
        return self.enrollments[client_id].api_token


def _setup(ids: list[str]) -> RoundSetup:
    """A round record holding the whole population as its sample."""
    return RoundSetup(
        version=ROUND_SETUP_VERSION,
        population=len(ids),
        sample=ids,
        sample_population=ids,
        sample_kept=False,
    )


def _stage_times(base: float) -> dict[str, float]:
    return {stage: round(base * (i + 1) * 0.01, 4) for i, stage in enumerate(STAGES)}


def _run_stages(
    store: Store,
    rnd: Round,
    alive: list[str],
    drops: dict[str, list[str]],
    seconds: float,
    *,
    until: str = "masked_input",
) -> list[str]:
    """Record every stage up to ``until`` (the last one before the commit by default); returns
    who survived it."""
    for stage in STAGES[: STAGES.index(until) + 1]:
        gone = [a for a in drops.get(stage, []) if a in alive]
        alive = [a for a in alive if a not in gone]
        store.record_stage(
            rnd.id, stage, survivors=alive, dropped=gone, seconds=_stage_times(seconds)[stage]
        )
    return alive


def _finish_stages(store: Store, rnd: Round, alive: list[str], seconds: float) -> None:
    for stage in ("unmask", "decode"):
        store.record_stage(rnd.id, stage, survivors=alive, seconds=_stage_times(seconds)[stage])


def build_finished_job(store: Store, *, agents: int = 5) -> FinishedJob:
    """Enrol ``agents`` clients and run a complete DP-FedAvg job and a PATE-FL job through the
    store (see the module docstring)."""
    enrollments: dict[str, Enrollment] = {}
    for i in range(agents):
        issued = store.create_enrollment_token(
            ttl=timedelta(hours=1), budget=BUDGETS[i % len(BUDGETS)], labels={"site": f"s{i}"}
        )
        enrolled = store.redeem_enrollment_token(issued.token, name=f"silo-{i}")
        enrollments[enrolled.agent.id] = enrolled
    ids = list(enrollments)

    job = store.create_job(parse_job(FEDAVG_YAML), members=ids)
    store.set_job_status(job.id, JobStatus.RUNNING)
    store.add_model_version(job.id, b"initial model " + job.id.encode())
    rounds: list[Round] = []
    charges = [
        Charge(a, FEDAVG_EVENT, ProtectedUnit.AGENT, own_noise_fraction=FEDAVG_OWN_FRACTION)
        for a in ids
    ]
    for number in (1, 2, 3):
        if number == 3:  # first attempt: two agents gone before advertising keys -> aborted
            rnd = store.start_round(job.id, number, invited=ids, setup=_setup(ids))
            store.update_round(rnd.id, accepted=ids)
            _run_stages(
                store, rnd, ids, {"advertise_keys": ids[-2:]}, seconds=1.0, until="advertise_keys"
            )
            rounds.append(
                store.abort_round(rnd.id, reason="too few survivors after advertise_keys (3 < 4)")
            )
        setup = _setup(ids).model_copy(update={"declined": {}, "restored_noise_shares": 0})
        rnd = store.start_round(job.id, number, invited=ids, setup=setup)
        store.update_round(rnd.id, accepted=ids)
        drops = {"share_keys": [ids[1]]} if number == 2 else {}
        alive = _run_stages(store, rnd, ids, drops, seconds=float(number))
        store.commit_round(rnd.id, charges)  # every member of the population is charged
        _finish_stages(store, rnd, alive, seconds=float(number))
        rounds.append(
            store.complete_round(
                rnd.id, accuracy=ACCURACY[number], model=f"model v{number}".encode()
            )
        )
    store.set_job_status(job.id, JobStatus.COMPLETED)

    voters = ids[:2]
    pate = store.create_job(parse_job(PATE_YAML), members=voters)
    store.set_job_status(pate.id, JobStatus.RUNNING)
    rnd = store.start_round(pate.id, 1, invited=voters)
    store.update_round(rnd.id, accepted=voters)
    alive = _run_stages(store, rnd, voters, {}, seconds=0.5)
    store.commit_round(rnd.id, [Charge(a, PATE_EVENT, ProtectedUnit.AGENT) for a in voters])
    _finish_stages(store, rnd, alive, seconds=0.5)
    store.complete_round(rnd.id, accuracy=0.83, model=b"student")
    store.set_job_status(pate.id, JobStatus.COMPLETED)
    return FinishedJob(
        job=store.get_job(job.id),
        pate_job=store.get_job(pate.id),
        enrollments=enrollments,
        rounds=rounds,
    )


def admin_settings(**overrides: Any) -> Settings:
    """Settings with a fresh random admin token (``settings.admin_token.get_secret_value()``)."""
    return Settings(admin_token=secrets.token_urlsafe(32), **overrides)


def make_app(
    store: Store, *, settings: Settings | None = None, metrics: Metrics | None = None
) -> FastAPI:
    """The app as a coordinator without an orchestrator serves it."""
    return create_app(
        store=store,
        settings=settings or admin_settings(),
        jobs=StoreJobControl(store),
        metrics=metrics,
    )


@contextmanager
def app_for_url(url: str, *, settings: Settings | None = None) -> Iterator[FastAPI]:
    """Open the store at ``url`` and build the app over it (closing the store afterwards)."""
    with open_store(url) as store:
        yield make_app(store, settings=settings)


@contextmanager
def live_server(
    app: FastAPI,
    *,
    timeout: float = 10.0,
    tls: tuple[Path, Path] | None = None,
) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free loopback port (HTTPS with ``tls`` = (certificate,
    key)); yields its base URL."""
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=0,
        log_level="warning",
        lifespan="off",
        ssl_certfile=str(tls[0]) if tls else None,
        ssl_keyfile=str(tls[1]) if tls else None,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout)


def bearer(token: str) -> dict[str, str]:
    """The ``Authorization`` header of a bearer token."""
    return {"Authorization": f"Bearer {token}"}


def snapshot(url: str) -> dict[str, list[tuple[str, ...]]]:
    """Every row of every table of the SQL database at ``url``, sorted: equal snapshots prove
    that nothing was written in between."""
    engine = sa.create_engine(url)
    try:
        meta = sa.MetaData()
        meta.reflect(engine)
        with engine.connect() as conn:
            return {
                name: sorted(tuple(map(repr, row)) for row in conn.execute(sa.select(table)))
                for name, table in sorted(meta.tables.items())
            }
    finally:
        engine.dispose()
