"""Privacy events: immutable values describing what one release did with the protected data.

An event states its mechanism, parameters, neighbouring relation and sensitivity explicitly, so
that an ε can always be recomputed from it
(docs/architecture.md#rule-2-every-event-can-be-recomputed).
Events are frozen and validated on construction; the invariants (units of sensitivity, which
relation goes with which sampling event, the JSON form) are in
docs/accounting.md#events-and-their-invariants. Each class carries its own math (the protocol of
:mod:`dpfl.accounting.event_protocol`): its RDP curve, its tight-path parts, its JSON fields and
its noise multiplier.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np

from .errors import InvalidEventError, UnsupportedEventError
from .event_protocol import (
    DpEvent,
    EventJson,
    FloatArray,
    Orders,
    ParseNested,
    SkellamShift,
    TightParts,
    flatten_tight,
    overflow_as_inf,
)
from .rdp import cached_curve
from .rdp_mechanisms import (
    data_dependent_voting_rdp,
    skellam_rdp,
    voting_rdp,
    voting_rdp_coefficient,
)
from .rdp_sampled import poisson_sampled_rdp, without_replacement_rdp

__all__ = [
    "ComposedEvent",
    "DataDependentVotingEvent",
    "DpEvent",
    "GaussianEvent",
    "Level",
    "NoPrivacyEvent",
    "PoissonSampledEvent",
    "SampledWithoutReplacementEvent",
    "SelfComposedEvent",
    "SkellamEvent",
    "VotingEvent",
    "distributed_gaussian",
    "distributed_skellam",
    "guaranteed_event",
    "is_data_dependent",
    "per_agent_gaussian_std",
    "per_agent_skellam_mu",
]

Level = Literal["agent", "instance"]
_LEVELS: tuple[str, ...] = ("agent", "instance")


def _real(owner: str, name: str, value: object, *, minimum: float, strict: bool) -> float:
    """``value`` as a finite float ≥ (or > when ``strict``) ``minimum``, else InvalidEventError."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        raise InvalidEventError(f"{owner}.{name} must be a number, got {value!r}")
    out = float(value)
    if not math.isfinite(out):
        raise InvalidEventError(f"{owner}.{name} must be finite, got {value!r}")
    if out < minimum or (strict and out == minimum):
        relation = ">" if strict else "≥"
        raise InvalidEventError(f"{owner}.{name} must be {relation} {minimum:g}, got {value!r}")
    return out


def _integer(owner: str, name: str, value: object, *, minimum: int) -> int:
    """``value`` as an int ≥ ``minimum`` (an integral float is accepted), else InvalidEventError."""
    if isinstance(value, bool | np.bool_):
        raise InvalidEventError(f"{owner}.{name} must be an integer, got {value!r}")
    integral = isinstance(value, numbers.Integral) or (
        isinstance(value, numbers.Real) and math.isfinite(value) and float(value).is_integer()
    )
    if not integral:
        raise InvalidEventError(f"{owner}.{name} must be an integer, got {value!r}")
    out: int = int(value)  # type: ignore[call-overload]
    if out < minimum:
        raise InvalidEventError(f"{owner}.{name} must be ≥ {minimum}, got {value!r}")
    return out


def _event(owner: str, name: str, value: object) -> DpEvent:
    if not isinstance(value, DpEvent):
        raise InvalidEventError(f"{owner}.{name} must be a DpEvent, got {type(value).__name__}")
    return value


def _level(owner: str, value: object) -> Level:
    if value == "agent":
        return "agent"
    if value == "instance":
        return "instance"
    raise InvalidEventError(f"{owner}.level must be one of {_LEVELS}, got {value!r}")


def _fraction(value: object) -> float:
    """A noise-variance fraction in (0, 1], else InvalidEventError."""
    out = _real("noise fraction", "fraction", value, minimum=0.0, strict=True)
    if out > 1.0:
        raise InvalidEventError(f"a noise fraction must be in (0, 1], got {value!r}")
    return out


def _set(obj: object, name: str, value: object) -> None:
    object.__setattr__(obj, name, value)  # normalising a field of a frozen dataclass


@dataclass(frozen=True, slots=True)
class NoPrivacyEvent(DpEvent):
    """An operation that costs no privacy (post-processing, public data): RDP 0 at every order."""

    kind: ClassVar[str] = "no_privacy"

    def rdp(self, orders: Orders) -> FloatArray:
        return np.zeros_like(np.asarray(orders, dtype=np.float64))

    def gaussian_coefficient(self) -> float | None:
        return 0.0

    def add_tight_parts(self, count: int, parts: TightParts) -> None:
        del count, parts

    def with_noise_fraction(self, fraction: float) -> DpEvent:
        _fraction(fraction)
        return self

    def min_noise_multiplier(self) -> float:
        return math.inf


@dataclass(frozen=True, slots=True)
class GaussianEvent(DpEvent):
    """Gaussian noise of std ``sigma`` added to a query of L2 sensitivity ``sensitivity``.

    RDP ``α·sensitivity²/(2·sigma²)`` at every order α (Mironov 2017, Prop. 7). Both fields are in
    the same (absolute) units; ``sigma / sensitivity`` is the noise multiplier.
    """

    sigma: float
    sensitivity: float = 1.0
    kind: ClassVar[str] = "gaussian"

    def __post_init__(self) -> None:
        _set(self, "sigma", _real("GaussianEvent", "sigma", self.sigma, minimum=0.0, strict=True))
        _set(
            self,
            "sensitivity",
            _real("GaussianEvent", "sensitivity", self.sensitivity, minimum=0.0, strict=False),
        )

    @classmethod
    def from_multiplier(cls, noise_multiplier: float) -> GaussianEvent:
        """The Gaussian mechanism with noise multiplier ``z`` on a unit-sensitivity query."""
        return cls(sigma=noise_multiplier, sensitivity=1.0)

    @property
    def noise_multiplier(self) -> float:
        """``sigma / sensitivity`` (infinite for a zero-sensitivity query)."""
        return math.inf if self.sensitivity == 0.0 else self.sigma / self.sensitivity

    def rdp(self, orders: Orders) -> FloatArray:
        return 0.5 * (self.sensitivity / self.sigma) ** 2 * np.asarray(orders, dtype=np.float64)

    def gaussian_coefficient(self) -> float | None:
        return 0.5 * (self.sensitivity / self.sigma) ** 2

    def add_tight_parts(self, count: int, parts: TightParts) -> None:
        parts.add_rho(count, self.gaussian_coefficient)

    def with_noise_fraction(self, fraction: float) -> DpEvent:
        return GaussianEvent(self.sigma * math.sqrt(_fraction(fraction)), self.sensitivity)

    def min_noise_multiplier(self) -> float:
        return self.noise_multiplier


@dataclass(frozen=True, slots=True)
class PoissonSampledEvent(DpEvent):
    """``event`` applied to a Poisson sample: each record enters independently with the rate.

    Neighbouring relation: add/remove one record; ``event``'s sensitivity must be its add/remove
    sensitivity. Amplification by sampling is a population-level guarantee, so this event is
    charged to every record (or agent) of the population, sampled or not.
    """

    sampling_rate: float
    event: DpEvent
    kind: ClassVar[str] = "poisson_sampled"

    def __post_init__(self) -> None:
        rate = _real(
            "PoissonSampledEvent", "sampling_rate", self.sampling_rate, minimum=0.0, strict=True
        )
        if rate > 1.0:
            raise InvalidEventError(
                f"PoissonSampledEvent.sampling_rate must be in (0, 1], got {self.sampling_rate!r}"
            )
        _set(self, "sampling_rate", rate)
        _event("PoissonSampledEvent", "event", self.event)

    def rdp(self, orders: Orders) -> FloatArray:
        return poisson_sampled_rdp(type(self).__name__, self.sampling_rate, self.event, orders)

    def supports_rdp(self) -> bool:
        return self.event.unsampleable_part() is None and self.event.supports_rdp()

    def unsampleable_part(self) -> DpEvent | None:
        return self.event.unsampleable_part()

    def add_tight_parts(self, count: int, parts: TightParts) -> None:
        inner = self.event
        rho = overflow_as_inf(inner.gaussian_coefficient)
        if rho is None:
            shift = inner.skellam_shift()
            if shift is None:
                raise UnsupportedEventError(
                    f"no tight path for PoissonSampledEvent of {type(inner).__name__} "
                    "(only compositions of Gaussians and a bare Skellam release)"
                )
            if shift.max_shift > 0:
                rate = min(1.0, self.sampling_rate)
                parts.skellam_gaussian[(rate, shift)] += count
            return
        if rho > 0.0:
            if self.sampling_rate >= 1.0 or not math.isfinite(rho):
                parts.rho += count * rho
            else:
                parts.sampled[(self.sampling_rate, 1.0 / math.sqrt(2.0 * rho))] += count

    def with_noise_fraction(self, fraction: float) -> DpEvent:
        return PoissonSampledEvent(self.sampling_rate, self.event.with_noise_fraction(fraction))

    def min_noise_multiplier(self) -> float:
        return self.event.min_noise_multiplier()

    def is_data_dependent(self) -> bool:
        return self.event.is_data_dependent()

    def guaranteed(self) -> DpEvent:
        return PoissonSampledEvent(self.sampling_rate, self.event.guaranteed())

    def json_fields(self, nested: Callable[[DpEvent], EventJson]) -> EventJson:
        return {"sampling_rate": self.sampling_rate, "event": nested(self.event)}

    @classmethod
    def from_json_fields(cls, fields: Mapping[str, Any], path: str, nested: ParseNested) -> DpEvent:
        return cls(fields["sampling_rate"], nested(fields["event"], f"{path}.event"))


@dataclass(frozen=True, slots=True)
class SampledWithoutReplacementEvent(DpEvent):
    """``event`` applied to a uniformly random subset of exactly ``sample_size`` records.

    Neighbouring relation: replace one record (the population size is public), after Wang, Balle &
    Kasiviswanathan 2019. ``event``'s sensitivity must be its replace-one sensitivity, e.g.
    ``GaussianEvent(sigma=z·C, sensitivity=2·C)`` for a sum of records clipped to norm ``C``.
    """

    population: int
    sample_size: int
    event: DpEvent
    kind: ClassVar[str] = "sampled_without_replacement"

    def __post_init__(self) -> None:
        owner = "SampledWithoutReplacementEvent"
        population = _integer(owner, "population", self.population, minimum=1)
        sample_size = _integer(owner, "sample_size", self.sample_size, minimum=1)
        if sample_size > population:
            raise InvalidEventError(
                f"{owner}.sample_size ({sample_size}) must not exceed population ({population})"
            )
        _set(self, "population", population)
        _set(self, "sample_size", sample_size)
        _event(owner, "event", self.event)

    @property
    def sampling_ratio(self) -> float:
        """``sample_size / population``."""
        return self.sample_size / self.population

    def rdp(self, orders: Orders) -> FloatArray:
        return without_replacement_rdp(
            type(self).__name__, self.population, self.sample_size, self.event, orders
        )

    def supports_rdp(self) -> bool:
        return self.event.unsampleable_part() is None and self.event.supports_rdp()

    def unsampleable_part(self) -> DpEvent | None:
        return self.event.unsampleable_part()

    def with_noise_fraction(self, fraction: float) -> DpEvent:
        inner = self.event.with_noise_fraction(fraction)
        return SampledWithoutReplacementEvent(self.population, self.sample_size, inner)

    def min_noise_multiplier(self) -> float:
        return self.event.min_noise_multiplier()

    def is_data_dependent(self) -> bool:
        return self.event.is_data_dependent()

    def guaranteed(self) -> DpEvent:
        return SampledWithoutReplacementEvent(
            self.population, self.sample_size, self.event.guaranteed()
        )

    def json_fields(self, nested: Callable[[DpEvent], EventJson]) -> EventJson:
        return {
            "population": self.population,
            "sample_size": self.sample_size,
            "event": nested(self.event),
        }

    @classmethod
    def from_json_fields(cls, fields: Mapping[str, Any], path: str, nested: ParseNested) -> DpEvent:
        event = nested(fields["event"], f"{path}.event")
        return cls(fields["population"], fields["sample_size"], event)


@dataclass(frozen=True, slots=True)
class SelfComposedEvent(DpEvent):
    """``event`` applied ``count`` times (adaptively) to the same data."""

    event: DpEvent
    count: int
    kind: ClassVar[str] = "self_composed"

    def __post_init__(self) -> None:
        _event("SelfComposedEvent", "event", self.event)
        _set(self, "count", _integer("SelfComposedEvent", "count", self.count, minimum=0))

    def rdp(self, orders: Orders) -> FloatArray:
        if self.count == 0:
            return np.zeros_like(np.asarray(orders, dtype=np.float64))
        return self.count * cached_curve(self.event, orders)

    def supports_rdp(self) -> bool:
        return self.event.supports_rdp()

    def gaussian_coefficient(self) -> float | None:
        inner = self.event.gaussian_coefficient()
        return None if inner is None else self.count * inner

    def unsampleable_part(self) -> DpEvent | None:
        return self.event.unsampleable_part()

    def add_tight_parts(self, count: int, parts: TightParts) -> None:
        flatten_tight(self.event, count * self.count, parts)

    def with_noise_fraction(self, fraction: float) -> DpEvent:
        return SelfComposedEvent(self.event.with_noise_fraction(fraction), self.count)

    def min_noise_multiplier(self) -> float:
        return math.inf if self.count == 0 else self.event.min_noise_multiplier()

    def is_data_dependent(self) -> bool:
        return self.event.is_data_dependent()

    def guaranteed(self) -> DpEvent:
        return SelfComposedEvent(self.event.guaranteed(), self.count)

    def json_fields(self, nested: Callable[[DpEvent], EventJson]) -> EventJson:
        return {"event": nested(self.event), "count": self.count}

    @classmethod
    def from_json_fields(cls, fields: Mapping[str, Any], path: str, nested: ParseNested) -> DpEvent:
        return cls(nested(fields["event"], f"{path}.event"), fields["count"])


@dataclass(frozen=True, slots=True)
class ComposedEvent(DpEvent):
    """The adaptive composition of ``events`` on the same data (any iterable becomes a tuple)."""

    events: tuple[DpEvent, ...] = field(default=())
    kind: ClassVar[str] = "composed"

    def __post_init__(self) -> None:
        if isinstance(self.events, DpEvent) or not isinstance(self.events, Iterable):
            raise InvalidEventError("ComposedEvent.events must be a sequence of DpEvent")
        events = tuple(self.events)
        for i, e in enumerate(events):
            _event("ComposedEvent", f"events[{i}]", e)
        _set(self, "events", events)

    def rdp(self, orders: Orders) -> FloatArray:
        total = np.zeros_like(np.asarray(orders, dtype=np.float64))
        for e in self.events:
            total = total + cached_curve(e, orders)
        return total

    def supports_rdp(self) -> bool:
        return all(e.supports_rdp() for e in self.events)

    def gaussian_coefficient(self) -> float | None:
        total = 0.0
        for e in self.events:
            c = e.gaussian_coefficient()
            if c is None:
                return None
            total += c
        return total

    def unsampleable_part(self) -> DpEvent | None:
        for e in self.events:
            found = e.unsampleable_part()
            if found is not None:
                return found
        return None

    def add_tight_parts(self, count: int, parts: TightParts) -> None:
        for e in self.events:
            flatten_tight(e, count, parts)

    def with_noise_fraction(self, fraction: float) -> DpEvent:
        return ComposedEvent(tuple(e.with_noise_fraction(fraction) for e in self.events))

    def min_noise_multiplier(self) -> float:
        return min((e.min_noise_multiplier() for e in self.events), default=math.inf)

    def is_data_dependent(self) -> bool:
        return any(e.is_data_dependent() for e in self.events)

    def guaranteed(self) -> DpEvent:
        return ComposedEvent(tuple(e.guaranteed() for e in self.events))

    def json_fields(self, nested: Callable[[DpEvent], EventJson]) -> EventJson:
        return {"events": [nested(e) for e in self.events]}

    @classmethod
    def from_json_fields(cls, fields: Mapping[str, Any], path: str, nested: ParseNested) -> DpEvent:
        events = fields["events"]
        if not isinstance(events, list):
            raise InvalidEventError(f"{path}.events must be a list, got {type(events).__name__}")
        return cls(tuple(nested(e, f"{path}.events[{i}]") for i, e in enumerate(events)))


@dataclass(frozen=True, slots=True)
class SkellamEvent(DpEvent):
    """A sum released with Skellam noise ``Sk(mu)`` on each of its ``dimension`` coordinates.

    ``Sk(mu)`` is ``Poisson(mu) − Poisson(mu)``: variance ``2·mu``; the sum of agents' ``Sk(mu_i)``
    is ``Sk(Σ mu_i)``. The sensitivities bound the change of the (integer, scaled and rounded)
    query under the neighbouring relation, in the same integer units as the noise: L1
    (``l1_sensitivity``) and L2 (``l2_sensitivity``). RDP after Agarwal, Kairouz & Liu 2021 (see
    :func:`dpfl.accounting.rdp_mechanisms.skellam_rdp`).
    """

    mu: float
    l1_sensitivity: float
    l2_sensitivity: float
    dimension: int
    kind: ClassVar[str] = "skellam"
    symmetric_shift: ClassVar[bool] = True

    def __post_init__(self) -> None:
        owner = "SkellamEvent"
        _set(self, "mu", _real(owner, "mu", self.mu, minimum=0.0, strict=True))
        _set(
            self,
            "l1_sensitivity",
            _real(owner, "l1_sensitivity", self.l1_sensitivity, minimum=0.0, strict=False),
        )
        _set(
            self,
            "l2_sensitivity",
            _real(owner, "l2_sensitivity", self.l2_sensitivity, minimum=0.0, strict=False),
        )
        _set(self, "dimension", _integer(owner, "dimension", self.dimension, minimum=1))

    def rdp(self, orders: Orders) -> FloatArray:
        return skellam_rdp(self, orders)

    def add_tight_parts(self, count: int, parts: TightParts) -> None:
        shift = self.skellam_shift()
        if shift.max_shift == 0:
            return
        if self.dimension == 1:
            # the exact PLD of the worst shift (docs/accounting.md, "Skellam votes")
            parts.skellam[(self.mu, shift.max_shift)] += count
        else:
            # a dominating Gaussian pair: docs/accounting.md#skellam-in-several-coordinates
            parts.skellam_gaussian[(1.0, shift)] += count

    def skellam_shift(self) -> SkellamShift:
        # integer query and noise: a coordinate's shift is at most the integer part of either
        # sensitivity, and ‖v‖₂ ≤ ‖v‖₁ ≤ Δ₁
        max_shift = math.floor(min(self.l1_sensitivity, self.l2_sensitivity))
        l2 = min(self.l1_sensitivity, self.l2_sensitivity)
        return SkellamShift(self.mu, max_shift, l2, self.dimension)

    def with_noise_fraction(self, fraction: float) -> DpEvent:
        # Sk(μ) has variance 2μ, and Skellam parameters add: a fraction f of the variance is
        # Sk(f·μ)
        mu = self.mu * _fraction(fraction)
        return SkellamEvent(mu, self.l1_sensitivity, self.l2_sensitivity, self.dimension)

    def min_noise_multiplier(self) -> float:
        l2 = min(self.l2_sensitivity, self.l1_sensitivity)
        return math.inf if l2 == 0.0 else math.sqrt(2.0 * self.mu) / l2


@dataclass(frozen=True, slots=True)
class VotingEvent(DpEvent):
    """``queries`` noisy vote histograms (PATE-FL when ``k == 1``, Private-kNN-FL with ``k``).

    Each agent's vote per query is a vector of L2 norm ≤ 1 (one-hot, a probability vector, or the
    mean of its ``k`` nearest neighbours' one-hot labels); the released sum carries Gaussian noise
    of std ``sigma`` per coordinate. Level ``agent``: add/remove one agent; level ``instance``:
    replace one record of one agent. RDP in docs/algorithms.md#pate-fl, #private-knn-fl (see
    :func:`dpfl.accounting.rdp_mechanisms.voting_rdp`).
    """

    queries: int
    sigma: float
    level: Level
    k: int = 1
    kind: ClassVar[str] = "voting"
    own_relation: ClassVar[bool] = True

    def __post_init__(self) -> None:
        owner = "VotingEvent"
        _set(self, "queries", _integer(owner, "queries", self.queries, minimum=0))
        _set(self, "sigma", _real(owner, "sigma", self.sigma, minimum=0.0, strict=True))
        _set(self, "level", _level(owner, self.level))
        _set(self, "k", _integer(owner, "k", self.k, minimum=1))

    def rdp(self, orders: Orders) -> FloatArray:
        return voting_rdp(self, orders)

    def add_tight_parts(self, count: int, parts: TightParts) -> None:
        parts.add_rho(count, lambda: voting_rdp_coefficient(self))

    def with_noise_fraction(self, fraction: float) -> DpEvent:
        sigma = self.sigma * math.sqrt(_fraction(fraction))
        return VotingEvent(self.queries, sigma, self.level, self.k)

    def min_noise_multiplier(self) -> float:
        """Per query: σ at agent level, σ·√(k/2) at instance level (its charge ``α/(k·σ²)`` is
        that of a Gaussian with this multiplier)."""
        if self.queries == 0:
            return math.inf
        return self.sigma if self.level == "agent" else self.sigma * math.sqrt(self.k / 2.0)


@dataclass(frozen=True, slots=True)
class DataDependentVotingEvent(DpEvent):
    """Voting queries accounted with the data-dependent bound of docs/algorithms.md#pate-fl.

    **The resulting ε is data-dependent**: it is a function of the private votes (through the
    margins), so releasing it leaks information and it is not a worst-case guarantee. The ledger
    stores it beside the guaranteed figure (:func:`guaranteed_event`) and enforces budgets on the
    guaranteed one unless the operator opts in. ``margins[q]`` is the gap between the top two
    coordinates of the averaged vote ``(1/N)·Σ f_i(x_q)`` of query ``q`` (in [0, 1]);
    ``s`` is the per-agent vote sensitivity (1 for PATE-FL, ``1/k`` for Private-kNN-FL).
    """

    margins: tuple[float, ...]
    num_agents: int
    num_classes: int
    sigma: float
    s: float
    level: Level
    kind: ClassVar[str] = "data_dependent_voting"
    data_dependent: ClassVar[bool] = True
    own_relation: ClassVar[bool] = True

    def __post_init__(self) -> None:
        owner = "DataDependentVotingEvent"
        given: object = self.margins
        if isinstance(given, str | bytes) or not isinstance(given, Iterable):
            raise InvalidEventError(f"{owner}.margins must be a sequence of numbers")
        margins = tuple(
            _real(owner, f"margins[{i}]", m, minimum=0.0, strict=False) for i, m in enumerate(given)
        )
        for i, m in enumerate(margins):
            if m > 1.0:
                raise InvalidEventError(f"{owner}.margins[{i}] must be in [0, 1], got {m!r}")
        _set(self, "margins", margins)
        _set(self, "num_agents", _integer(owner, "num_agents", self.num_agents, minimum=1))
        _set(self, "num_classes", _integer(owner, "num_classes", self.num_classes, minimum=2))
        _set(self, "sigma", _real(owner, "sigma", self.sigma, minimum=0.0, strict=True))
        s = _real(owner, "s", self.s, minimum=0.0, strict=True)
        if s > 1.0:
            raise InvalidEventError(f"{owner}.s must be in (0, 1], got {self.s!r}")
        _set(self, "s", s)
        _set(self, "level", _level(owner, self.level))

    @property
    def k(self) -> int:
        """The neighbour count of the guaranteed bound: the largest integer ``k ≤ 1/s``.

        Rounding down makes the data-independent charge ``α/(k·σ²)`` no smaller than ``α·s/σ²``.
        """
        return max(1, math.floor((1.0 / self.s) * (1.0 + 1e-12)))

    def rdp(self, orders: Orders) -> FloatArray:
        return data_dependent_voting_rdp(self, orders)

    def add_tight_parts(self, count: int, parts: TightParts) -> None:
        # The data-independent bound is a worst-case one, hence also a bound here.
        flatten_tight(self.guaranteed(), count, parts)

    def with_noise_fraction(self, fraction: float) -> DpEvent:
        # the margins were measured at the full noise; the worst-case bound holds at any noise
        return self.guaranteed().with_noise_fraction(fraction)

    def min_noise_multiplier(self) -> float:
        return self.guaranteed().min_noise_multiplier()

    def guaranteed(self) -> DpEvent:
        return VotingEvent(queries=len(self.margins), sigma=self.sigma, level=self.level, k=self.k)

    @classmethod
    def from_json_fields(cls, fields: Mapping[str, Any], path: str, nested: ParseNested) -> DpEvent:
        margins = fields["margins"]
        if not isinstance(margins, list):
            raise InvalidEventError(f"{path}.margins must be a list, got {type(margins).__name__}")
        return cls(**{**fields, "margins": tuple(margins)})


def is_data_dependent(event: DpEvent) -> bool:
    """Whether any part of ``event`` is accounted with a data-dependent bound."""
    return isinstance(event, DpEvent) and event.is_data_dependent()


def guaranteed_event(event: DpEvent) -> DpEvent:
    """``event`` with every data-dependent part replaced by its data-independent counterpart.

    The RDP curve of the result is the worst-case guarantee the ledger enforces budgets on.
    """
    return event.guaranteed() if isinstance(event, DpEvent) else event


def _honest(honest_fraction: float, participants: int) -> tuple[float, int]:
    t = _real("distributed noise", "honest_fraction", honest_fraction, minimum=0.0, strict=True)
    if t > 1.0:
        raise InvalidEventError(f"honest_fraction must be in (0, 1], got {honest_fraction!r}")
    n = _integer("distributed noise", "participants", participants, minimum=1)
    return t, n


def per_agent_gaussian_std(*, sigma_sum: float, honest_fraction: float, participants: int) -> float:
    """The std each of the N agents adds so that t·N honest agents' noise has std ``sigma_sum``.

    The split of docs/algorithms.md#distributed-noise-rule with c = N: ``σ_sum / √(t·N)``.
    """
    s = _real("distributed noise", "sigma_sum", sigma_sum, minimum=0.0, strict=True)
    t, n = _honest(honest_fraction, participants)
    return s / math.sqrt(t * n)


def distributed_gaussian(
    *, sigma_sum: float, sensitivity: float, honest_fraction: float, participants: int
) -> GaussianEvent:
    """The effective event of N agents each adding Gaussian noise of std ``σ_sum/√(t·N)``.

    Only ``t·N`` agents' noise is counted (a fraction ``1 − t`` may remove its own), so the
    effective std is ``√(t·N)·σ_sum/√(t·N) = σ_sum``; counting ``t·N`` rather than the integer
    ``⌈t·N⌉`` of guaranteed-honest agents can only under-state the noise, which is conservative.

    Args:
        sigma_sum: the std the sum must carry (``z·S`` for noise multiplier z and clip norm S).
        sensitivity: the L2 sensitivity of the summed query, same units as ``sigma_sum``.
        honest_fraction: t in (0, 1].
        participants: N ≥ 1.

    Returns:
        The :class:`GaussianEvent` to charge.

    Raises:
        InvalidEventError: on a parameter outside its domain.
    """
    per_agent = per_agent_gaussian_std(
        sigma_sum=sigma_sum, honest_fraction=honest_fraction, participants=participants
    )
    t, n = _honest(honest_fraction, participants)
    # Recompose from the per-agent std the agents actually use, rounding down: never more noise
    # than was added.
    effective = min(sigma_sum, per_agent * math.sqrt(t * n))
    return GaussianEvent(sigma=effective, sensitivity=sensitivity)


def per_agent_skellam_mu(*, mu_sum: float, honest_fraction: float, participants: int) -> float:
    """The Skellam parameter each agent uses so that t·N honest agents sum to ``Sk(mu_sum)``."""
    m = _real("distributed noise", "mu_sum", mu_sum, minimum=0.0, strict=True)
    t, n = _honest(honest_fraction, participants)
    return m / (t * n)


def distributed_skellam(
    *,
    mu_sum: float,
    l1_sensitivity: float,
    l2_sensitivity: float,
    dimension: int,
    honest_fraction: float,
    participants: int,
) -> SkellamEvent:
    """The effective event of N agents each adding ``Sk(mu_sum/(t·N))`` per coordinate.

    The honest agents' noises sum to ``Sk(h·mu_sum/(t·N))`` with ``h ≥ t·N``; the Skellam RDP bound
    decreases in ``mu``, so charging ``Sk(mu_sum)`` is conservative.
    """
    per_agent = per_agent_skellam_mu(
        mu_sum=mu_sum, honest_fraction=honest_fraction, participants=participants
    )
    t, n = _honest(honest_fraction, participants)
    effective = min(mu_sum, per_agent * (t * n))
    return SkellamEvent(
        mu=effective,
        l1_sensitivity=l1_sensitivity,
        l2_sensitivity=l2_sensitivity,
        dimension=dimension,
    )
