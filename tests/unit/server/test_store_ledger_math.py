"""The ledger arithmetic shared by every store backend (server/store/ledger.py), without storage."""

from __future__ import annotations

import copy
import math
from datetime import UTC, datetime

import numpy as np
import pytest

from dpfl.accounting import (
    ORDERS,
    AccountingError,
    DataDependentVotingEvent,
    GaussianEvent,
    NoPrivacyEvent,
    PoissonSampledEvent,
    VotingEvent,
    compute_epsilon,
    epsilon_from_rdp,
    event_to_json,
    rdp_curve,
)
from dpfl.accounting.history import EventMultiset, canonical_event
from dpfl.server.errors import InvalidInput, LedgerIntegrityError
from dpfl.server.store import Agent, AgentStatus, Budget, Charge, ProtectedUnit, to_json
from dpfl.server.store.ledger import (
    CurveSum,
    decode_curve,
    encode_curve,
    epsilon_of,
    evaluate_budget,
    orders_fingerprint,
    prepare_charges,
    recompute,
    same_curve,
    total,
)

EVENT = PoissonSampledEvent(0.3, GaussianEvent(sigma=1.1))


def agent(budget: Budget | None) -> Agent:
    return Agent("a", "A", {}, AgentStatus.ACTIVE, budget, datetime(2030, 1, 1, tzinfo=UTC))


def test_curves_round_trip_through_bytes_including_infinity() -> None:
    curve = np.linspace(0.0, 3.0, len(ORDERS))
    curve[-3:] = math.inf
    blob = encode_curve(curve)
    assert len(blob) == 8 * len(ORDERS)
    assert np.array_equal(decode_curve(blob), curve)
    with pytest.raises(LedgerIntegrityError, match="bytes"):
        decode_curve(blob[:-8])


def test_same_curve_tolerates_reassociation_only() -> None:
    a = rdp_curve(EVENT)
    assert same_curve(a, a * (1 + 1e-12))
    assert not same_curve(a, a * (1 + 1e-6))
    b = a.copy()
    b[-1] = math.inf
    assert not same_curve(a, b)
    assert same_curve(b, b.copy())
    assert not same_curve(a, a[:-1])


def test_orders_fingerprint_changes_with_the_grid() -> None:
    assert orders_fingerprint() == orders_fingerprint(list(ORDERS))
    assert orders_fingerprint() != orders_fingerprint(ORDERS[:-1])


def test_prepare_computes_each_distinct_curve_and_keeps_the_json() -> None:
    prepared = prepare_charges([Charge(x, EVENT, ProtectedUnit.AGENT) for x in "abc"])
    assert [p.agent_id for p in prepared] == ["a", "b", "c"]
    assert all(p.event == event_to_json(EVENT) for p in prepared)
    assert np.array_equal(prepared[0].curve, rdp_curve(EVENT))
    assert prepared[0].identity() == prepared[0].identity()
    assert prepared[0].identity() != prepared[1].identity()


def test_prepare_checks_each_distinct_event_once_and_keeps_them_apart() -> None:
    """Equal events (even distinct objects) share one check; different events in one round keep
    their own JSON and curves, in the charges' order."""
    other = GaussianEvent(sigma=3.0, sensitivity=1.0)
    twin = copy.deepcopy(EVENT)
    assert twin is not EVENT
    assert twin == EVENT
    charges = [
        Charge("a", EVENT, ProtectedUnit.AGENT),
        Charge("b", other, ProtectedUnit.AGENT),
        Charge("c", twin, ProtectedUnit.AGENT),
    ]
    a, b, c = prepare_charges(charges)
    assert a.event == c.event == event_to_json(EVENT)
    assert b.event == event_to_json(other)
    assert np.array_equal(a.curve, rdp_curve(EVENT))
    assert np.array_equal(c.curve, a.curve)
    assert np.array_equal(b.curve, rdp_curve(other))


def test_prepare_splits_data_dependent_events() -> None:
    dd = DataDependentVotingEvent(
        margins=(0.8, 0.9), num_agents=100, num_classes=10, sigma=20.0, s=1.0, level="agent"
    )
    (p,) = prepare_charges([Charge("a", dd, ProtectedUnit.AGENT)])
    guaranteed = VotingEvent(queries=2, sigma=20.0, level="agent", k=1)
    assert p.event == event_to_json(guaranteed)
    assert p.data_dependent_event == event_to_json(dd)
    assert p.data_dependent_curve is not None
    assert np.array_equal(p.data_dependent_curve, np.minimum(rdp_curve(dd), rdp_curve(guaranteed)))
    curve, dd_curve = recompute(p.event, p.data_dependent_event)
    assert same_curve(curve, p.curve)
    assert dd_curve is not None
    assert same_curve(dd_curve, p.data_dependent_curve)


@pytest.mark.parametrize(
    ("charges", "message"),
    [
        ([Charge("a", EVENT, ProtectedUnit.AGENT)] * 2, "one charge per client"),
        ([Charge("", EVENT, ProtectedUnit.AGENT)], "agent_id"),
        ([Charge("a", EVENT, ProtectedUnit.AGENT, honest_fraction=1.5)], "honest_fraction"),
        ([Charge("a", EVENT, ProtectedUnit.AGENT, honest_fraction=True)], "honest_fraction"),
        ([Charge("a", EVENT, "x")], "unit"),  # type: ignore[arg-type]
        ([Charge("a", EVENT, ProtectedUnit.AGENT, secure_aggregation=None)], "secure_agg"),  # type: ignore[arg-type]
        ([Charge("a", 3.0, ProtectedUnit.AGENT)], "charge of agent 'a'"),  # type: ignore[arg-type]
        # an unhashable non-event after a good charge: refused by name, not a TypeError
        (
            [
                Charge("a", EVENT, ProtectedUnit.AGENT),
                Charge("b", {"kind": "x"}, ProtectedUnit.AGENT),  # type: ignore[arg-type]
            ],
            "charge of agent 'b'",
        ),
        (["not a charge"], "must be a Charge"),
    ],
)
def test_prepare_refuses_bad_charges(charges: list[Charge], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        prepare_charges(charges)


def test_recompute_reports_unparseable_events() -> None:
    with pytest.raises(LedgerIntegrityError, match="cannot be recomputed"):
        recompute({"kind": "gaussian", "sigma": -1.0, "sensitivity": 1.0}, None)


def test_epsilon_of_matches_the_conversion_and_is_zero_for_nothing() -> None:
    curve = rdp_curve(EVENT) * 3
    eps, order = epsilon_of(curve, 1e-5)
    assert (eps, order) == epsilon_from_rdp(curve, delta=1e-5)
    assert epsilon_of(rdp_curve(NoPrivacyEvent()), 1e-5) == (0.0, None)
    assert epsilon_of(np.zeros(len(ORDERS)), 1e-9) == (0.0, None)
    with pytest.raises(InvalidInput, match="delta"):
        epsilon_of(curve, 1.0)


def test_sums_add_and_total_composes_jobs() -> None:
    (p,) = prepare_charges([Charge("a", EVENT, ProtectedUnit.AGENT)])
    s1 = CurveSum.zero("a", "j1").plus(p).plus(p)
    s2 = CurveSum.zero("a", "j2").plus(p)
    curve, dd, entries, dd_entries = total([s1, s2])
    assert np.allclose(curve, 3 * rdp_curve(EVENT))
    assert np.allclose(dd, curve)
    assert (entries, dd_entries) == (3, 0)


def test_budget_evaluation_at_the_budget_delta() -> None:
    one = ("agent/add_remove", canonical_event(EVENT))
    empty = EventMultiset()
    spent = compute_epsilon(EVENT, delta=1e-6).epsilon  # the tight figure of the one event
    assert spent < epsilon_from_rdp(rdp_curve(EVENT), delta=1e-6)[0]
    check = evaluate_budget(agent(Budget(10.0, 1e-6)), empty, one)
    assert check.allowed
    assert check.epsilon_before == 0.0
    assert check.epsilon_after == pytest.approx(spent)
    assert check.method == compute_epsilon(EVENT, delta=1e-6).method
    assert not evaluate_budget(agent(Budget(spent * 0.99, 1e-6)), empty, one).allowed
    free = evaluate_budget(agent(None), empty.plus(*one, 100), one)
    assert free.allowed
    assert free.epsilon_after is None
    # the operator's opt-in: the data-dependent curve of what was spent counts too
    zero = np.zeros(len(ORDERS))
    dd = evaluate_budget(
        agent(Budget(10.0, 1e-6)), empty, one, data_dependent=(zero, rdp_curve(EVENT))
    )
    assert dd.epsilon_after == pytest.approx(spent)


def test_to_json_hides_secrets_and_handles_infinity() -> None:
    from dpfl.server.store import Enrollment, JobEpsilon

    enrolled = Enrollment(agent(Budget(1, 1e-5)), credential="secret-1", api_token="secret-2")
    data = to_json(enrolled)
    assert "credential" not in data
    assert "api_token" not in data
    assert data["agent"]["created_at"] == "2030-01-01T00:00:00+00:00"
    assert data["agent"]["status"] == "active"
    assert to_json(JobEpsilon("j", math.inf, None, 1, None))["epsilon"] == "inf"


def test_epsilon_of_is_memoised_by_value_and_delta() -> None:
    """Clients of one job share curves, so conversions are memoised: the memo must key on the
    curve's values and δ, never on the array object, and must match the direct conversion."""
    a = rdp_curve(EVENT) * 3
    b = rdp_curve(EVENT) * 5
    direct_a = epsilon_from_rdp(a, delta=1e-5)
    assert epsilon_of(a, 1e-5) == (pytest.approx(direct_a[0]), pytest.approx(direct_a[1]))
    assert epsilon_of(a, 1e-3)[0] < epsilon_of(a, 1e-5)[0]  # δ is part of the key
    assert epsilon_of(b, 1e-5)[0] > epsilon_of(a, 1e-5)[0]  # so is every value of the curve
    mutable = a.copy()
    first = epsilon_of(mutable, 1e-5)
    mutable *= 2  # the same array object with new values: a fresh conversion
    assert epsilon_of(mutable, 1e-5)[0] == pytest.approx(epsilon_from_rdp(a * 2, delta=1e-5)[0])
    assert epsilon_of(list(a), 1e-5) == first  # any sequence of the same values
    with pytest.raises(AccountingError, match=f"{len(ORDERS)} orders"):
        epsilon_of(a[:-1], 1e-5)  # a curve off the grid is still refused, memo or not
