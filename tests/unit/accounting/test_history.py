"""A client's figure over its whole history (``dpfl.accounting.history``): the issue-31 rows
against an independent fine-grid pessimistic PLD of dp_accounting, random histories against an
independent composition, the relation rule, and the docs table reproduced."""

from __future__ import annotations

import math
import re

import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.paths import ROOT
from support.scripts import load_script

from dpfl.accounting import (
    GaussianEvent,
    InvalidParameterError,
    PoissonSampledEvent,
    SampledWithoutReplacementEvent,
    SkellamEvent,
    VotingEvent,
    epsilon_from_rdp,
    rdp_curve,
)
from dpfl.accounting.history import (
    REPLACE_ONE_METHOD,
    EventMultiset,
    canonical_event,
    history_figure,
)
from dpfl.accounting.relations import replace_one_curve

BENCH = load_script(ROOT / "benchmarks" / "budget_spent.py", "budget_spent", register=True)
ADD_REMOVE = "agent/add_remove"


def fine_pld(
    parts: list[tuple[float, float, int]], delta: float, step: float, *, pessimistic: bool = True
) -> float:
    """dp_accounting's PLD of Poisson-subsampled Gaussians ``(rate, z, count)`` (rate 1:
    unsampled), composed, on a fixed grid ``step``: the independent reference. Pessimistic, it
    is an upper bound on the exact ε; optimistic, a lower bound."""
    composed = None
    for rate, z, count in parts:
        one = pld_lib.from_gaussian_mechanism(
            standard_deviation=z,
            sensitivity=1.0,
            sampling_prob=rate,
            pessimistic_estimate=pessimistic,
            value_discretization_interval=step,
        )
        block = one.self_compose(count)
        composed = block if composed is None else composed.compose(block)
    assert composed is not None
    return float(composed.get_epsilon_for_delta(delta))


#: (row, the subsampled Gaussian of the same variance as (rate, z), reference grid step)
ACCEPTANCE = [
    (BENCH.ISSUE_ROWS[0], (0.3, 1.533), 2e-5),
    (BENCH.ISSUE_ROWS[1], (1e-4, 0.8), 1.2e-5),
    (BENCH.ISSUE_ROWS[2], (1e-3, 4.0), 2e-7),
]


@pytest.mark.parametrize(("row", "gaussian", "step"), ACCEPTANCE, ids=["demo", "dpsgd", "skellam"])
def test_the_issue_rows_are_within_one_percent_of_a_fine_pld_and_never_below(
    row: object, gaussian: tuple[float, float], step: float
) -> None:
    """The Skellam rows are compared with the Gaussian of the same variance: at these μ its
    dominating Gaussian is that one to 10⁻⁶ (docs/accounting.md, "Skellam in several
    coordinates"), and the exact Skellam release is below both."""
    rdp, tight, method = BENCH.spent(row)
    reference = fine_pld([(*gaussian, row.rounds)], row.delta, step)  # type: ignore[attr-defined]
    assert method == "pld"
    assert reference <= tight <= reference * 1.01
    assert tight < rdp


@st.composite
def histories(draw: st.DrawFn) -> list[tuple[object, tuple[float, float, int] | None]]:
    """Random histories: each item is (event, its Gaussian reference (rate, z, count) or None
    when it has no tight path)."""
    out: list[tuple[object, tuple[float, float, int] | None]] = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["gaussian", "sampled", "skellam", "votes", "swor"]))
        count = draw(st.integers(1, 40))
        z = draw(st.floats(1.0, 5.0))
        rate = draw(st.sampled_from([0.001, 0.01, 0.1]))
        if kind == "gaussian":
            out.append((GaussianEvent(sigma=z), (1.0, z, count)))
        elif kind == "sampled":
            out.append((PoissonSampledEvent(rate, GaussianEvent(sigma=z)), (rate, z, count)))
        elif kind == "skellam":
            # large μ: the dominating Gaussian is the Gaussian of the same variance to 10⁻⁶
            mu = (z * 1000.0) ** 2 / 2.0
            event = PoissonSampledEvent(rate, SkellamEvent(mu, 1000.0, 1000.0, 20))
            out.append((event, (rate, z * (1 - 1e-6), count)))
        elif kind == "votes":
            # agent level, one-hot votes: a Gaussian of multiplier σ per query
            out.append((VotingEvent(queries=count, sigma=z, level="agent"), (1.0, z, count)))
        else:
            event = SampledWithoutReplacementEvent(1000, int(rate * 1000) + 1, GaussianEvent(z))
            out.append((event, None))
    return out


@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(items=histories())
@pytest.mark.slow
def test_a_random_history_is_never_below_an_independent_composition(
    items: list[tuple[object, tuple[float, float, int] | None]],
) -> None:
    """One relation (agent add/remove) throughout; without-replacement entries have no tight
    path, so the figure is then the RDP bound, still never below the composition of the rest."""
    history = EventMultiset()
    counted: list[tuple[float, float, int]] = []
    for event, reference in items:
        n = 1 if isinstance(event, VotingEvent) else (reference[2] if reference else 7)
        history = history.plus(ADD_REMOVE, canonical_event(event), n)  # type: ignore[arg-type]
        if reference is not None:
            counted.append(reference)
    figure = history_figure(history, 1e-5)
    tight = all(reference is not None for _, reference in items)
    if not counted:
        assert figure.method == "rdp"
        return
    step = max(1e-6, 5e-5 * figure.epsilon)
    below = fine_pld(counted, 1e-5, step, pessimistic=False)  # ≤ the exact composition
    assert figure.epsilon >= below
    if tight:
        above = fine_pld(counted, 1e-5, step)  # ≥ the exact composition
        assert figure.method in ("pld", "analytic_gaussian")
        assert figure.epsilon <= above * 1.02 + 1e-9
    else:
        assert figure.method == "rdp"
        assert figure.epsilon == pytest.approx(figure.rdp_epsilon)


def test_mixed_relations_are_composed_only_through_the_replace_one_conversion() -> None:
    sampled = PoissonSampledEvent(0.01, GaussianEvent(sigma=1.0))
    votes = VotingEvent(queries=10, sigma=20.0, level="instance")
    history = (
        EventMultiset()
        .plus(ADD_REMOVE, canonical_event(sampled), 100)
        .plus("replace_one", canonical_event(votes))
    )
    figure = history_figure(history, 1e-5)
    curve = 100 * rdp_curve(sampled) + rdp_curve(votes)
    assert figure.method == REPLACE_ONE_METHOD
    assert figure.epsilon == pytest.approx(
        epsilon_from_rdp(replace_one_curve(curve), delta=1e-5)[0]
    )
    assert figure.rdp_epsilon == pytest.approx(epsilon_from_rdp(curve, delta=1e-5)[0])
    # an unstated relation composes with nothing, not even with itself
    alone = EventMultiset().plus("unstated/x", canonical_event(sampled), 3)
    assert history_figure(alone, 1e-5).method == REPLACE_ONE_METHOD


def test_multisets_merge_and_refuse_bad_counts() -> None:
    text = canonical_event(GaussianEvent(sigma=2.0))
    a = EventMultiset().plus(ADD_REMOVE, text, 2).plus(ADD_REMOVE, text, 3)
    assert a == EventMultiset.of([((ADD_REMOVE, text), 5), ((ADD_REMOVE, "x"), 0)])
    assert a.entries == 5
    with pytest.raises(InvalidParameterError):
        EventMultiset.of([((ADD_REMOVE, text), -1)])
    with pytest.raises(InvalidParameterError, match="delta"):
        history_figure(a, 0.0)
    assert history_figure(EventMultiset(), 1e-5).epsilon == 0.0
    assert math.isfinite(history_figure(a, 1e-5).epsilon)


def test_the_docs_table_is_reproduced() -> None:
    """docs/accounting.md's "Budget spent, RDP vs tight" table, recomputed."""
    text = (ROOT / "docs" / "accounting.md").read_text(encoding="utf-8")
    lines = BENCH.issue_table()
    start = text.index(lines[0])
    documented = text[start:].splitlines()[: len(lines)]
    assert documented == lines
    assert re.search(r"demo_rounds_within_4_tight\D+13\b", text)
