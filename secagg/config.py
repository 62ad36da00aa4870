"""The parameters of one secure-aggregation round, as carried by ``SecAggSetup``.

Invariants enforced on construction (:class:`ParameterError` otherwise): 2 ≤ t ≤ k + 1 ≤ n, k even
unless the graph is complete (k = n − 1), t ≤ min_survivors ≤ n, 1 ≤ r ≤ 64, m ≥ 1. How real
vectors become ring elements is not the protocol's business: the setup carries the application's
``encoding_json`` unread, and whoever chooses or reads the encoding checks it against r and n.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from .errors import ParameterError
from .messages import SecAggSetup
from .parameters import ThreatModel, choose_graph_parameters
from .prg import MAX_RING_BITS


def field_in_range(value: object, name: str, low: int, high: int) -> int:
    """A setup field that must be an integer in [low, high] (``ParameterError`` naming it)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ParameterError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class RoundParameters:
    """n, k, t, r, m and the abort threshold of a round.

    Attributes:
        num_clients: n, the clients invited to the secure aggregation.
        degree: k; every client has k + 1 neighbours, itself included.
        threshold: t of the t-of-(k+1) Shamir sharing.
        ring_bits: r; inputs and the sum live in Z_{2^r}.
        vector_length: m.
        min_survivors: the server aborts when fewer clients remain at any stage (fcp's ⌈n(1−δ)⌉).
    """

    num_clients: int
    degree: int
    threshold: int
    ring_bits: int
    vector_length: int
    min_survivors: int

    def __post_init__(self) -> None:
        n = field_in_range(self.num_clients, "num_clients", 2, 2**32 - 1)
        k = field_in_range(self.degree, "degree", 1, n - 1)
        if k % 2 and k != n - 1:
            raise ParameterError(f"degree {k} must be even unless the graph is complete")
        field_in_range(self.threshold, "threshold", 2, k + 1)
        field_in_range(self.ring_bits, "ring_bits", 1, MAX_RING_BITS)
        field_in_range(self.vector_length, "vector_length", 1, 2**40)
        field_in_range(self.min_survivors, "min_survivors", self.threshold, n)

    @classmethod
    def choose(
        cls,
        *,
        num_clients: int,
        vector_length: int,
        ring_bits: int,
        corrupt_fraction: float | Fraction = 0.05,
        dropout_fraction: float | Fraction = 0.05,
        model: ThreatModel = ThreatModel.SEMI_HONEST,
        sigma: int = 40,
        eta: int = 20,
    ) -> RoundParameters:
        """Parameters from the solver of docs/secagg.md#parameters, with
        min_survivors = ⌈n(1−δ)⌉."""
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
        return cls(
            num_clients=num_clients,
            degree=graph.degree,
            threshold=graph.threshold,
            ring_bits=ring_bits,
            vector_length=vector_length,
            min_survivors=survivors,
        )

    def setup_for(
        self,
        client_index: int,
        *,
        session_nonce: bytes = b"",
        encoding_json: str = "",
        threat_model: str = ThreatModel.SEMI_HONEST.value,
    ) -> SecAggSetup:
        """The ``SecAggSetup`` of one client (``session_nonce``: the server nonce of stage 0;
        ``encoding_json``: the application's text, carried unread; ``threat_model``: a
        :class:`ThreatModel` value)."""
        field_in_range(client_index, "client_index", 0, self.num_clients - 1)
        return SecAggSetup(
            client_index=client_index,
            num_clients=self.num_clients,
            degree=self.degree,
            threshold=self.threshold,
            ring_bits=self.ring_bits,
            vector_length=self.vector_length,
            min_survivors=self.min_survivors,
            encoding_json=encoding_json,
            session_nonce=session_nonce,
            threat_model=threat_model,
        )

    @classmethod
    def from_setup(cls, setup: SecAggSetup) -> RoundParameters:
        """Validate a received setup (raises :class:`ParameterError` naming the problem); its
        ``encoding_json`` is the application's to check."""
        if not isinstance(setup, SecAggSetup):
            raise ParameterError(f"expected a SecAggSetup, got {type(setup).__name__}")
        params = cls(
            num_clients=setup.num_clients,
            degree=setup.degree,
            threshold=setup.threshold,
            ring_bits=setup.ring_bits,
            vector_length=setup.vector_length,
            min_survivors=setup.min_survivors,
        )
        field_in_range(setup.client_index, "client_index", 0, params.num_clients - 1)
        return params
