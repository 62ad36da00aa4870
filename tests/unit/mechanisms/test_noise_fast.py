"""The fast exact Skellam path (docs/mechanisms.md#fast-exact-skellam-sampling): the same samples as
the straightforward sampler, the Skellam law at small and huge μ, sound float decisions."""

from __future__ import annotations

import decimal
import math

import numpy as np
import pytest
from scipy import stats
from support import noise_reference as reference

from dpfl.mechanisms import exact_draws, noise
from dpfl.mechanisms.exact_draws import _SCALE, discrete_laplace
from dpfl.mechanisms.noise import poisson, skellam
from dpfl.secagg.randomness import RandomStream, SeededRandomSource

SOURCE = SeededRandomSource(b"fast-noise-tests")


def _stream(label: str) -> RandomStream:
    return SOURCE.stream(label)


@pytest.mark.parametrize("mu", [0.5, 3.0, 40.0, 1234.5, 1.3e7, 1e10])
def test_fast_skellam_reproduces_the_reference_sampler(mu: float) -> None:
    """Same stream, same samples: the fast path is the reference sampler, computed faster."""
    for seed in range(3):
        fast = skellam(mu, 4000, _stream(f"same-{mu}-{seed}"))
        slow = reference.skellam(mu, 4000, _stream(f"same-{mu}-{seed}"))
        assert np.array_equal(fast, slow)


@pytest.mark.parametrize("scale", [1, 3, 1000, 2**25])
def test_discrete_laplace_reproduces_the_reference(scale: int) -> None:
    fast = discrete_laplace(scale, 20000, _stream(f"dl-{scale}"))
    assert np.array_equal(fast, reference.discrete_laplace(scale, 20000, _stream(f"dl-{scale}")))


def _chi_square_binned(samples: np.ndarray, edges: np.ndarray, cdf: np.ndarray) -> float:
    """p-value of samples against a law given by its cdf at integer bin edges (x ≤ edge)."""
    observed = np.diff(np.concatenate(([0], np.searchsorted(np.sort(samples), edges, "right"))))
    observed = np.append(observed, samples.size - observed.sum())
    probs = np.diff(np.concatenate(([0.0], cdf, [1.0])))
    return float(stats.chisquare(observed, probs * samples.size).pvalue)


@pytest.mark.parametrize("mu", [0.5, 30.0, 1.3e7, 1e10])
def test_fast_skellam_follows_the_skellam_law(mu: float) -> None:
    samples = skellam(mu, 100_000, _stream(f"law-{mu}"))
    sd = math.sqrt(2 * mu)
    if sd < 20:
        edges = np.arange(-int(8 * sd) - 2, int(8 * sd) + 2)
    else:  # about 60 bins of similar mass
        edges = np.unique(np.round(stats.norm.ppf(np.linspace(0.01, 0.99, 60)) * sd))
    cdf = stats.skellam.cdf(edges, mu, mu)
    keep = np.diff(np.concatenate(([0.0], cdf))) * samples.size >= 5
    edges, cdf = edges[keep], cdf[keep]
    assert _chi_square_binned(samples, edges, cdf) > 1e-6
    assert abs(samples.var() / (2 * mu) - 1) < 0.03


def test_fast_poisson_follows_the_poisson_law_at_huge_mean() -> None:
    lam = 1e10 + 0.25
    samples = poisson(lam, 100_000, _stream("poisson-huge"))
    edges = np.unique(np.round(lam + stats.norm.ppf(np.linspace(0.01, 0.99, 60)) * math.sqrt(lam)))
    assert _chi_square_binned(samples, edges, stats.poisson.cdf(edges, lam)) > 1e-6


@pytest.mark.parametrize("mu", [0.5, 1e10])
def test_fast_skellam_is_deterministic_per_stream(mu: float) -> None:
    a = skellam(mu, 5000, SeededRandomSource(b"d" * 16).stream("x"))
    assert np.array_equal(a, skellam(mu, 5000, SeededRandomSource(b"d" * 16).stream("x")))
    assert not np.array_equal(a, skellam(mu, 5000, SeededRandomSource(b"d" * 16).stream("y")))


def test_large_means_take_the_batched_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Large λ never evaluates the masked per-entry bounds on a batch (only the envelope's few)."""
    sizes: list[int] = []
    masked = noise._log_pmf_ratio

    def recording(lam: float, m: int, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        sizes.append(k.size)
        return masked(lam, m, k)

    monkeypatch.setattr(noise, "_log_pmf_ratio", recording)
    assert skellam(1.3e7, 5000, _stream("batched")).size == 5000
    assert sizes
    assert max(sizes) <= 16  # the envelope's candidates, never a batch of proposals
    skellam(3.0, 5000, _stream("small"))
    assert max(sizes) > 16  # small means do use it


def _exp_decimal(x: float) -> decimal.Decimal:
    with decimal.localcontext() as ctx:
        ctx.prec = 60
        return decimal.Decimal(x).exp()


def test_one_exp_bernoulli_decisions_are_sound() -> None:
    """Wherever the one-exponential rule decides, it agrees with U < p for every p in the bound.

    Uniforms are placed right around p (where float decisions are hardest), and p is taken at
    both ends of the stated error interval.
    """
    rng = np.random.default_rng(7)
    log_p = -rng.uniform(0.0, 20.0, 400)
    error = 1e-9
    tops = []
    logs = []
    for lp in log_p:
        centre = math.floor(math.exp(lp) * 2.0**52)
        # right at p, and at a few multiples of the error interval's width on either side
        width = math.exp(lp) * error * 2.0**52
        offsets = list(range(-4, 5)) + [round(f * width) for f in (-10, -6, -4, -3, 3, 4, 6, 10)]
        for j in offsets:
            tops.append(float(max(centre + j, 0)))
            logs.append(lp)
    u_top, lp_arr = np.array(tops), np.array(logs)
    accept, undecided = exact_draws._decide_one_exp(lp_arr, np.full(lp_arr.size, error), u_top)
    scale = decimal.Decimal(_SCALE)
    for u, lp, a, und in zip(u_top, lp_arr, accept, undecided, strict=True):
        if und:
            continue
        for true_log in (lp - error, lp + error):
            p = _exp_decimal(true_log)
            if a:
                assert (decimal.Decimal(u) + 1) * scale <= p
            else:
                assert decimal.Decimal(u) * scale >= p
    assert undecided.any()
    assert (accept & ~undecided).any()
    assert (~accept & ~undecided).any()


@pytest.mark.slow
def test_geometric_decisions_are_sound_next_to_integers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Uniforms whose −scale·ln U lies next to an integer: decided ones are the exact floor."""
    scale = 977
    tops = []
    for x in range(0, 40000, 97):
        centre = math.floor(math.exp(-x / scale) * 2.0**52)
        tops.extend(float(max(centre + j, 0)) for j in range(-3, 4))
    tops.extend([0.0, 1.0, 2.0**40 - 1, 2.0**40])
    crafted = np.array(tops)
    monkeypatch.setattr(exact_draws, "_uniform_tops", lambda count, stream: crafted[:count].copy())
    result = exact_draws._geometric_floats(scale, crafted.size, _stream("geom-edges"))
    with decimal.localcontext() as ctx:
        ctx.prec = 60
        for u, x in zip(crafted, result, strict=True):
            lo = decimal.Decimal(u) * decimal.Decimal(_SCALE)
            hi = (decimal.Decimal(u) + 1) * decimal.Decimal(_SCALE)
            floor_hi = math.floor(-scale * hi.ln())  # the smallest value X can take
            floor_lo = math.inf if u == 0 else math.floor(-scale * lo.ln())
            assert floor_hi <= x <= floor_lo
