"""The DP mechanisms an agent runs on its vector before anything leaves it: clipping, scaling
and rounding into the ring Z_{2^r} (:mod:`.encoding`), and the integer noise shares drawn
exactly from a CSPRNG stream (:mod:`.noise`, over the exact samplers of :mod:`.sampling`).

Pure: numpy and the standard library, plus the ring, errors and randomness of
:mod:`dpfl.secagg`, which sums what these produce and never reads how. No torch, gRPC or SQL.
Formulas: docs/mechanisms.md.
"""

from .encoding import (
    DEFAULT_KAPPA,
    DEFAULT_ROUNDING_BETA,
    EncodingConfig,
    bit_budget,
    centre,
    clip_l2,
    decode,
    encode,
    stochastic_round,
    to_ring,
)
from .noise import NoiseKind, NoiseSpec, discrete_gaussian, poisson, skellam

__all__ = [
    "DEFAULT_KAPPA",
    "DEFAULT_ROUNDING_BETA",
    "EncodingConfig",
    "NoiseKind",
    "NoiseSpec",
    "bit_budget",
    "centre",
    "clip_l2",
    "decode",
    "discrete_gaussian",
    "encode",
    "poisson",
    "skellam",
    "stochastic_round",
    "to_ring",
]
