"""The relation-agnostic total (accounting/relations.py): the weak triangle inequality checked
on exact Rényi divergences of random discrete distributions and of Gaussians, the grid reading,
and the domination that makes converting a mixed total safe."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpfl.accounting import ORDERS, GaussianEvent, PoissonSampledEvent, VotingEvent, rdp_curve
from dpfl.accounting.relations import EXPONENTS, replace_one_curve, upper_envelope_index
from dpfl.server.store.ledger import epsilon_of

GRID = np.asarray(ORDERS)


def renyi(p: np.ndarray, q: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """Exact D_α(P‖Q) of discrete distributions with full support, at every α."""
    log_p, log_q = np.log(p), np.log(q)
    terms = alpha[:, None] * log_p[None, :] + (1 - alpha[:, None]) * log_q[None, :]
    top = terms.max(axis=1, keepdims=True)
    log_sum = top[:, 0] + np.log(np.exp(terms - top).sum(axis=1))
    return log_sum / (alpha - 1)


def test_the_conversion_bounds_the_exact_divergence_of_random_triples() -> None:
    """P, R differ by a 'replacement', Q is the 'removal' between them: the add/remove curve
    (worst of the four directions) converted must bound D_α(P‖R) and D_α(R‖P) at every order."""
    rng = np.random.default_rng(11)
    tightest = math.inf
    for _ in range(200):
        size = int(rng.integers(2, 6))
        q = rng.dirichlet(np.ones(size))
        # neighbours of Q: multiplicative perturbations of bounded size (a finite divergence)
        p = q * np.exp(rng.uniform(-1.5, 1.5, size))
        r = q * np.exp(rng.uniform(-1.5, 1.5, size))
        p, r = p / p.sum(), r / r.sum()
        add_remove = np.maximum.reduce(
            [renyi(p, q, GRID), renyi(q, p, GRID), renyi(r, q, GRID), renyi(q, r, GRID)]
        )
        converted = replace_one_curve(add_remove)
        exact = np.maximum(renyi(p, r, GRID), renyi(r, p, GRID))
        assert np.all(exact <= converted * (1 + 1e-9) + 1e-12)
        finite = np.isfinite(converted) & (exact > 1e-9)
        tightest = min(tightest, float(np.min(converted[finite] / exact[finite])))
    assert tightest < 3.0  # the bound is not vacuous


@pytest.mark.parametrize("sigma", [0.7, 1.5, 6.0])
def test_gaussian_add_remove_converts_to_at_least_the_doubled_sensitivity(sigma: float) -> None:
    """The exact replace-one curve of a Gaussian of sensitivity 1 is that of sensitivity 2:
    4α/(2σ²). The conversion must never be below it, and is within 45 % of it at the orders
    that matter for ε."""
    curve = rdp_curve(GaussianEvent(sigma=sigma))
    converted = replace_one_curve(curve)
    exact = rdp_curve(GaussianEvent(sigma=sigma, sensitivity=2.0))
    assert np.all(converted >= exact * (1 - 1e-12))
    middle = (GRID >= 2.0) & (GRID <= 30.0)
    assert np.all(converted[middle] <= 1.45 * exact[middle])
    assert epsilon_of(converted, 1e-5)[0] > epsilon_of(curve, 1e-5)[0]


def test_orders_off_the_grid_are_read_above_and_infinity_past_it() -> None:
    assert upper_envelope_index([1.1, 1.15, 10.9, 10.95, 64.0, 65.0, 1024.0, 1025.0]).tolist() == [
        0,
        1,
        98,
        99,
        len(ORDERS) - 5,
        len(ORDERS) - 4,
        len(ORDERS) - 1,
        len(ORDERS),
    ]
    curve = rdp_curve(GaussianEvent(sigma=2.0))
    converted = replace_one_curve(curve)
    # p·α > 1024 for every exponent at α = 1024: nothing on the grid bounds it
    assert math.isinf(converted[-1])
    assert np.isfinite(converted[GRID <= 64.0]).all()
    assert np.array_equal(replace_one_curve(np.zeros(len(ORDERS))), np.zeros(len(ORDERS)))


def test_converting_a_mixed_total_dominates_converting_its_add_remove_part_only() -> None:
    """replace_one(R + A) ≥ R + replace_one(A) pointwise: the relation-agnostic figure is at
    least the figure one would get knowing which entries are replace-one (R)."""
    replace_one = rdp_curve(VotingEvent(queries=50, sigma=40.0, level="instance"))
    add_remove = 3 * rdp_curve(PoissonSampledEvent(0.3, GaussianEvent(sigma=1.1)))
    mixed = replace_one_curve(replace_one + add_remove)
    known = replace_one + replace_one_curve(add_remove)
    finite = np.isfinite(known)
    assert np.all(mixed[finite] >= known[finite] * (1 - 1e-12))
    assert np.all(np.isinf(mixed[~finite]))


def test_a_non_monotone_curve_is_read_through_its_envelope() -> None:
    rng = np.random.default_rng(3)
    curve = np.sort(rng.uniform(0.1, 5.0, len(ORDERS)))
    loose = curve.copy()
    loose[:20] = 100.0  # a loose bound at low orders: the higher orders' values bound them too
    envelope = np.minimum.accumulate(loose[::-1])[::-1]
    assert np.array_equal(envelope[:20], np.full(20, curve[20]))
    assert np.array_equal(replace_one_curve(loose), replace_one_curve(envelope))
    assert np.all(replace_one_curve(loose)[:20] < 100.0)
    assert np.all(replace_one_curve(curve) >= curve)
    with pytest.raises(ValueError, match="NaN or negative"):
        replace_one_curve(-curve)
    with pytest.raises(ValueError, match="values"):
        replace_one_curve(curve[:-1])
    assert 2.0 in EXPONENTS
