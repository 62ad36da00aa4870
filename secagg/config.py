"""The parameters of one secure-aggregation round, as carried by ``SecAggSetup``.

Invariants enforced on construction (:class:`ParameterError` otherwise): 2 ≤ t ≤ k + 1 ≤ n, k even
unless the graph is complete (k = n − 1), t ≤ min_survivors ≤ n, 1 ≤ r ≤ 64, m ≥ 1, and, when an
encoding is given, its ring is r bits and n encoded vectors plus their noise cannot wrap it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from .encoding import DEFAULT_KAPPA, EncodingConfig
from .errors import ParameterError
from .messages import SecAggSetup
from .parameters import ThreatModel, choose_graph_parameters
from .prg import MAX_RING_BITS


def _int(value: object, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ParameterError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class RoundParameters:
    """n, k, t, r, m, the abort threshold and the (optional) real-vector encoding of a round.

    Attributes:
        num_clients: n, the clients invited to the secure aggregation.
        degree: k; every client has k + 1 neighbours, itself included.
        threshold: t of the t-of-(k+1) Shamir sharing.
        ring_bits: r; inputs and the sum live in Z_{2^r}.
        vector_length: m.
        min_survivors: the server aborts when fewer clients remain at any stage (fcp's ⌈n(1−δ)⌉).
        encoding: how agents turn real vectors into ring elements; None for raw ring vectors.
    """

    num_clients: int
    degree: int
    threshold: int
    ring_bits: int
    vector_length: int
    min_survivors: int
    encoding: EncodingConfig | None = None

    def __post_init__(self) -> None:
        n = _int(self.num_clients, "num_clients", 2, 2**32 - 1)
        k = _int(self.degree, "degree", 1, n - 1)
        if k % 2 and k != n - 1:
            raise ParameterError(f"degree {k} must be even unless the graph is complete")
        _int(self.threshold, "threshold", 2, k + 1)
        _int(self.ring_bits, "ring_bits", 1, MAX_RING_BITS)
        _int(self.vector_length, "vector_length", 1, 2**40)
        _int(self.min_survivors, "min_survivors", self.threshold, n)
        if self.encoding is not None:
            if not isinstance(self.encoding, EncodingConfig):
                raise ParameterError(f"encoding must be an EncodingConfig, got {self.encoding!r}")
            if self.encoding.ring_bits != self.ring_bits:
                raise ParameterError(
                    f"encoding ring ({self.encoding.ring_bits} bits) differs from the round's "
                    f"({self.ring_bits} bits)"
                )
            self.encoding.check_no_wrap(n)

    @classmethod
    def choose(
        cls,
        *,
        num_clients: int,
        vector_length: int,
        ring_bits: int | None = None,
        encoding: EncodingConfig | None = None,
        corrupt_fraction: float | Fraction = 0.05,
        dropout_fraction: float | Fraction = 0.05,
        model: ThreatModel = ThreatModel.SEMI_HONEST,
        sigma: int = 40,
        eta: int = 20,
    ) -> RoundParameters:
        """Parameters from the solver of docs/secagg.md#parameters, with min_survivors = ⌈n(1−δ)⌉.

        Give either ``encoding`` (its ring is used) or ``ring_bits`` (raw ring vectors).
        """
        if (ring_bits is None) == (encoding is None):
            raise ParameterError("give exactly one of ring_bits and encoding")
        graph = choose_graph_parameters(
            n=num_clients,
            corrupt_fraction=corrupt_fraction,
            dropout_fraction=dropout_fraction,
            model=model,
            sigma=sigma,
            eta=eta,
        )
        delta = (
            dropout_fraction
            if isinstance(dropout_fraction, Fraction)
            else Fraction(repr(float(dropout_fraction)))
        )
        survivors = max(math.ceil((1 - delta) * num_clients), graph.threshold)
        bits = encoding.ring_bits if encoding is not None else ring_bits
        return cls(
            num_clients=num_clients,
            degree=graph.degree,
            threshold=graph.threshold,
            ring_bits=int(bits),  # type: ignore[arg-type]
            vector_length=vector_length,
            min_survivors=survivors,
            encoding=encoding,
        )

    def setup_for(self, client_index: int, *, session_nonce: bytes = b"") -> SecAggSetup:
        """The ``SecAggSetup`` of one client (``session_nonce``: the server nonce of stage 0)."""
        _int(client_index, "client_index", 0, self.num_clients - 1)
        return SecAggSetup(
            client_index=client_index,
            num_clients=self.num_clients,
            degree=self.degree,
            threshold=self.threshold,
            ring_bits=self.ring_bits,
            vector_length=self.vector_length,
            min_survivors=self.min_survivors,
            encoding_json="" if self.encoding is None else self.encoding.to_json(),
            session_nonce=session_nonce,
        )

    @classmethod
    def from_setup(cls, setup: SecAggSetup, *, kappa: float = DEFAULT_KAPPA) -> RoundParameters:
        """Validate a received setup (raises :class:`ParameterError` naming the problem)."""
        if not isinstance(setup, SecAggSetup):
            raise ParameterError(f"expected a SecAggSetup, got {type(setup).__name__}")
        encoding = EncodingConfig.from_json(setup.encoding_json) if setup.encoding_json else None
        params = cls(
            num_clients=setup.num_clients,
            degree=setup.degree,
            threshold=setup.threshold,
            ring_bits=setup.ring_bits,
            vector_length=setup.vector_length,
            min_survivors=setup.min_survivors,
            encoding=encoding,
        )
        _int(setup.client_index, "client_index", 0, params.num_clients - 1)
        if encoding is not None:
            encoding.check_no_wrap(params.num_clients, kappa=kappa)
        return params
