"""What every privacy event provides, so that no caller switches on event classes.

An event class carries its own math: its RDP curve, its part of the tight path, its JSON fields
and its noise multiplier. Defining a subclass of :class:`DpEvent` with a non-empty ``kind``
registers it (:func:`event_class` finds it by kind when a stored document is parsed), so a new
event is one class and nothing else is edited. Composite events (composition, sampling) delegate
to their parts. Every method returns an upper bound or raises
:class:`~dpfl.accounting.errors.UnsupportedEventError` naming the event; the defaults here raise
it, so an event that provides no curve is refused rather than charged nothing.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from .errors import UnsupportedEventError

__all__ = [
    "DpEvent",
    "EventJson",
    "FloatArray",
    "Orders",
    "ParseNested",
    "TightParts",
    "event_class",
    "event_kinds",
    "flatten_tight",
    "overflow_as_inf",
]

FloatArray = NDArray[np.float64]
#: A validated grid of Rényi orders (strictly increasing, > 1).
Orders = tuple[float, ...]
#: The JSON form of an event (JSON-native values; the key ``"kind"`` names the class).
EventJson = dict[str, Any]
#: Parses a nested event's JSON at a path (``event.events[2]``), for composite events.
ParseNested = Callable[[object, str], "DpEvent"]

_KINDS: dict[str, type[DpEvent]] = {}
#: Per class: its required field names and its optional ones with their defaults (read once).
_SCHEMAS: dict[type[DpEvent], tuple[tuple[str, ...], dict[str, object]]] = {}


@dataclass(frozen=True, slots=True, order=True)
class SkellamShift:
    """A Skellam release ``Sk(mu)`` per coordinate whose neighbouring outputs differ by an integer
    vector of L2 norm ≤ ``l2`` with entries of magnitude ≤ ``max_shift``, in ``dimension``
    coordinates. Its dominating Gaussian pair: docs/accounting.md#skellam-in-several-coordinates."""

    mu: float
    max_shift: int
    l2: float
    dimension: int


@dataclass
class TightParts:
    """An event flattened for the tight path: the coefficient ρ of its composed Gaussians
    (RDP ``ρ·α``, exact profile), its Poisson-subsampled Gaussians ``(rate, noise multiplier)``
    its one-coordinate Skellam releases ``(mu, integer shift)`` (PLD) and the Skellam releases
    accounted by a dominating Gaussian, with counts."""

    rho: float = 0.0
    sampled: Counter[tuple[float, float]] = field(default_factory=Counter)
    skellam: Counter[tuple[float, int]] = field(default_factory=Counter)
    #: Skellam releases accounted by their dominating Gaussian, keyed by (sampling rate, shift);
    #: rate 1 is an unsampled release.
    skellam_gaussian: Counter[tuple[float, SkellamShift]] = field(default_factory=Counter)

    def add_rho(self, count: int, compute: Callable[[], float | None]) -> None:
        """Add ``count`` times a ρ; +inf where it overflows (noise negligible next to the
        sensitivity: no finite ε is claimed, and +inf is an upper bound)."""
        self.rho += count * (overflow_as_inf(compute) or 0.0)


def overflow_as_inf(compute: Callable[[], float | None]) -> float | None:
    """``compute()``, +inf where it overflows (a ρ of noise negligible next to the sensitivity:
    +inf is an upper bound)."""
    try:
        return compute()
    except ArithmeticError:
        return math.inf


def flatten_tight(event: DpEvent, count: int, parts: TightParts) -> None:
    """Add ``count`` compositions of ``event`` to ``parts`` (nothing at all for ``count == 0``).

    Raises:
        UnsupportedEventError: a part of ``event`` has no tight path.
    """
    if count == 0:
        return
    if not isinstance(event, DpEvent):
        raise UnsupportedEventError(f"not a dpfl privacy event: {type(event).__name__}")
    event.add_tight_parts(count, parts)


def event_class(kind: str) -> type[DpEvent] | None:
    """The event class registered under ``kind``, or None."""
    return _KINDS.get(kind)


def event_kinds() -> tuple[str, ...]:
    """Every registered event kind, in order of registration."""
    return tuple(_KINDS)


class DpEvent:
    """Base class of every privacy event (never instantiated itself).

    A subclass is a frozen dataclass naming its ``kind`` (its stable name in the JSON form) and
    overriding the methods below that apply to it.
    """

    __slots__ = ()
    #: The stable name of the event's kind in its JSON form.
    kind: ClassVar[str] = ""
    #: Marks the family whose ε must be labelled data-dependent.
    data_dependent: ClassVar[bool] = False
    #: The event carries its own neighbouring relation (agent or instance level), so it is
    #: never subsampled.
    own_relation: ClassVar[bool] = False
    #: A bare integer shift of a symmetric noise: both directions of its pairs have one law,
    #: which the Poisson-subsampled bound uses.
    symmetric_shift: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        kind = cls.__dict__.get("kind")
        if not isinstance(kind, str) or not kind:
            return
        known = _KINDS.get(kind)
        # dataclass(slots=True) remakes the class: the same name replaces its first making
        same = known is not None and (known.__module__, known.__qualname__) == (
            cls.__module__,
            cls.__qualname__,
        )
        if known is not None and not same:
            raise TypeError(
                f"event kind {kind!r} of {cls.__qualname__} is already registered by "
                f"{known.__module__}.{known.__qualname__}"
            )
        _KINDS[kind] = cls

    # -- RDP ------------------------------------------------------------------------------------

    def rdp(self, orders: Orders) -> FloatArray:
        """The RDP upper bound at each of ``orders`` (uncached: callers use ``rdp_curve``)."""
        raise UnsupportedEventError(f"no RDP bound for event {type(self).__name__}")

    def supports_rdp(self) -> bool:
        """Whether :meth:`rdp` bounds this event (a structural dry run; no computation)."""
        return type(self).rdp is not DpEvent.rdp

    def gaussian_coefficient(self) -> float | None:
        """ρ if the event is a composition of Gaussian mechanisms (RDP exactly ``ρ·α``), else
        None. Gaussians composed on the same data are one Gaussian mechanism, which is what lets
        a sampled composition of them be accounted as one subsampled Gaussian."""
        return None

    def skellam_shift(self) -> SkellamShift | None:
        """The event as one Skellam release (its noise and shift bounds), or None: what a
        Poisson-subsampled Skellam release is accounted from on the tight path."""
        return None

    def unsampleable_part(self) -> DpEvent | None:
        """The first part of the event that carries its own neighbouring relation, or None."""
        return self if self.own_relation else None

    # -- the tight path -------------------------------------------------------------------------

    def add_tight_parts(self, count: int, parts: TightParts) -> None:
        """Add ``count ≥ 1`` compositions of the event to ``parts``.

        Raises:
            UnsupportedEventError: the event has no tight path (its ε is the RDP bound).
        """
        del count, parts
        raise UnsupportedEventError(f"no tight path for {type(self).__name__}")

    # -- the agent's policy ---------------------------------------------------------------------

    def min_noise_multiplier(self) -> float:
        """The smallest noise multiplier (noise std over L2 sensitivity) of any release in the
        event; infinite for an event without a noisy release."""
        raise UnsupportedEventError(f"no noise multiplier for {type(self).__name__}")

    def with_noise_fraction(self, fraction: float) -> DpEvent:
        """The same releases when only ``fraction`` ∈ (0, 1] of the noise's variance is in them
        (docs/accounting.md#what-the-agent-can-verify): the event of the noise an agent can
        prove is in a sum, when it cannot prove all of it.

        Raises:
            UnsupportedEventError: the event states no noise to scale.
        """
        del fraction
        raise UnsupportedEventError(f"no noise to scale in {type(self).__name__}")

    # -- data-dependent bounds ------------------------------------------------------------------

    def is_data_dependent(self) -> bool:
        """Whether any part of the event is accounted with a data-dependent bound."""
        return self.data_dependent

    def guaranteed(self) -> DpEvent:
        """The event with every data-dependent part replaced by its data-independent
        counterpart (the worst-case guarantee budgets are enforced on)."""
        return self

    # -- the JSON form --------------------------------------------------------------------------

    @classmethod
    def json_schema(cls) -> tuple[tuple[str, ...], Mapping[str, object]]:
        """The required fields and the optional ones with their defaults (the dataclass fields,
        in order; those with a default are optional, so an added field keeps old documents
        parsing)."""
        if cls not in _SCHEMAS:
            required: list[str] = []
            optional: dict[str, object] = {}
            for f in dataclasses.fields(cls):  # type: ignore[arg-type]
                if f.default is not dataclasses.MISSING:
                    optional[f.name] = f.default
                else:
                    required.append(f.name)
            _SCHEMAS[cls] = (tuple(required), optional)
        return _SCHEMAS[cls]

    def json_fields(self, nested: Callable[[DpEvent], EventJson]) -> EventJson:
        """The event's fields as JSON-native values (without ``"kind"``), in declaration order.

        ``nested`` writes a part that is itself an event (composite events).
        """
        del nested
        required, optional = self.json_schema()
        return {
            name: list(v) if isinstance(v := getattr(self, name), tuple) else v
            for name in (*required, *optional)
        }

    @classmethod
    def from_json_fields(cls, fields: Mapping[str, Any], path: str, nested: ParseNested) -> DpEvent:
        """The event from its checked fields (every required and optional one present).

        Raises:
            InvalidEventError: a value of the wrong type or outside its domain.
        """
        del path, nested
        return cls(**fields)
