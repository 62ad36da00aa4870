"""Migration 0007: ledger entries gain ``own_noise_fraction`` (f₁), NULL for entries written
before it.

Entries committed at 0006 (the column is not there) read back after the upgrade with f₁
unknown, which makes their clients' own-share figure unknown with its reason and leaves the
announced cohort's figure as it was; a round committed after the upgrade keeps its f₁; the
database itself refuses an f₁ outside (0, 1]; the downgrade takes the column off again. Run on
SQLite and PostgreSQL.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic import command
from sqlalchemy.exc import IntegrityError
from support.databases import PostgresBackend, SqliteBackend

from dpfl.accounting import (
    ComposedEvent,
    GaussianEvent,
    PoissonSampledEvent,
    SelfComposedEvent,
    compute_epsilon,
)
from dpfl.learning.jobs import parse_job
from dpfl.server.store import Charge, JobStatus, ProtectedUnit
from dpfl.server.store.engine import alembic_config
from dpfl.server.store.sql import SqlStore

SPEC = parse_job({"name": "j", "algorithm": "dp-fedavg", "privacy": {"target_epsilon": 4}})
EVENT = PoissonSampledEvent(0.5, GaussianEvent(sigma=1.5))


def _migrate(store: SqlStore, revision: str, *, down: bool) -> None:
    config = alembic_config()
    with store.engine.begin() as conn:
        config.attributes["connection"] = conn
        (command.downgrade if down else command.upgrade)(config, revision)


def _columns(store: SqlStore) -> set[str]:
    with store.engine.connect() as conn:
        return {c["name"] for c in sa.inspect(conn).get_columns("ledger_entries")}


class OwnFractionMigration:
    """Abstract: a subclass provides ``store`` (see support.databases)."""

    def test_entries_before_0007_have_an_unknown_fraction(self, store: SqlStore) -> None:
        ids = [store.create_agent(name=f"a{i}", agent_id=f"a{i}").id for i in range(3)]
        job = store.create_job(SPEC, job_id="job-1", members=ids)
        store.set_job_status(job.id, JobStatus.RUNNING)
        rnd = store.start_round(job.id, 1, invited=ids)
        store.commit_round(
            rnd.id, [Charge(a, EVENT, ProtectedUnit.AGENT, own_noise_fraction=0.5) for a in ids]
        )
        before = store.client_budget("a0")
        assert before.own_share_unknown is None
        _migrate(store, "0006", down=True)
        assert "own_noise_fraction" not in _columns(store)
        _migrate(store, "head", down=False)
        assert "own_noise_fraction" in _columns(store)

        # the downgrade dropped f₁: the entries read back as written before 0007
        assert {e.own_noise_fraction for e in store.ledger_entries()} == {None}
        after = store.client_budget("a0")
        assert after.epsilon == before.epsilon  # the announced cohort's figure is unchanged
        assert after.own_share_epsilon is None
        assert after.own_share_unknown is not None
        assert "1 ledger entry was written before" in after.own_share_unknown

        # a round committed now keeps its f₁; the older entry still leaves the figure unknown
        rnd = store.start_round(job.id, 2, invited=ids[:1])
        charge = Charge("a0", EVENT, ProtectedUnit.AGENT, own_noise_fraction=0.25)
        (entry,) = store.commit_round(rnd.id, [charge]).entries
        assert store.ledger_entries(round_id=rnd.id)[0].own_noise_fraction == 0.25
        assert store.client_budget("a0").own_share_epsilon is None
        assert store.verify_ledger().ok

        # the database refuses a fraction outside (0, 1]
        column = sa.table(
            "ledger_entries", sa.column("id", sa.Integer()), sa.column("own_noise_fraction")
        )
        for bad in (0.0, 1.5, -0.1):
            with pytest.raises(IntegrityError), store.engine.begin() as conn:
                conn.execute(
                    sa.update(column).where(column.c.id == entry.id).values(own_noise_fraction=bad)
                )
        with store.engine.begin() as conn:  # and takes one inside it
            conn.execute(
                sa.update(column).where(column.c.id == entry.id).values(own_noise_fraction=1.0)
            )
        assert store.ledger_entries(round_id=rnd.id)[0].own_noise_fraction == 1.0

    def test_a_ledger_with_fractions_composes_the_own_share_after_a_reopen(
        self, store: SqlStore
    ) -> None:
        ids = [store.create_agent(name=f"a{i}", agent_id=f"a{i}").id for i in range(2)]
        job = store.create_job(SPEC, job_id="job-1", members=ids)
        store.set_job_status(job.id, JobStatus.RUNNING)
        for number, f in ((1, 0.5), (2, 0.5), (3, 0.2)):
            rnd = store.start_round(job.id, number, invited=ids)
            charges = [Charge(a, EVENT, ProtectedUnit.AGENT, own_noise_fraction=f) for a in ids]
            store.commit_round(rnd.id, charges)
        url = store.engine.url.render_as_string(hide_password=False)
        store.close()
        with SqlStore(url) as again:
            report = again.client_budget("a1", delta=1e-6)
        scaled = ComposedEvent(
            (
                SelfComposedEvent(EVENT.with_noise_fraction(0.5), 2),
                SelfComposedEvent(EVENT.with_noise_fraction(0.2), 1),
            )
        )
        expected = compute_epsilon(scaled, delta=1e-6).epsilon
        assert report.own_share_epsilon == pytest.approx(expected, rel=1e-6)


class TestSqliteOwnFractionMigration(SqliteBackend, OwnFractionMigration):
    """The migration on SQLite."""


class TestPostgresOwnFractionMigration(PostgresBackend, OwnFractionMigration):
    """The migration on PostgreSQL (skipped, saying so, when it is unreachable)."""
