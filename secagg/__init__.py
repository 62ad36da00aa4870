"""Secure summation in the style of Bell et al. (CCS 2020): the coordinator learns only the sum.

Transport-free: pure state machines (state, inbound messages) -> (state, outbound messages), the
primitives they use and parameter selection. It sums ring vectors and never reads how they were
made: the encoding of real vectors and the noise shares are :mod:`dpfl.mechanisms`. No I/O, no
gRPC, no torch. Entry points: docs/secagg.md#package-entry-points.
"""

from . import client, messages, server
from .config import RoundParameters
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
    VerificationFailed,
    WrongStage,
)
from .graph import NeighbourGraph, random_harary_graph
from .identity import ClientIdentity, IdentityError, PeerAuthority, Signer
from .parameters import GraphParameters, ThreatModel, choose_graph_parameters
from .randomness import RandomSource, RandomStream, SeededRandomSource, SystemRandomSource
from .server_states import Survivors
from .simulate import SimulationAborted, SimulationResult, StageTiming, simulate

__all__ = [
    "ClientIdentity",
    "DecryptionError",
    "DuplicateMessage",
    "EncodingOverflow",
    "ErrorCode",
    "GraphParameters",
    "IdentityError",
    "InvalidKey",
    "InvalidShare",
    "NeighbourGraph",
    "ParameterError",
    "PeerAuthority",
    "ProtocolAborted",
    "ProtocolViolation",
    "RandomSource",
    "RandomStream",
    "RoundParameters",
    "SecAggError",
    "SeededRandomSource",
    "Signer",
    "SimulationAborted",
    "SimulationResult",
    "StageTiming",
    "StaleMessage",
    "Survivors",
    "SystemRandomSource",
    "ThreatModel",
    "VerificationFailed",
    "WrongStage",
    "choose_graph_parameters",
    "client",
    "messages",
    "random_harary_graph",
    "server",
    "simulate",
]
