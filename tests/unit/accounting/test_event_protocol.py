"""The event protocol: a class defined outside dpfl brings its own math and is accounted,
serialised and refused exactly as the built-in events are, with no edit to dpfl.

The closed forms are written out here: a Laplace mechanism of scale b on a query of L1
sensitivity Δ is (α, ε_α)-RDP with (Mironov 2017, Prop. 6, ratio λ = Δ/b)

    ε_α = log( α/(2α−1)·e^{(α−1)λ} + (α−1)/(2α−1)·e^{−αλ} ) / (α−1).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest

from dpfl.accounting import (
    ORDERS,
    ComposedEvent,
    DpEvent,
    GaussianEvent,
    InvalidEventError,
    PoissonSampledEvent,
    SelfComposedEvent,
    UnsupportedEventError,
    VotingEvent,
    compute_epsilon,
    epsilon_from_rdp,
    event_from_json,
    event_kinds,
    event_to_json,
    guaranteed_event,
    is_data_dependent,
    rdp_curve,
    supports_rdp,
    supports_tight,
    tight_method,
)
from dpfl.accounting.event_protocol import FloatArray, Orders
from dpfl.client.policy import PolicyError, noise_multiplier


@dataclass(frozen=True, slots=True)
class LaplaceEvent(DpEvent):
    """Laplace noise of scale ``b`` on a query of L1 sensitivity ``l1``; RDP only."""

    b: float
    l1: float = 1.0
    kind: ClassVar[str] = "test_laplace"

    def rdp(self, orders: Orders) -> FloatArray:
        a = np.asarray(orders, dtype=np.float64)
        lam = self.l1 / self.b
        inner = a / (2 * a - 1) * np.exp((a - 1) * lam) + (a - 1) / (2 * a - 1) * np.exp(-a * lam)
        out: FloatArray = np.log(inner) / (a - 1)
        return out


@dataclass(frozen=True, slots=True)
class SilentEvent(DpEvent):
    """An event that states no math at all."""

    x: int
    kind: ClassVar[str] = "test_silent"


def _laplace_closed_form(lam: float, alpha: float) -> float:
    a = alpha
    up = a / (2 * a - 1) * math.exp((a - 1) * lam)
    down = (a - 1) / (2 * a - 1) * math.exp(-a * lam)
    return math.log(up + down) / (a - 1)


def test_an_event_defined_here_is_registered_by_its_kind() -> None:
    assert {"test_laplace", "test_silent"} <= set(event_kinds())
    assert event_kinds()[:2] == ("no_privacy", "gaussian")


def test_its_curve_composes_and_is_wrapped_by_the_built_in_events() -> None:
    e = LaplaceEvent(b=2.0)
    expected = np.array([_laplace_closed_form(0.5, a) for a in ORDERS])
    assert rdp_curve(e) == pytest.approx(expected, rel=1e-12)
    assert supports_rdp(e)
    composed = ComposedEvent((SelfComposedEvent(e, 10), GaussianEvent(4.0)))
    assert rdp_curve(composed) == pytest.approx(
        10 * expected + np.asarray(ORDERS) / 32.0, rel=1e-12
    )
    # the general Poisson bound takes any curve: amplified, never above the inner curve
    sampled = rdp_curve(PoissonSampledEvent(0.1, e))
    assert np.all(sampled <= rdp_curve(e) + 1e-12)
    assert sampled[5] < rdp_curve(e)[5] / 5


def test_without_a_tight_path_the_figure_is_the_rdp_bound() -> None:
    e = SelfComposedEvent(LaplaceEvent(b=1.0, l1=0.5), 20)
    assert tight_method(e) is None
    assert not supports_tight(e)
    report = compute_epsilon(e, delta=1e-6)
    assert report.method == "rdp"
    assert report.tight_epsilon is None
    curve = 20 * np.array([_laplace_closed_form(0.5, a) for a in ORDERS])
    assert report.epsilon == pytest.approx(epsilon_from_rdp(curve, delta=1e-6)[0], rel=1e-12)
    # mixed with a Gaussian, the part without a tight path leaves the whole on RDP
    assert tight_method(ComposedEvent((e, GaussianEvent(1.0)))) is None


def test_its_json_form_is_its_dataclass_fields_and_round_trips() -> None:
    e = ComposedEvent((LaplaceEvent(b=2.0, l1=3.0), PoissonSampledEvent(0.5, LaplaceEvent(1.0))))
    doc = event_to_json(e)
    assert doc["events"][0] == {"kind": "test_laplace", "b": 2.0, "l1": 3.0}
    assert event_from_json(json.loads(json.dumps(doc))) == e
    # a field with a default is optional; an unknown one is refused with its path
    assert event_from_json({"kind": "test_laplace", "b": 2.0}) == LaplaceEvent(2.0, 1.0)
    with pytest.raises(
        InvalidEventError, match=r"event\.events\[0\] \(test_laplace\) has unexpected"
    ):
        event_from_json({"kind": "composed", "events": [{"kind": "test_laplace", "b": 1, "z": 2}]})
    with pytest.raises(InvalidEventError, match=r"missing field\(s\): b"):
        event_from_json({"kind": "test_laplace"})


def test_an_event_without_math_is_refused_everywhere_never_charged_nothing() -> None:
    e = SilentEvent(1)
    assert not supports_rdp(e)
    assert tight_method(e) is None
    with pytest.raises(UnsupportedEventError, match="SilentEvent"):
        rdp_curve(ComposedEvent((GaussianEvent(1.0), e)))
    with pytest.raises(UnsupportedEventError, match="SilentEvent"):
        compute_epsilon(e, delta=1e-5)
    with pytest.raises(PolicyError, match="SilentEvent"):
        noise_multiplier(e)
    assert not is_data_dependent(e)
    assert guaranteed_event(e) is e
    assert event_from_json(event_to_json(e)) == e


def test_a_kind_registered_twice_is_refused() -> None:
    with pytest.raises(TypeError, match=r"'gaussian'.*already registered"):

        @dataclass(frozen=True, slots=True)
        class Impostor(DpEvent):
            sigma: float
            kind: ClassVar[str] = "gaussian"

    assert event_from_json({"kind": "gaussian", "sigma": 2.0}) == GaussianEvent(2.0)


def test_a_subclass_without_its_own_kind_is_not_serialised_as_its_parent() -> None:
    @dataclass(frozen=True, slots=True)
    class Louder(GaussianEvent):
        pass

    with pytest.raises(InvalidEventError, match="not a dpfl privacy event: Louder"):
        event_to_json(Louder(1.0))


def test_an_event_with_its_own_relation_is_never_subsampled() -> None:
    inner = ComposedEvent((LaplaceEvent(1.0), VotingEvent(queries=1, sigma=3.0, level="agent")))
    sampled = PoissonSampledEvent(0.5, inner)
    assert not supports_rdp(sampled)
    with pytest.raises(UnsupportedEventError, match="cannot wrap VotingEvent"):
        rdp_curve(sampled)
