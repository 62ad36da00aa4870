"""The agent's side of a round without secure aggregation (``secagg.enabled: false``).

The pure parts of the plain round of
docs/architecture.md#without-secure-aggregation-secaggenabled-false: validation of the setup
(marked by ``degree = threshold = 0``) as strict as a masked one, and the small state machine of
one acknowledgement and one unmasked vector per attempt. :func:`check_mode` allows no downgrade
and no silent upgrade: a plain setup only for a task whose ``secure_aggregation`` is exactly
false, and a masked one only otherwise (:class:`ModeMismatchError`). :mod:`dpfl.client.rounds`
drives them with the same training, local charge and transport as a masked round.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from dpfl.client.errors import AgentError
from dpfl.learning.algorithms.base import TaskParams
from dpfl.secagg import EncodingConfig
from dpfl.secagg import messages as sm
from dpfl.secagg.errors import (
    DuplicateMessage,
    ParameterError,
    ProtocolViolation,
    StaleMessage,
    WrongStage,
)
from dpfl.secagg.prg import MAX_RING_BITS
from dpfl.secagg.primitives import compute_session_id
from dpfl.secagg.ring import as_ring_vector

__all__ = [
    "ModeMismatchError",
    "PlainParameters",
    "PlainRound",
    "check_mode",
    "check_request",
    "is_plain_setup",
    "unmasked_input",
]

_SESSION_ID_BYTES = 32
_MAX_VECTOR_LENGTH = 2**40


class ModeMismatchError(AgentError):
    """The setup's mode (masked or plain) is not the one the accepted task announced."""


def is_plain_setup(setup: sm.SecAggSetup) -> bool:
    """Whether a setup is the marker of a plain round (``degree = threshold = 0``)."""
    return setup.degree == 0 and setup.threshold == 0


def check_mode(task: TaskParams, *, plain: bool) -> None:
    """Refuse a setup whose mode contradicts the task's ``secure_aggregation`` flag.

    Raises:
        ModeMismatchError: a plain setup for a task that did not say ``secure_aggregation:
            false``, or a masked setup for one that did.
    """
    flag = task.secure_aggregation
    if plain and flag:
        raise ModeMismatchError(
            "a setup without secure aggregation (degree = threshold = 0), but the accepted "
            "task says secure_aggregation = True: this agent accepted a masked round and never "
            "sends its vector in the clear"
        )
    if not plain and not flag:
        raise ModeMismatchError(
            "a setup with secure aggregation (masked), but the accepted task says "
            "secure_aggregation = false: the claimed privacy and the local policy were checked "
            "for a round without it"
        )


@dataclass(frozen=True, slots=True)
class PlainParameters:
    """A validated plain-round setup (the fields the round's computation needs).

    ``degree`` and ``threshold`` are 0 by definition; they are kept so that the task loop reads
    any round's parameters the same way.
    """

    num_clients: int
    client_index: int
    ring_bits: int
    vector_length: int
    min_survivors: int
    encoding: EncodingConfig
    degree: int = 0
    threshold: int = 0

    @classmethod
    def from_request(
        cls, request: sm.AdvertiseKeysRequest, *, job_id: str, round: int
    ) -> PlainParameters:
        """Validate a plain setup for round ``round`` of ``job_id``.

        Raises:
            ParameterError: naming the field that is malformed (see the module docstring).
        """
        setup = request.setup
        if not is_plain_setup(setup):
            raise ParameterError("not a plain setup: degree and threshold must both be 0")
        session = request.header.session_id
        if not isinstance(session, bytes) or len(session) != _SESSION_ID_BYTES:
            raise ParameterError(f"session id must have {_SESSION_ID_BYTES} bytes")
        if compute_session_id(job_id=job_id, round=round, nonce=setup.session_nonce) != session:
            raise ParameterError("session id does not match SHA-256(job ‖ round ‖ server nonce)")
        n = _int(setup.num_clients, "num_clients", 1, 2**32 - 1)
        index = _int(setup.client_index, "client_index", 0, n - 1)
        if setup.min_survivors != 1:
            raise ParameterError(
                f"min_survivors of a plain round is 1 (each vector stands alone), got "
                f"{setup.min_survivors!r}"
            )
        ring_bits = _int(setup.ring_bits, "ring_bits", 1, MAX_RING_BITS)
        length = _int(setup.vector_length, "vector_length", 1, _MAX_VECTOR_LENGTH)
        if not setup.encoding_json:
            raise ParameterError("no encoding_json (the agent sends an encoded real vector)")
        encoding = EncodingConfig.from_json(setup.encoding_json)
        if encoding.ring_bits != ring_bits:
            raise ParameterError(
                f"encoding ring ({encoding.ring_bits} bits) differs from the round's "
                f"({ring_bits} bits)"
            )
        encoding.check_no_wrap(n)
        return cls(
            num_clients=n,
            client_index=index,
            ring_bits=ring_bits,
            vector_length=length,
            min_survivors=1,
            encoding=encoding,
        )


@dataclass(frozen=True, slots=True)
class PlainRound:
    """One plain round on the agent: acknowledged, then (``sent``) its vector is out."""

    job_id: str
    round: int
    session_id: bytes
    params: PlainParameters
    sent: bool = False

    @property
    def stage(self) -> sm.Stage:
        """The stage this agent answered last."""
        return sm.Stage.MASKED_INPUT if self.sent else sm.Stage.ADVERTISE_KEYS

    def header(self, stage: sm.Stage) -> sm.RoundHeader:
        return sm.RoundHeader(self.job_id, self.round, stage, self.session_id)

    def acknowledgement(self) -> sm.AdvertiseKeysResponse:
        """The answer to the setup: an ``AdvertiseKeysResponse`` with empty keys."""
        return sm.AdvertiseKeysResponse(
            header=self.header(sm.Stage.ADVERTISE_KEYS),
            encryption_public_key=b"",
            masking_public_key=b"",
        )


def check_request(state: PlainRound, request: sm.ServerMessage) -> None:
    """Check a request that arrives after the setup was acknowledged; nothing changes.

    Raises:
        StaleMessage: another job, round or session.
        DuplicateMessage: the setup or the masked-input request again.
        WrongStage: a share-keys or unmask request (a plain round has neither), or a request
            whose header carries another stage.
        ProtocolViolation: a masked-input request that carries shares.
    """
    header = request.header
    if header.job_id != state.job_id or header.round != state.round:
        raise StaleMessage(
            f"message of job {header.job_id!r} round {header.round}, expected {state.job_id!r} "
            f"round {state.round}"
        )
    if header.session_id != state.session_id:
        raise StaleMessage("message of another session")
    if isinstance(request, sm.AdvertiseKeysRequest):
        raise DuplicateMessage("the plain-round setup was already acknowledged")
    if not isinstance(request, sm.MaskedInputRequest):
        raise WrongStage(
            f"{type(request).__name__} in a round without secure aggregation (it has no "
            "share-keys or unmask stage)"
        )
    if header.stage != sm.Stage.MASKED_INPUT:
        raise WrongStage(f"MaskedInputRequest carries stage {header.stage!r}")
    if state.sent:
        raise DuplicateMessage("the vector of this plain round was already sent")
    if request.shares:
        raise ProtocolViolation(
            f"the masked-input request of a plain round carries {len(request.shares)} shares"
        )


def unmasked_input(
    state: PlainRound, vector: npt.NDArray[np.uint64]
) -> tuple[PlainRound, sm.MaskedInputResponse]:
    """The masked-input response of a plain round: ``vector`` itself, unmasked.

    Raises:
        DuplicateMessage: the vector was already sent.
        ParameterError: a vector that is not m integers of the ring.
    """
    if state.sent:
        raise DuplicateMessage("the vector of this plain round was already sent")
    params = state.params
    vector = as_ring_vector(vector, ring_bits=params.ring_bits, length=params.vector_length)
    reply = sm.MaskedInputResponse(header=state.header(sm.Stage.MASKED_INPUT), masked_input=vector)
    return replace(state, sent=True), reply


def _int(value: object, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ParameterError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
    return value
