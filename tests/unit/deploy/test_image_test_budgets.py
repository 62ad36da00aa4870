"""scripts/image_test.py's ledger check after the coordinator is killed mid-job.

A kill between an attempt's ledger commit and its completion makes the redo a second,
independent release that is charged again, so a silo may then hold more charges than rounds
and a total above the job's target. The check must accept exactly that, and still refuse a
round left uncharged (an under-count) or one attempt charged twice.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from support.api import build_finished_job
from support.kube_overlays import script

from dpfl.server.store import LedgerEntry, ProtectedUnit, open_store


def _entry(number: int, attempt: int) -> LedgerEntry:
    return LedgerEntry(
        id=number * 10 + attempt, agent_id="a", job_id="j", round_id=number, round_number=number,
        attempt=attempt, algorithm="dp-fedavg", unit=ProtectedUnit.AGENT,
        event={}, curve=(0.0,), approximate=False, secure_aggregation=True, honest_fraction=1.0,
        data_dependent_event=None, data_dependent_curve=None, created_at=datetime.now(UTC),
    )  # fmt: skip


def test_one_charge_per_round_leaves_nothing_beyond() -> None:
    image_test = script("image_test")
    assert image_test.charges_beyond_rounds([_entry(n, 1) for n in (1, 2, 3)], 3) == 0


def test_a_committed_attempt_redone_after_the_kill_counts_once_more() -> None:
    image_test = script("image_test")
    entries = [_entry(1, 1), _entry(2, 1), _entry(2, 2), _entry(3, 1)]
    assert image_test.charges_beyond_rounds(entries, 3) == 1


def test_a_round_left_uncharged_is_refused() -> None:
    image_test = script("image_test")
    with pytest.raises(image_test.FederationError, match=r"charged rounds \[1, 3\]"):
        image_test.charges_beyond_rounds([_entry(1, 1), _entry(3, 1)], 3)


def test_one_attempt_charged_twice_is_refused() -> None:
    image_test = script("image_test")
    with pytest.raises(image_test.FederationError, match="charged twice"):
        image_test.charges_beyond_rounds([_entry(1, 1), _entry(1, 1), _entry(2, 1)], 2)


def test_the_figure_from_ledger_rows_is_the_stores_own(tmp_path: Path) -> None:
    """image-test compares REST and ``dpfl budget`` with ε recomputed from the ledger's rows;
    that recomputation must be the store's composition (tight where every event has a path,
    PATE votes and DP-FedAvg rounds mixed here), or the check would fail on a correct store."""
    kube_test = script("kube_test")
    with open_store(f"sqlite:///{tmp_path / 'dpfl.db'}") as store:
        finished = build_finished_job(store)
        for agent_id in finished.client_ids:
            entries = store.ledger_entries(agent_id=agent_id)
            assert entries
            budget = store.client_budget(agent_id, delta=1e-5)
            assert kube_test.ledger_figure(entries, 1e-5) == pytest.approx(
                budget.epsilon, rel=1e-12
            )
