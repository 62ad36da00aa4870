"""Secure summation in the style of Bell et al. (CCS 2020): the coordinator learns only the sum.

Transport-free: pure state machines (state, inbound messages) -> (state, outbound messages), the
primitives they use, parameter selection, the ring encoding and the integer noise samplers. No
I/O, no gRPC, no torch. Entry points: docs/secagg.md#package-entry-points.
"""

from . import client, messages, server
from .config import RoundParameters
from .encoding import (
    DEFAULT_KAPPA,
    EncodingConfig,
    bit_budget,
    centre,
    clip_l2,
    decode,
    encode,
    stochastic_round,
    to_ring,
)
from .errors import (
    DecryptionError,
    DuplicateMessage,
    EncodingOverflow,
    ErrorCode,
    InvalidKey,
    InvalidShare,
    ParameterError,
    ProtocolAborted,
    ProtocolViolation,
    SecAggError,
    StaleMessage,
    WrongStage,
)
from .graph import NeighbourGraph, random_harary_graph
from .noise import NoiseKind, NoiseSpec, discrete_gaussian, poisson, skellam
from .parameters import GraphParameters, ThreatModel, choose_graph_parameters
from .randomness import RandomSource, RandomStream, SeededRandomSource, SystemRandomSource
from .server_states import Survivors
from .simulate import SimulationAborted, SimulationResult, StageTiming, simulate

__all__ = [
    "DEFAULT_KAPPA",
    "DecryptionError",
    "DuplicateMessage",
    "EncodingConfig",
    "EncodingOverflow",
    "ErrorCode",
    "GraphParameters",
    "InvalidKey",
    "InvalidShare",
    "NeighbourGraph",
    "NoiseKind",
    "NoiseSpec",
    "ParameterError",
    "ProtocolAborted",
    "ProtocolViolation",
    "RandomSource",
    "RandomStream",
    "RoundParameters",
    "SecAggError",
    "SeededRandomSource",
    "SimulationAborted",
    "SimulationResult",
    "StageTiming",
    "StaleMessage",
    "Survivors",
    "SystemRandomSource",
    "ThreatModel",
    "WrongStage",
    "bit_budget",
    "centre",
    "choose_graph_parameters",
    "client",
    "clip_l2",
    "decode",
    "discrete_gaussian",
    "encode",
    "messages",
    "poisson",
    "random_harary_graph",
    "server",
    "simulate",
    "skellam",
    "stochastic_round",
    "to_ring",
]
