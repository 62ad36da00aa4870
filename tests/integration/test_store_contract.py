"""The store contract, part 1: agents, secrets, enrollment, jobs, rounds and model versions.

One abstract class, run against every database (SQLite, PostgreSQL) by the
subclasses at the bottom; the ledger half of the contract is in test_store_ledger.py.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import replace
from datetime import timedelta

import pytest
from support.databases import FakeClock, PostgresBackend, SqliteBackend

from dpfl.learning.jobs import job_to_dict, parse_job
from dpfl.server.errors import (
    AlreadyExists,
    Conflict,
    InvalidCredential,
    InvalidInput,
    InvalidTransition,
    NotFound,
)
from dpfl.server.store import (
    ROUND_SETUP_VERSION,
    AgentStatus,
    Budget,
    CredentialKind,
    JobStatus,
    PrivacyAuditFigures,
    RoundSetup,
    RoundStatus,
    Store,
)
from dpfl.server.store.round_setup import PlanRecord

SPEC = parse_job({"name": "demo", "algorithm": "dp-fedavg", "privacy": {"target_epsilon": 4.0}})


AUDIT = PrivacyAuditFigures(
    mode="white-box",
    unit="record",
    relation="add-remove",
    canaries=1000,
    guesses=200,
    correct=180,
    confidence=0.95,
    delta=1e-5,
    epsilon_lower=0.9,
    epsilon_upper=2.0,
    mu_lower=0.31,
    epsilon_lower_gdp=1.2,
    details={"design": "canary records", "rounds": 1},
)


def running_job(store: Store, members: list[str]) -> str:
    job = store.create_job(SPEC, members=members)
    store.set_job_status(job.id, JobStatus.RUNNING)
    return job.id


class StoreContract:
    """Abstract: a subclass provides the ``store`` fixture (see support.databases)."""

    # agents --------------------------------------------------------------------------------------
    def test_agents_are_created_read_and_listed(self, store: Store, clock: FakeClock) -> None:
        a = store.create_agent(name="Hospital A", labels={"region": "eu"}, budget=Budget(4, 1e-5))
        clock.advance(seconds=1)
        b = store.create_agent(name="Bank B", agent_id="bank-b")
        assert a.id.startswith("agent-")
        assert b.id == "bank-b"
        assert store.get_agent(a.id) == a
        assert a.created_at == clock.now - timedelta(seconds=1)
        assert a.created_at.tzinfo is not None
        assert [x.id for x in store.list_agents()] == [a.id, b.id]
        assert store.get_agent(a.id).budget == Budget(4.0, 1e-5)
        assert store.get_agent("bank-b").budget is None

    def test_records_are_copies(self, store: Store) -> None:
        a = store.create_agent(name="A", labels={"k": "v"})
        a.labels["k"] = "changed"
        assert store.get_agent(a.id).labels == {"k": "v"}

    def test_agent_errors(self, store: Store) -> None:
        store.create_agent(name="A", agent_id="a")
        with pytest.raises(AlreadyExists, match="'a'"):
            store.create_agent(name="again", agent_id="a")
        with pytest.raises(NotFound, match="agent 'zz' not found"):
            store.get_agent("zz")
        with pytest.raises(InvalidInput, match="name"):
            store.create_agent(name="  ")
        with pytest.raises(InvalidInput, match="label key"):
            store.create_agent(name="x", labels={"bad key": "v"})
        with pytest.raises(InvalidInput, match="agent id"):
            store.create_agent(name="x", agent_id="has space")
        with pytest.raises(InvalidInput, match="budget epsilon"):
            Budget(-1, 1e-5)
        with pytest.raises(InvalidInput, match="budget delta"):
            Budget(1, 1.5)

    def test_budget_and_status_changes(self, store: Store) -> None:
        a = store.create_agent(name="A")
        assert store.set_agent_budget(a.id, Budget(2, 1e-6)).budget == Budget(2, 1e-6)
        assert store.set_agent_budget(a.id, None).budget is None
        assert store.set_agent_status(a.id, AgentStatus.DISABLED).status == AgentStatus.DISABLED
        assert store.list_agents(status=AgentStatus.ACTIVE) == []
        with pytest.raises(NotFound):
            store.set_agent_budget("nope", None)

    # credentials ---------------------------------------------------------------------------------
    def test_credentials_authenticate_only_their_agent(self, store: Store) -> None:
        a = store.create_agent(name="A")
        b = store.create_agent(name="B")
        cred_a = store.issue_credential(a.id)
        cred_b = store.issue_credential(b.id)
        assert cred_a.startswith("dpfl_agent_")
        assert len(cred_a) > 40
        assert store.authenticate_agent(a.id, cred_a) == a
        for agent_id, cred in [(a.id, cred_b), (b.id, cred_a), ("ghost", cred_a), (a.id, "")]:
            with pytest.raises(InvalidCredential, match=r"^unknown agent or invalid credential$"):
                store.authenticate_agent(agent_id, cred)

    def test_revocation_rotation_and_disabled_agents(self, store: Store) -> None:
        a = store.create_agent(name="A")
        old = store.issue_credential(a.id)
        new = store.issue_credential(a.id, rotate=True)
        with pytest.raises(InvalidCredential):
            store.authenticate_agent(a.id, old)
        assert store.authenticate_agent(a.id, new).id == a.id
        store.set_agent_status(a.id, AgentStatus.DISABLED)
        with pytest.raises(InvalidCredential):
            store.authenticate_agent(a.id, new)
        store.set_agent_status(a.id, AgentStatus.ACTIVE)
        assert store.revoke_credentials(a.id) == 1
        with pytest.raises(InvalidCredential):
            store.authenticate_agent(a.id, new)

    def test_api_tokens(self, store: Store) -> None:
        a = store.create_agent(name="A")
        api = store.issue_credential(a.id, kind=CredentialKind.API)
        agent_cred = store.issue_credential(a.id)
        assert api.startswith("dpfl_api_")
        assert store.authenticate_api_token(api).id == a.id
        for bad in (agent_cred, api + "x", "dpfl_api_" + "A" * 43, ""):
            with pytest.raises(InvalidCredential, match="invalid API token"):
                store.authenticate_api_token(bad)
        with pytest.raises(InvalidCredential):  # an API token is not a gRPC credential
            store.authenticate_agent(a.id, api)
        store.revoke_credentials(a.id, kind=CredentialKind.API)
        with pytest.raises(InvalidCredential):
            store.authenticate_api_token(api)
        assert store.authenticate_agent(a.id, agent_cred).id == a.id

    # enrollment ----------------------------------------------------------------------------------
    def test_enrollment_token_is_one_time(self, store: Store) -> None:
        issued = store.create_enrollment_token(
            ttl=timedelta(hours=1), budget=Budget(3, 1e-5), labels={"site": "x", "tier": "a"}
        )
        assert issued.token.startswith("dpfl_enroll_")
        assert issued.token not in repr(issued)
        enrolled = store.redeem_enrollment_token(
            issued.token, name="Silo", labels={"tier": "b"}, default_budget=Budget(9, 1e-5)
        )
        assert enrolled.agent.budget == Budget(3, 1e-5)  # the token's budget wins
        assert enrolled.agent.labels == {"site": "x", "tier": "b"}
        assert store.authenticate_agent(enrolled.agent.id, enrolled.credential) == enrolled.agent
        assert store.authenticate_api_token(enrolled.api_token) == enrolled.agent
        with pytest.raises(InvalidCredential, match="already used"):
            store.redeem_enrollment_token(issued.token, name="Again")
        (info,) = store.list_enrollment_tokens()
        assert info.agent_id == enrolled.agent.id
        assert info.used_at is not None
        assert len(store.list_agents()) == 1

    def test_enrollment_expiry_default_budget_and_unknown_tokens(
        self, store: Store, clock: FakeClock
    ) -> None:
        short = store.create_enrollment_token(ttl=timedelta(minutes=5))
        plain = store.create_enrollment_token(ttl=timedelta(minutes=10))
        clock.advance(minutes=6)
        with pytest.raises(InvalidCredential, match="expired"):
            store.redeem_enrollment_token(short.token, name="Late")
        enrolled = store.redeem_enrollment_token(
            plain.token, name="OnTime", default_budget=Budget(5, 1e-6)
        )
        assert enrolled.agent.budget == Budget(5, 1e-6)
        for bad in ("dpfl_enroll_nope", plain.token[:-1], "", "dpfl_agent_x"):
            with pytest.raises(InvalidCredential, match="unknown enrollment token"):
                store.redeem_enrollment_token(bad, name="X")
        with pytest.raises(InvalidInput):
            store.create_enrollment_token(ttl=timedelta(0))

    def test_failed_redemption_leaves_the_token_unused(self, store: Store) -> None:
        issued = store.create_enrollment_token(ttl=timedelta(hours=1))
        with pytest.raises(InvalidInput):
            store.redeem_enrollment_token(issued.token, name="")
        assert store.list_enrollment_tokens()[0].used_at is None
        assert store.redeem_enrollment_token(issued.token, name="ok").agent.name == "ok"

    # jobs ----------------------------------------------------------------------------------------
    def test_jobs_store_the_full_spec(self, store: Store) -> None:
        a = store.create_agent(name="A")
        job = store.create_job(SPEC, members=[a.id])
        assert job.status == JobStatus.PENDING
        assert job.spec == job_to_dict(SPEC)
        assert parse_job(store.get_job(job.id).spec) == SPEC
        assert (job.name, job.algorithm, job.delta) == ("demo", "dp-fedavg", 1e-5)
        assert store.job_members(job.id) == [a.id]
        assert store.agent_jobs(a.id) == [job.id]
        assert store.list_jobs() == [job]
        assert store.list_jobs(status=JobStatus.RUNNING) == []

    def test_job_with_an_unknown_member_is_not_created(self, store: Store) -> None:
        with pytest.raises(NotFound, match="'ghost'"):
            store.create_job(SPEC, members=["ghost"])
        assert store.list_jobs() == []

    def test_job_life_cycle(self, store: Store, clock: FakeClock) -> None:
        job = store.create_job(SPEC)
        clock.advance(seconds=1)
        running = store.set_job_status(job.id, JobStatus.RUNNING)
        assert running.started_at == clock.now
        assert running.finished_at is None
        assert store.set_job_status(job.id, JobStatus.RUNNING) == running  # no-op
        clock.advance(seconds=1)
        stopped = store.set_job_status(job.id, JobStatus.STOPPED)
        assert stopped.finished_at == clock.now
        resumed = store.set_job_status(job.id, JobStatus.RUNNING)
        assert resumed.finished_at is None
        assert resumed.started_at == running.started_at
        failed = store.set_job_status(job.id, JobStatus.FAILED, error="too few agents")
        assert failed.error == "too few agents"
        with pytest.raises(InvalidTransition, match="from failed to running"):
            store.set_job_status(job.id, JobStatus.RUNNING)

    def test_membership_changes(self, store: Store) -> None:
        a, b = store.create_agent(name="A"), store.create_agent(name="B")
        job = store.create_job(SPEC, members=[a.id])
        assert store.add_job_members(job.id, [a.id, b.id]) == sorted([a.id, b.id])
        assert store.remove_job_members(job.id, [a.id]) == [b.id]
        with pytest.raises(NotFound):
            store.add_job_members(job.id, ["ghost"])
        with pytest.raises(InvalidInput, match="duplicates"):
            store.add_job_members(job.id, [a.id, a.id])

    # rounds --------------------------------------------------------------------------------------
    def test_rounds_need_a_running_job(self, store: Store) -> None:
        job = store.create_job(SPEC)
        with pytest.raises(InvalidTransition, match="pending"):
            store.start_round(job.id, 1)
        with pytest.raises(NotFound):
            store.start_round("nope", 1)

    def test_round_bookkeeping(self, store: Store, clock: FakeClock) -> None:
        a, b, c = (store.create_agent(name=n).id for n in "abc")
        job_id = running_job(store, [a, b, c])
        setup = RoundSetup(version=ROUND_SETUP_VERSION, population=3, sample=[a, b, c])
        rnd = store.start_round(job_id, 1, invited=[a, b, c], setup=setup)
        assert (rnd.number, rnd.attempt, rnd.status) == (1, 1, RoundStatus.RUNNING)
        rnd = store.update_round(rnd.id, accepted=[a, b])
        rnd = store.record_stage(rnd.id, "advertise_keys", survivors=[a, b], seconds=0.25)
        rnd = store.record_stage(rnd.id, "share_keys", survivors=[a], dropped=[b], seconds=0.5)
        assert store.get_round(rnd.id) == rnd
        assert rnd.invited == (a, b, c)
        assert rnd.accepted == (a, b)
        assert rnd.survivors == {"advertise_keys": (a, b), "share_keys": (a,)}
        assert rnd.dropped == {"advertise_keys": (), "share_keys": (b,)}
        assert rnd.stage_seconds == {"advertise_keys": 0.25, "share_keys": 0.5}
        assert rnd.setup == setup
        declined = setup.model_copy(update={"declined": {c: "over budget"}})
        rnd = store.update_round(rnd.id, setup=declined)
        assert rnd.setup == declined
        nan = PlanRecord(noise_multiplier=math.nan, calibration={}, population=3, details={})
        with pytest.raises(InvalidInput, match=r"round setup .* finite numbers"):
            store.update_round(rnd.id, setup=declined.model_copy(update={"plan": nan}))
        assert store.get_round(rnd.id).setup.to_json() == {
            "version": ROUND_SETUP_VERSION,
            "population": 3,
            "sample": [a, b, c],
            "declined": {c: "over budget"},
        }
        with pytest.raises(InvalidInput, match="not invited"):
            store.update_round(rnd.id, invited=[a], accepted=[a, b])
        with pytest.raises(InvalidInput, match="unknown stage"):
            store.record_stage(rnd.id, "lunch", survivors=[], seconds=1)
        with pytest.raises(InvalidInput, match="both surviving and dropped"):
            store.record_stage(rnd.id, "unmask", survivors=[a], dropped=[a], seconds=1)
        with pytest.raises(InvalidInput, match="seconds"):
            store.record_stage(rnd.id, "unmask", survivors=[a], seconds=-1)
        with pytest.raises(NotFound):
            store.update_round(rnd.id, accepted=["ghost"], invited=["ghost"])
        assert store.list_rounds(job_id) == [rnd]

    def test_round_attempts_and_recovery(self, store: Store) -> None:
        a = store.create_agent(name="a").id
        job_id = running_job(store, [a])
        first = store.start_round(job_id, 1)
        with pytest.raises(Conflict, match="unfinished attempt 1"):
            store.start_round(job_id, 1)
        assert store.interrupted_rounds() == [first]
        (aborted,) = store.abort_interrupted_rounds(reason="coordinator restarted")
        assert aborted.status == RoundStatus.ABORTED
        assert aborted.abort_reason == "coordinator restarted"
        assert store.interrupted_rounds(job_id=job_id) == []
        second = store.start_round(job_id, 1)
        assert second.attempt == 2
        assert [r.attempt for r in store.list_rounds(job_id, number=1)] == [1, 2]

    def test_round_state_machine(self, store: Store) -> None:
        a = store.create_agent(name="a").id
        job_id = running_job(store, [a])
        rnd = store.start_round(job_id, 1)
        with pytest.raises(InvalidTransition, match="only a committed round completes"):
            store.complete_round(rnd.id)
        aborted = store.abort_round(rnd.id, reason="too few survivors")
        assert store.abort_round(rnd.id, reason="again") == aborted  # idempotent
        with pytest.raises(InvalidTransition):
            store.update_round(rnd.id, accepted=[])
        with pytest.raises(InvalidTransition):
            store.record_stage(rnd.id, "unmask", survivors=[], seconds=0)
        with pytest.raises(InvalidInput, match="reason"):
            store.abort_round(rnd.id, reason="")
        with pytest.raises(NotFound):
            store.abort_round(99999, reason="x")

    # model versions ------------------------------------------------------------------------------
    def test_model_versions(self, store: Store) -> None:
        job = store.create_job(SPEC)
        with pytest.raises(NotFound, match="no model version yet"):
            store.get_model_version(job.id)
        v0 = store.add_model_version(job.id, b"initial")
        v1 = store.add_model_version(job.id, bytearray(b"second"))
        assert (v0.version, v1.version) == (0, 1)
        assert v1.sha256 == hashlib.sha256(b"second").hexdigest()
        assert v1.size == 6
        assert store.get_model_version(job.id).data == b"second"
        assert store.get_model_version(job.id, 0).data == b"initial"
        listed = store.list_model_versions(job.id)
        assert [m.version for m in listed] == [0, 1]
        assert all(m.data is None for m in listed)
        with pytest.raises(NotFound, match="no model version 7"):
            store.get_model_version(job.id, 7)
        with pytest.raises(InvalidInput):
            store.add_model_version(job.id, "text")  # type: ignore[arg-type]

    # audits --------------------------------------------------------------------------------------
    def test_audits_are_stored_with_their_job_oldest_first(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = store.create_job(SPEC)
        other = store.create_job(SPEC)
        assert store.list_privacy_audits(job.id) == []
        first = store.add_privacy_audit(job.id, AUDIT)
        clock.advance(seconds=5)
        second = store.add_privacy_audit(
            job.id, replace(AUDIT, mode="black-box", epsilon_upper=math.inf, details={"k": [1]})
        )
        store.add_privacy_audit(other.id, AUDIT)
        assert first.job_id == job.id
        assert first.figures == AUDIT
        assert first.created_at == clock.now - timedelta(seconds=5)
        assert second.id > first.id
        assert second.figures.epsilon_upper == math.inf  # a ledger figure no path bounds
        assert store.list_privacy_audits(job.id) == [first, second]
        assert [a.job_id for a in store.list_privacy_audits(other.id)] == [other.id]

    def test_audit_errors_name_the_problem_and_write_nothing(self, store: Store) -> None:
        job = store.create_job(SPEC)
        with pytest.raises(NotFound, match="job 'nope'"):
            store.add_privacy_audit("nope", AUDIT)
        with pytest.raises(NotFound, match="job 'nope'"):
            store.list_privacy_audits("nope")
        bad = {
            "mode": replace(AUDIT, mode="grey-box"),
            "unit": replace(AUDIT, unit="row"),
            "correct ≤ guesses ≤ canaries": replace(AUDIT, correct=AUDIT.guesses + 1),
            "confidence": replace(AUDIT, confidence=1.0),
            "epsilon_lower": replace(AUDIT, epsilon_lower=math.nan),
            "epsilon_upper": replace(AUDIT, epsilon_upper=-1.0),
            "mu_lower": replace(AUDIT, mu_lower=-0.1),
            "details": replace(AUDIT, details={"x": math.inf}),
        }
        for message, figures in bad.items():
            with pytest.raises(InvalidInput, match=message):
                store.add_privacy_audit(job.id, figures)
        assert store.list_privacy_audits(job.id) == []

    def test_ping(self, store: Store) -> None:
        store.ping()


class TestSqliteStore(SqliteBackend, StoreContract):
    pass


class TestPostgresStore(PostgresBackend, StoreContract):
    pass
