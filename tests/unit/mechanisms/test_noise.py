"""Exact integer noise samplers (docs/mechanisms.md#integer-noise): distributions, the exact
fallback, the specs."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from dpfl.mechanisms.exact_draws import bernoulli_exp, discrete_laplace
from dpfl.mechanisms.noise import (
    NoiseKind,
    NoiseSpec,
    _exact_pmf_ratio,
    _log_pmf_ratio,
    discrete_gaussian,
    poisson,
    skellam,
)
from dpfl.secagg.errors import ParameterError
from dpfl.secagg.randomness import RandomStream, SeededRandomSource

SOURCE = SeededRandomSource(b"noise-tests-seed")


def _stream(label: str) -> RandomStream:
    return SOURCE.stream(label)


def _chi_square(samples: np.ndarray, support: np.ndarray, pmf: np.ndarray) -> float:
    """p-value of samples against a pmf, pooling cells with expected count < 5 into the tails."""
    n = samples.size
    expected = pmf * n
    keep = expected >= 5
    lo, hi = support[keep].min(), support[keep].max()
    observed = [np.sum(samples < lo)] + [np.sum(samples == v) for v in range(lo, hi + 1)]
    observed.append(np.sum(samples > hi))
    exp = [pmf[support < lo].sum() * n] + [pmf[support == v].sum() * n for v in range(lo, hi + 1)]
    exp.append(pmf[support > hi].sum() * n)
    obs_arr, exp_arr = np.array(observed, dtype=float), np.array(exp)
    mask = exp_arr > 0
    exp_arr = exp_arr[mask] * obs_arr[mask].sum() / exp_arr[mask].sum()
    return float(stats.chisquare(obs_arr[mask], exp_arr).pvalue)


@pytest.mark.parametrize("lam", [0.3, 4.5, 30.25, 250.0])
def test_poisson_matches_its_pmf(lam: float) -> None:
    samples = poisson(lam, 40000, _stream(f"poisson-{lam}"))
    support = np.arange(0, int(lam + 12 * math.sqrt(lam) + 20))
    assert _chi_square(samples, support, stats.poisson.pmf(support, lam)) > 1e-6


@pytest.mark.parametrize("lam", [1e6 + 0.37, 2.0**40 + 0.5])
def test_poisson_large_means(lam: float) -> None:
    samples = poisson(lam, 20000, _stream(f"big-{lam}")).astype(np.float64)
    z_mean = (samples.mean() - lam) / math.sqrt(lam / samples.size)
    assert abs(z_mean) < 5
    assert abs(samples.var() / lam - 1) < 0.05
    standardised = (samples - lam) / math.sqrt(lam)
    assert stats.kstest(standardised, "norm").pvalue > 1e-6  # CLT regime


def test_skellam_matches_its_pmf_and_variance() -> None:
    samples = skellam(3.0, 40000, _stream("skellam"))
    support = np.arange(-40, 41)
    assert _chi_square(samples, support, stats.skellam.pmf(support, 3.0, 3.0)) > 1e-6
    big = skellam(5000.0, 40000, _stream("skellam-big")).astype(np.float64)
    assert abs(big.var() / 10000.0 - 1) < 0.05
    assert abs(big.mean()) < 5 * math.sqrt(10000.0 / big.size)


@pytest.mark.parametrize("sigma", [0.4, 1.5, 7.0])
def test_discrete_gaussian_matches_its_pmf(sigma: float) -> None:
    samples = discrete_gaussian(sigma, 40000, _stream(f"dg-{sigma}"))
    support = np.arange(-int(15 * sigma) - 5, int(15 * sigma) + 6)
    weights = np.exp(-(support.astype(float) ** 2) / (2 * sigma**2))
    assert _chi_square(samples, support, weights / weights.sum()) > 1e-6


def test_discrete_gaussian_large_sigma_moments() -> None:
    samples = discrete_gaussian(1e4, 20000, _stream("dg-big")).astype(np.float64)
    assert abs(samples.std() / 1e4 - 1) < 0.03
    assert abs(samples.mean()) < 5 * 1e4 / math.sqrt(samples.size)


def test_discrete_laplace_matches_its_pmf() -> None:
    t = 3
    samples = discrete_laplace(t, 40000, _stream("dlap"))
    support = np.arange(-80, 81)
    weights = np.exp(-np.abs(support) / t)
    assert _chi_square(samples, support, weights / weights.sum()) > 1e-6


def test_exact_fallback_decides_with_the_right_probability() -> None:
    """An error bound of 50 leaves every entry undecided: all go through the exact path."""
    calls = []

    def exact(i: int) -> tuple[Fraction, Fraction]:
        calls.append(i)
        return Fraction(1, 3), Fraction(1, 2)

    p = math.exp(-0.5) / 3
    outcome = bernoulli_exp(np.full(3000, math.log(p)), 50.0, exact, _stream("exact"))
    assert len(calls) == 3000
    z = (outcome.mean() - p) / math.sqrt(p * (1 - p) / outcome.size)
    assert abs(z) < 5
    certain = bernoulli_exp(np.zeros(200), 50.0, lambda i: (Fraction(1), Fraction(0)), _stream("1"))
    assert certain.all()
    never = bernoulli_exp(np.zeros(200), 50.0, lambda i: (Fraction(0), Fraction(0)), _stream("0"))
    assert not never.any()


@pytest.mark.parametrize(("lam", "m"), [(4.5, 4), (1234.75, 1234), (2.0**33 + 0.25, 2**33)])
def test_float_log_ratio_is_within_its_bound(lam: float, m: int) -> None:
    ks = np.array([-min(m, 60), -3, -1, 0, 1, 5, 60], dtype=np.int64)
    approx, error = _log_pmf_ratio(lam, m, ks)
    for k, a, e in zip(ks, approx, error, strict=True):
        exact = _exact_pmf_ratio(Fraction(lam), m, int(k))
        log_exact = math.log(exact.numerator) - math.log(exact.denominator)
        assert abs(log_exact - a) <= e, (k, log_exact, a, e)


def test_samplers_are_deterministic_per_stream_label() -> None:
    a = skellam(10.0, 100, SeededRandomSource(b"d" * 16).stream("x"))
    assert np.array_equal(a, skellam(10.0, 100, SeededRandomSource(b"d" * 16).stream("x")))
    assert not np.array_equal(a, skellam(10.0, 100, SeededRandomSource(b"d" * 16).stream("y")))


@pytest.mark.parametrize(
    "call",
    [
        lambda s: poisson(-1.0, 3, s),
        lambda s: poisson(float("nan"), 3, s),
        lambda s: poisson(2.0**51, 3, s),
        lambda s: discrete_gaussian(0.0, 3, s),
        lambda s: poisson(1.0, -1, s),
        lambda s: discrete_laplace(0, 3, s),
    ],
)
def test_invalid_sampler_arguments(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ParameterError):
        call(_stream("bad"))


def test_noise_spec_shares_and_json() -> None:
    spec = NoiseSpec.skellam_share(total_mu=1000.0, honest_fraction=0.5, participants=20)
    assert spec == NoiseSpec(NoiseKind.SKELLAM, 100.0)
    assert spec.variance == 200.0
    assert math.isclose(spec.summed_std(20), math.sqrt(4000.0))
    dg = NoiseSpec.discrete_gaussian_share(total_sigma=10.0, honest_fraction=0.25, participants=16)
    assert math.isclose(dg.parameter, 5.0)
    for s in (spec, dg, NoiseSpec.none()):
        assert NoiseSpec.from_dict(s.to_dict()) == s
    assert NoiseSpec.none().sample(4, _stream("none")).tolist() == [0, 0, 0, 0]
    assert spec.sample(1000, _stream("spec")).std() > 5


@pytest.mark.parametrize(
    "build",
    [
        lambda: NoiseSpec(NoiseKind.SKELLAM, -1.0),
        lambda: NoiseSpec(NoiseKind.DISCRETE_GAUSSIAN, 0.0),
        lambda: NoiseSpec(NoiseKind.NONE, 1.0),
        lambda: NoiseSpec(NoiseKind.SKELLAM, float("inf")),
        lambda: NoiseSpec("skellam", 1.0),  # type: ignore[arg-type]
        lambda: NoiseSpec.from_dict({"kind": "laplace", "parameter": 1.0}),
        lambda: NoiseSpec.from_dict({"kind": "skellam"}),
        lambda: NoiseSpec.skellam_share(total_mu=1.0, honest_fraction=0.0, participants=3),
        lambda: NoiseSpec.skellam_share(total_mu=1.0, honest_fraction=0.5, participants=0),
    ],
)
def test_invalid_noise_specs(build) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ParameterError):
        build()


def test_golden_samples() -> None:
    """Fixed seed, fixed samples: the samplers' consumption of the stream is part of the format."""
    from support.vectors import golden

    source = SeededRandomSource(b"golden-noise-seed")
    produced = {
        "poisson_7.5": poisson(7.5, 12, source.stream("p")).tolist(),
        "poisson_1e6": poisson(1e6 + 0.5, 6, source.stream("pb")).tolist(),
        "skellam_40": skellam(40.0, 12, source.stream("s")).tolist(),
        "discrete_gaussian_3.3": discrete_gaussian(3.3, 12, source.stream("g")).tolist(),
        "discrete_laplace_5": discrete_laplace(5, 12, source.stream("l")).tolist(),
    }
    assert produced == golden("secagg_noise_samples.json", produced)
