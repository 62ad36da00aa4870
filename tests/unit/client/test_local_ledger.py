"""The agent's local ledger: transactional, durable, idempotent, recomputable, ε via accounting."""

from __future__ import annotations

import json
import math
import sqlite3
import threading
from pathlib import Path

import numpy as np
import pytest

from dpfl.accounting import (
    ORDERS,
    ComposedEvent,
    DataDependentVotingEvent,
    GaussianEvent,
    PoissonSampledEvent,
    SelfComposedEvent,
    SkellamEvent,
    VotingEvent,
    compute_epsilon,
    epsilon_from_rdp,
    event_to_json,
    guaranteed_event,
    rdp_curve,
)
from dpfl.accounting.events import DpEvent
from dpfl.accounting.history import (
    REPLACE_ONE_METHOD,
    HistoryFigure,
    canonical_event,
    history_figure,
)
from dpfl.accounting.relations import replace_one_curve
from dpfl.client.errors import AgentError
from dpfl.client.local_ledger import (
    LEDGER_FILENAME,
    LocalBudgetExceeded,
    LocalLedger,
    LocalLedgerError,
)
from dpfl.server.store.ledger import HistoryGroup, history_of, relation_of

SKELLAM = SkellamEvent(mu=2.2e6, l1_sensitivity=26121.9, l2_sensitivity=1024.6, dimension=650)
VOTES = VotingEvent(queries=100, sigma=30.0, level="agent")
#: A PATE-FL round of one-hot Skellam votes (σ = 3 at 2^10 scale, 20 queries, one coordinate
#: each): agent level moves one coordinate by 1024, record (instance) level by 2048 in L1 and
#: 1024·√2 in L2. The event does not say which level it is.
_MU = (3.0 * 1024) ** 2 / 2
AGENT_VOTES = SelfComposedEvent(SkellamEvent(_MU, 1024.0, 1024.0, 1), 20)
RECORD_VOTES = SelfComposedEvent(SkellamEvent(_MU, 2048.0, 1024.0 * math.sqrt(2), 1), 20)
#: A DP-FedSGD round: 20 steps of Poisson-sampled Skellam (record-level add/remove).
SGD_ROUND = SelfComposedEvent(PoissonSampledEvent(0.05, SKELLAM), 20)


def test_records_survive_a_restart_and_compose_tightly(tmp_path: Path) -> None:
    with LocalLedger.open(tmp_path) as ledger:
        assert ledger.epsilon(delta=1e-5) == 0.0
        assert ledger.record(job_id="job-a", round=1, events=[SKELLAM], algorithm="dp-fedavg")
        assert ledger.record(job_id="job-a", round=2, events=[SKELLAM], algorithm="dp-fedavg")
        assert ledger.record(
            job_id="job-b", round=1, events=[VOTES], coordinator="coord-1", algorithm="pate-fl"
        )
    assert (tmp_path / LEDGER_FILENAME).is_file()
    with LocalLedger.open(tmp_path) as again:
        entries = again.entries()
        assert [(e.job_id, e.round, e.attempt) for e in entries] == [
            ("job-a", 1, "0"),
            ("job-a", 2, "0"),
            ("job-b", 1, "0"),
        ]
        assert entries[0].algorithm == "dp-fedavg"
        assert entries[2].coordinator == "coord-1"
        assert entries[2].events == (VOTES,)
        job_a = again.epsilon(delta=1e-5, job_id="job-a")
        total = again.epsilon(delta=1e-5)
        # the tight composition of the recorded events (agent-level add/remove throughout):
        # below the RDP sum, and equal to the accountant's own composition
        rdp_a = epsilon_from_rdp(2 * rdp_curve(SKELLAM), delta=1e-5)[0]
        rdp_total = epsilon_from_rdp(2 * rdp_curve(SKELLAM) + rdp_curve(VOTES), delta=1e-5)[0]
        expected_a = compute_epsilon(SelfComposedEvent(SKELLAM, 2), delta=1e-5)
        assert expected_a.method == "analytic_gaussian"
        assert job_a == pytest.approx(expected_a.epsilon, rel=1e-12)
        assert job_a < rdp_a
        composed = compute_epsilon(
            ComposedEvent((SelfComposedEvent(SKELLAM, 2), SelfComposedEvent(VOTES, 1))),
            delta=1e-5,
        )
        assert total == pytest.approx(composed.epsilon, rel=1e-9)
        assert total < rdp_total
        spent = again.spent(delta=1e-5)
        assert spent.total == total
        assert spent.by_job == {"job-a": job_a, "job-b": again.epsilon(delta=1e-5, job_id="job-b")}
        assert again.jobs() == ["job-a", "job-b"]
        again.verify()


def test_idempotent_per_attempt_and_conflicts_refused(tmp_path: Path) -> None:
    with LocalLedger.open(tmp_path) as ledger:
        assert ledger.record(job_id="j", round=3, attempt=0, events=[SKELLAM])
        assert not ledger.record(job_id="j", round=3, attempt=0, events=[SKELLAM])
        assert ledger.record(job_id="j", round=3, attempt="session-ab12", events=[SKELLAM])
        with pytest.raises(LocalLedgerError, match="different events"):
            ledger.record(job_id="j", round=3, attempt=0, events=[VOTES])
        assert len(ledger.entries(job_id="j")) == 2  # a redone round is charged again


def test_a_recorded_attempt_lets_out_only_the_same_bytes_again(tmp_path: Path) -> None:
    sent, other = "ab" * 32, "cd" * 32
    with LocalLedger.open(tmp_path) as ledger:
        key = {"job_id": "j", "round": 1, "attempt": "a1", "events": [SKELLAM]}
        assert ledger.record(**key, session_id="5e" * 32, sent_sha256=sent)
        assert not ledger.record(**key, session_id="5e" * 32, sent_sha256=sent)  # a resend
        with pytest.raises(LocalLedgerError, match="another contribution"):
            ledger.record(**key, session_id="5e" * 32, sent_sha256=other)
        with pytest.raises(LocalLedgerError, match="another contribution"):
            ledger.record(**key)  # no digest is not the same bytes
        assert ledger.record(**{**key, "attempt": "a2"}, session_id="5e" * 32, sent_sha256=other)
        with pytest.raises(LocalLedgerError, match="sent_sha256 must be a string"):
            ledger.record(**{**key, "attempt": "a3"}, sent_sha256=b"x")  # type: ignore[arg-type]
        entries = ledger.entries(job_id="j")
        assert [(e.attempt, e.session_id, e.sent_sha256) for e in entries] == [
            ("a1", "5e" * 32, sent),
            ("a2", "5e" * 32, other),
        ]


def test_a_version_1_ledger_is_upgraded_in_place_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / LEDGER_FILENAME
    conn = sqlite3.connect(path)
    conn.executescript(
        """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE charges (
            id INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, round INTEGER NOT NULL,
            attempt TEXT NOT NULL, algorithm TEXT NOT NULL, coordinator TEXT NOT NULL,
            events_json TEXT NOT NULL, curve BLOB NOT NULL, recorded_at REAL NOT NULL,
            UNIQUE (job_id, round, attempt)
        );
        """
    )
    conn.executemany(
        "INSERT INTO meta (key, value) VALUES (?, ?)",
        [("schema_version", "1"), ("orders", json.dumps(list(ORDERS)))],
    )
    events = json.dumps([event_to_json(SKELLAM)], sort_keys=True, separators=(",", ":"))
    conn.execute(
        "INSERT INTO charges (job_id, round, attempt, algorithm, coordinator, events_json, "
        "curve, recorded_at) VALUES ('j', 1, 'old', 'dp-fedavg', 'c', ?, ?, 0.0)",
        (events, rdp_curve(SKELLAM).astype("<f8").tobytes()),
    )
    conn.commit()
    conn.close()
    with LocalLedger(path) as upgraded:
        (old,) = upgraded.entries()
        assert (old.attempt, old.session_id, old.sent_sha256, old.unit) == ("old", "", "", "")
        upgraded.verify()
        assert upgraded.record(job_id="j", round=2, events=[SKELLAM], sent_sha256="ab" * 32)
    with LocalLedger(path) as again:  # the upgrade is durable: opened as the current version
        assert [e.sent_sha256 for e in again.entries()] == ["", "ab" * 32]


def _coordinator_figure(
    charges: list[tuple[str, str, DpEvent, str, int]], delta: float = 1e-5
) -> HistoryFigure:
    """The figure the coordinator's store computes for one client's ``(job, algorithm, event,
    unit, count)`` charges: its own relation classes and history groups."""
    groups = []
    for job, algorithm, event, unit, count in charges:
        text = canonical_event(guaranteed_event(event))
        groups.append(HistoryGroup("a", job, relation_of(text, algorithm, unit), text, count))
    return history_figure(history_of(groups), delta)


def _mixed_epsilon(*events: DpEvent) -> float:
    """ε at 1e-5 of ``events`` composed through the replace-one conversion."""
    curve = sum((rdp_curve(e) for e in events), np.zeros(len(ORDERS)))
    return epsilon_from_rdp(replace_one_curve(curve), delta=1e-5)[0]


def test_agent_level_votes_beside_dp_fedavg_compose_tightly_like_the_coordinator(
    tmp_path: Path,
) -> None:
    """Skellam votes state their relation only through the task's unit: recorded with it, an
    agent's PATE-FL and DP-FedAvg jobs share agent-level add/remove and compose on the PLD, to
    the coordinator's figure for the same charges; recorded without it, the votes compose with
    nothing and the total is the replace-one conversion."""
    figures = {}
    for unit in ("", "agent"):
        with LocalLedger(tmp_path / f"unit-{unit or 'none'}.sqlite") as ledger:
            for round_ in (1, 2):
                ledger.record(
                    job_id="avg", round=round_, events=[SKELLAM], algorithm="dp-fedavg", unit=unit
                )
            ledger.record(
                job_id="pate", round=1, events=[AGENT_VOTES], algorithm="pate-fl", unit=unit
            )
            assert [e.unit for e in ledger.entries()] == [unit] * 3
            figures[unit] = ledger.epsilon(delta=1e-5)
            assert ledger.epsilon(delta=1e-5, job_id="pate") == pytest.approx(
                compute_epsilon(AGENT_VOTES, delta=1e-5).epsilon, rel=1e-12
            )
    coordinator = _coordinator_figure(
        [("avg", "dp-fedavg", SKELLAM, "agent", 2), ("pate", "pate-fl", AGENT_VOTES, "agent", 1)]
    )
    assert coordinator.method == "pld"
    assert figures["agent"] == pytest.approx(coordinator.epsilon, rel=1e-12)
    unstated = _mixed_epsilon(SKELLAM, SKELLAM, AGENT_VOTES)
    assert figures[""] == pytest.approx(unstated, rel=1e-12)
    assert figures["agent"] < 0.5 * figures[""]


def test_record_level_votes_compose_as_their_relation_says(tmp_path: Path) -> None:
    """Record-level votes are replace-one: with DP-FedSGD's record add/remove they mix (the
    conversion, as the coordinator computes it), with DP-Helmet's replace-one they compose on the
    PLD, which they could not without the unit."""
    helmet = GaussianEvent(20.0, 1.0)
    cases = [
        ("sgd", "dp-fedsgd", SGD_ROUND, REPLACE_ONE_METHOD),
        ("helmet", "dp-helmet", helmet, "pld"),
    ]
    for job, algorithm, event, method in cases:
        figures = {}
        for unit in ("", "record"):
            with LocalLedger(tmp_path / f"{job}-{unit or 'none'}.sqlite") as ledger:
                ledger.record(job_id=job, round=1, events=[event], algorithm=algorithm, unit=unit)
                ledger.record(
                    job_id="pate", round=1, events=[RECORD_VOTES], algorithm="pate-fl", unit=unit
                )
                figures[unit] = ledger.epsilon(delta=1e-5)
        coordinator = _coordinator_figure(
            [(job, algorithm, event, "record", 1), ("pate", "pate-fl", RECORD_VOTES, "record", 1)]
        )
        assert coordinator.method == method, job
        assert figures["record"] == pytest.approx(coordinator.epsilon, rel=1e-12)
        assert figures[""] == pytest.approx(_mixed_epsilon(event, RECORD_VOTES), rel=1e-12)
        if method == "pld":
            assert figures["record"] < 0.5 * figures[""]


def test_a_version_2_ledger_gains_the_unit_and_its_old_votes_stay_unstated(
    tmp_path: Path,
) -> None:
    path = tmp_path / LEDGER_FILENAME
    conn = sqlite3.connect(path)
    conn.executescript(
        """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE charges (
            id INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, round INTEGER NOT NULL,
            attempt TEXT NOT NULL, algorithm TEXT NOT NULL, coordinator TEXT NOT NULL,
            events_json TEXT NOT NULL, curve BLOB NOT NULL, recorded_at REAL NOT NULL,
            session_id TEXT NOT NULL DEFAULT '', sent_sha256 TEXT NOT NULL DEFAULT '',
            UNIQUE (job_id, round, attempt)
        );
        CREATE INDEX charges_job ON charges (job_id);
        """
    )
    conn.executemany(
        "INSERT INTO meta (key, value) VALUES (?, ?)",
        [("schema_version", "2"), ("orders", json.dumps(list(ORDERS)))],
    )
    for job, algorithm, event in (("avg", "dp-fedavg", SKELLAM), ("pate", "pate-fl", AGENT_VOTES)):
        conn.execute(
            "INSERT INTO charges (job_id, round, attempt, algorithm, coordinator, events_json, "
            "curve, recorded_at, session_id, sent_sha256) VALUES (?, 1, 'a', ?, 'c', ?, ?, 0, "
            "'5e', 'ab')",
            (
                job,
                algorithm,
                json.dumps([event_to_json(event)], sort_keys=True, separators=(",", ":")),
                rdp_curve(event).astype("<f8").tobytes(),
            ),
        )
    conn.commit()
    conn.close()
    with LocalLedger(path) as upgraded:
        assert [(e.job_id, e.session_id, e.unit) for e in upgraded.entries()] == [
            ("avg", "5e", ""),
            ("pate", "5e", ""),
        ]
        upgraded.verify()
        old = upgraded.epsilon(delta=1e-5)
        assert old == pytest.approx(_mixed_epsilon(SKELLAM, AGENT_VOTES), rel=1e-12)
        # new rows state their unit; the old votes still compose with nothing (never fewer ε)
        upgraded.record(
            job_id="avg", round=2, events=[SKELLAM], algorithm="dp-fedavg", unit="agent"
        )
        assert upgraded.epsilon(delta=1e-5) == pytest.approx(
            _mixed_epsilon(SKELLAM, SKELLAM, AGENT_VOTES), rel=1e-12
        )
    with LocalLedger(path) as again:
        assert [e.unit for e in again.entries()] == ["", "", "agent"]
        version = again._conn.execute("SELECT value FROM meta WHERE key = 'schema_version'")
        assert version.fetchone()[0] == "3"


def test_a_unit_other_than_agent_or_record_is_refused(tmp_path: Path) -> None:
    with LocalLedger.open(tmp_path) as ledger:
        for bad in ("client", "Agent", " record", None, 1):
            with pytest.raises(LocalLedgerError, match="unit must be 'agent', 'record' or ''"):
                ledger.record(job_id="j", round=1, events=[AGENT_VOTES], unit=bad)  # type: ignore[arg-type]
            with pytest.raises(LocalLedgerError, match="unit must be"):
                ledger.epsilon_with([AGENT_VOTES], job_id="j", delta=1e-5, unit=bad)  # type: ignore[arg-type]
        assert ledger.entries() == []
        assert ledger.record(job_id="j", round=1, events=[AGENT_VOTES], unit="agent")
        assert not ledger.record(job_id="j", round=1, events=[AGENT_VOTES], unit="agent")
        with pytest.raises(LocalLedgerError, match="different events or unit"):
            ledger.record(job_id="j", round=1, events=[AGENT_VOTES], unit="record")
        assert [e.unit for e in ledger.entries()] == ["agent"]


def test_jobs_of_unknown_relations_compose_only_through_the_replace_one_conversion(
    tmp_path: Path,
) -> None:
    """A release whose relation neither the event nor its algorithm states is never composed
    as it is with others: the total is the RDP total converted to replacing one record."""
    with LocalLedger.open(tmp_path) as ledger:
        ledger.record(job_id="a", round=1, events=[SKELLAM], algorithm="dp-fedavg")
        ledger.record(job_id="b", round=1, events=[SKELLAM], algorithm="dp-helmet")
        mixed = replace_one_curve(2 * rdp_curve(SKELLAM))
        assert ledger.epsilon(delta=1e-5) == pytest.approx(
            epsilon_from_rdp(mixed, delta=1e-5)[0], rel=1e-12
        )
        assert ledger.epsilon(delta=1e-5, job_id="a") < ledger.epsilon(delta=1e-5)


def test_with_events_and_budgets_in_the_transaction(tmp_path: Path) -> None:
    with LocalLedger.open(tmp_path) as ledger:
        ledger.record(job_id="j", round=1, events=[VOTES])
        job_eps, total_eps = ledger.epsilon_with([VOTES], job_id="j", delta=1e-5)
        assert job_eps == total_eps
        assert job_eps == pytest.approx(
            compute_epsilon(SelfComposedEvent(VOTES, 2), delta=1e-5).epsilon, rel=1e-12
        )
        assert job_eps < epsilon_from_rdp(2 * rdp_curve(VOTES), delta=1e-5)[0]
        other_job, other_total = ledger.epsilon_with([VOTES], job_id="k", delta=1e-5)
        assert other_job < other_total == pytest.approx(job_eps)
        with pytest.raises(LocalBudgetExceeded, match="all jobs"):
            ledger.record(
                job_id="k",
                round=1,
                events=[VOTES],
                max_epsilon_job=100.0,
                max_epsilon_total=other_job * 1.01,
                delta=1e-5,
            )
        with pytest.raises(LocalBudgetExceeded, match="job 'j'"):
            ledger.record(
                job_id="j", round=2, events=[VOTES], max_epsilon_job=job_eps * 0.99, delta=1e-5
            )
        assert len(ledger.entries()) == 1  # nothing recorded by the refusals
        assert ledger.record(
            job_id="j", round=2, events=[VOTES], max_epsilon_job=job_eps * 1.01, delta=1e-5
        )
        with pytest.raises(LocalLedgerError, match="delta"):
            ledger.record(job_id="j", round=9, events=[VOTES], max_epsilon_job=1.0)


def test_concurrent_charges_cannot_overspend(tmp_path: Path) -> None:
    # two threads (two jobs at once), each alone within the total budget, together over it
    path = tmp_path / LEDGER_FILENAME
    with LocalLedger(path) as probe:
        one = probe.epsilon_with([VOTES], job_id="x", delta=1e-5)[1]
    results: list[str] = []

    def charge(job: str) -> None:
        with LocalLedger(path) as ledger:  # separate connections, as separate processes would
            try:
                ledger.record(
                    job_id=job, round=1, events=[VOTES], max_epsilon_total=one * 1.2, delta=1e-5
                )
                results.append("ok")
            except LocalBudgetExceeded:
                results.append("refused")

    threads = [threading.Thread(target=charge, args=(f"job-{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["ok", "refused", "refused", "refused"]


def test_bad_input_and_data_dependent_events(tmp_path: Path) -> None:
    with LocalLedger.open(tmp_path) as ledger:
        with pytest.raises(LocalLedgerError, match="non-empty"):
            ledger.record(job_id="j", round=1, events=[])
        with pytest.raises(LocalLedgerError, match="job_id"):
            ledger.record(job_id="", round=1, events=[VOTES])
        with pytest.raises(LocalLedgerError, match="round"):
            ledger.record(job_id="j", round=-1, events=[VOTES])
        with pytest.raises(LocalLedgerError, match="attempt"):
            ledger.record(job_id="j", round=1, attempt=-2, events=[VOTES])
        with pytest.raises(LocalLedgerError, match="not a privacy event"):
            ledger.record(job_id="j", round=1, events=["gaussian"])  # type: ignore[list-item]

        class Odd(DpEvent):
            pass

        with pytest.raises(LocalLedgerError, match="cannot be accounted"):
            ledger.record(job_id="j", round=1, events=[Odd()])
        with pytest.raises(LocalLedgerError, match="delta"):
            ledger.epsilon(delta=0.0)
        assert isinstance(LocalLedgerError("x"), AgentError)
        # a data-dependent event is stored as its guaranteed counterpart
        dd = DataDependentVotingEvent(
            margins=(0.9, 0.8), num_agents=10, num_classes=10, sigma=3.0, s=1.0, level="agent"
        )
        ledger.record(job_id="j", round=1, events=[dd])
        assert ledger.entries()[0].events == (VotingEvent(queries=2, sigma=3.0, level="agent"),)


def test_verify_detects_a_tampered_curve_and_foreign_files(tmp_path: Path) -> None:
    path = tmp_path / LEDGER_FILENAME
    with LocalLedger(path) as ledger:
        ledger.record(job_id="j", round=1, events=[GaussianEvent(2.0, 1.0)])
    conn = sqlite3.connect(path)
    with conn:
        conn.execute(
            "UPDATE charges SET curve = ?", (np.zeros(len(ORDERS)).astype("<f8").tobytes(),)
        )
    conn.close()
    with LocalLedger(path) as ledger, pytest.raises(LocalLedgerError, match="disagrees"):
        ledger.verify()
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    conn.close()
    with pytest.raises(LocalLedgerError, match="schema_version"):
        LocalLedger(path)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(LocalLedgerError, match="cannot open"):
        LocalLedger(junk)


def test_commits_go_to_a_synced_write_ahead_log(tmp_path: Path) -> None:
    """One synced append per record (WAL, synchronous=FULL), visible to a fresh connection."""
    import sqlite3

    with LocalLedger.open(tmp_path) as ledger:
        assert ledger._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert ledger._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert ledger.record(job_id="j", round=1, events=[SKELLAM])
        other = sqlite3.connect(tmp_path / "ledger.sqlite")
        try:
            assert other.execute("SELECT COUNT(*) FROM charges").fetchone()[0] == 1
        finally:
            other.close()
