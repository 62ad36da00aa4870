"""How one attempt's vector is summed: the strategy the agent chooses once, at the setup.

:mod:`dpfl.client.rounds` drives every attempt the same way; what differs between a masked round
and a plain one (docs/architecture.md#without-secure-aggregation-secaggenabled-false) is a
:data:`Summation`: ``input_request`` (the request if it asks for the agent's input),
``contribute`` (the reply that carries the encoded vector: masked by :mod:`dpfl.secagg`'s client
state machine, or the vector itself) and ``answer`` (the reply to any other request). Each is an
immutable value and returns the next one, which the worker keeps only once its local ledger has
recorded the charge. ``StaleMessage``, ``DuplicateMessage`` and ``WrongStage`` refuse a request
and change nothing, ``ProtocolAborted`` ends the attempt, ``ParameterError`` refuses a vector.

A plain setup (``degree = threshold = 0``) is validated as strictly as a masked one
(:class:`PlainParameters`), and :func:`check_mode` allows no downgrade and no silent upgrade.

A malicious-secure setup (``threat_model = "malicious"``) is run with the agent's
:class:`PeerCredentials` (its peer certificate and signing key, and the federation CA it trusts),
made into a :class:`~dpfl.secagg.identity.ClientIdentity` for the round; without them the setup is
refused (docs/secagg.md#the-malicious-secure-variant).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from dpfl.client.errors import AgentError
from dpfl.learning.algorithms.base import TaskParams
from dpfl.mechanisms import EncodingConfig
from dpfl.secagg import ClientIdentity, PeerAuthority, RoundParameters, Signer, ThreatModel
from dpfl.secagg import client as secagg_client
from dpfl.secagg import messages as sm
from dpfl.secagg.client_states import ClientAborted, ClientSharesSent, ClientState
from dpfl.secagg.config import field_in_range
from dpfl.secagg.errors import (
    DuplicateMessage,
    ParameterError,
    ProtocolAborted,
    StaleMessage,
    WrongStage,
)
from dpfl.secagg.prg import MAX_RING_BITS
from dpfl.secagg.primitives import compute_session_id
from dpfl.secagg.randomness import RandomSource
from dpfl.secagg.ring import as_ring_vector

__all__ = [
    "ModeMismatchError",
    "PeerCredentials",
    "PlainParameters",
    "PlainSummation",
    "SecureParameters",
    "SecureSummation",
    "Summation",
    "check_mode",
    "is_plain_setup",
    "setup_encoding",
    "start_summation",
]

_SESSION_ID_BYTES = 32
_MAX_VECTOR_LENGTH = 2**40


class ModeMismatchError(AgentError):
    """The setup's mode (masked or plain) is not the one the accepted task announced."""


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass(frozen=True, slots=True)
class PeerCredentials:
    """What the agent brings to a malicious-secure round: its signing key with its peer
    certificate (``signer``), the federation CA it trusts (``authority``, never the
    coordinator's), and the clock certificates are checked at. Loaded once at start-up and used
    for every secure round (docs/secagg.md#who-is-a-peer)."""

    signer: Signer
    authority: PeerAuthority = field(repr=False)
    clock: Callable[[], dt.datetime] = field(default=_utc_now, repr=False)

    def identity(self, *, max_colluding_peers: int) -> ClientIdentity:
        """The round's identity, certificates checked now.

        Raises:
            IdentityError: this agent's own certificate is not a peer of the federation CA now
                (expired, revoked by re-issue, another CA's).
        """
        return ClientIdentity(
            signer=self.signer,
            authority=self.authority,
            max_colluding_peers=max_colluding_peers,
            now=self.clock(),
        )


def is_plain_setup(setup: sm.SecAggSetup) -> bool:
    """Whether a setup is the marker of a plain round (``degree = threshold = 0``)."""
    return setup.degree == 0 and setup.threshold == 0


def check_mode(task: TaskParams, setup: sm.SecAggSetup, *, alone_unmasked: bool = True) -> None:
    """Refuse a setup whose mode contradicts the task's ``secure_aggregation`` flag.

    A plain setup for ONE agent of a task with secure aggregation is the coordinator releasing a
    one-client sample (docs/accounting.md, "Client sampling: every sample is released"): secure
    aggregation needs two, and the coordinator would learn the lone vector anyway. It is taken
    only when ``alone_unmasked`` (the local policy does not require masking).

    Raises:
        ModeMismatchError: any other plain setup for a task that did not say
            ``secure_aggregation: false``, or a masked setup for one that did.
    """
    plain, flag = is_plain_setup(setup), task.secure_aggregation
    if plain and flag and setup.num_clients == 1:
        if not alone_unmasked:
            raise ModeMismatchError(
                "a one-agent round is summed without masking and the local policy requires "
                "secure aggregation"
            )
    elif plain and flag:
        raise ModeMismatchError(
            "a setup without secure aggregation (degree = threshold = 0), but the accepted "
            "task says secure_aggregation = True: this agent accepted a masked round and never "
            "sends its vector in the clear"
        )
    elif not plain and not flag:
        raise ModeMismatchError(
            "a setup with secure aggregation (masked), but the accepted task says "
            "secure_aggregation = false: the claimed privacy and the local policy were checked "
            "for a round without it"
        )


@dataclass(frozen=True, slots=True)
class PlainParameters:
    """A validated plain-round setup (the fields the round's computation needs)."""

    num_clients: int
    client_index: int
    ring_bits: int
    vector_length: int
    min_survivors: int
    encoding: EncodingConfig

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
        n = field_in_range(setup.num_clients, "num_clients", 1, 2**32 - 1)
        index = field_in_range(setup.client_index, "client_index", 0, n - 1)
        if setup.min_survivors != 1:
            raise ParameterError(
                f"min_survivors of a plain round is 1 (each vector stands alone), got "
                f"{setup.min_survivors!r}"
            )
        ring_bits = field_in_range(setup.ring_bits, "ring_bits", 1, MAX_RING_BITS)
        length = field_in_range(setup.vector_length, "vector_length", 1, _MAX_VECTOR_LENGTH)
        return cls(
            num_clients=n,
            client_index=index,
            ring_bits=ring_bits,
            vector_length=length,
            min_survivors=1,
            encoding=setup_encoding(setup, ring_bits=ring_bits, summands=n),
        )


_THREAT_MODELS = tuple(model.value for model in ThreatModel)


@dataclass(frozen=True, slots=True)
class SecureParameters(RoundParameters):
    """A validated masked-round setup: secure aggregation's parameters and the encoding beside
    them (``encoding_json``, which the protocol carries unread, so the agent checks it), and
    whether the round is malicious-secure (the setup's ``threat_model``)."""

    encoding: EncodingConfig
    malicious: bool = False

    @classmethod
    def from_setup(cls, setup: sm.SecAggSetup) -> SecureParameters:
        """Raises ``ParameterError`` naming a malformed field (an unknown threat model among
        them), or ``EncodingOverflow``."""
        p = RoundParameters.from_setup(setup)
        if setup.threat_model not in _THREAT_MODELS:
            raise ParameterError(
                f"unknown threat model {setup.threat_model!r} (one of {', '.join(_THREAT_MODELS)})"
            )
        encoding = setup_encoding(setup, ring_bits=p.ring_bits, summands=p.num_clients)
        fields = (p.num_clients, p.degree, p.threshold, p.ring_bits, p.vector_length)
        malicious = setup.threat_model == ThreatModel.MALICIOUS.value
        return cls(*fields, p.min_survivors, encoding, malicious)


def setup_encoding(setup: sm.SecAggSetup, *, ring_bits: int, summands: int) -> EncodingConfig:
    """The setup's encoding, if it is in the round's ring and ``summands`` vectors cannot wrap
    it (``ParameterError``, ``EncodingOverflow`` otherwise)."""
    if not setup.encoding_json:
        raise ParameterError("no encoding_json (the agent sends an encoded real vector)")
    encoding = EncodingConfig.from_json(setup.encoding_json)
    encoding.check_round(ring_bits=ring_bits, summands=summands)
    return encoding


def start_summation(
    params: SecureParameters | PlainParameters,
    request: sm.AdvertiseKeysRequest,
    *,
    job_id: str,
    round: int,
    rng: RandomSource,
    identity: ClientIdentity | None = None,
) -> tuple[Summation, sm.ClientMessage]:
    """The summation a validated setup asks for, and its acknowledgement of ``request``
    (``identity``: the agent's peer identity, which a malicious-secure setup needs)."""
    if isinstance(params, PlainParameters):
        plain = PlainSummation(job_id, round, request.header.session_id, params)
        return plain, plain.acknowledgement()
    client = secagg_client.new_client(job_id=job_id, round=round, rng=rng, identity=identity)
    return SecureSummation(client, params).answer(request)


@dataclass(frozen=True, slots=True)
class SecureSummation:
    """A masked round: :mod:`dpfl.secagg`'s client state machine, one state per stage."""

    state: ClientState
    params: SecureParameters

    secure = True
    input_note = ""

    @property
    def stage(self) -> sm.Stage:
        return self.state.stage

    @property
    def mode(self) -> str:
        malicious = ", malicious-secure" if self.params.malicious else ""
        return f"k={self.params.degree}, t={self.params.threshold}{malicious}"

    def verified_shares(self) -> int:
        """The noise shares this agent verified are in every decodable sum with its input
        (:func:`dpfl.secagg.client.verified_noise_shares`)."""
        return secagg_client.verified_noise_shares(self.state)

    def input_request(self, request: sm.ServerMessage) -> sm.MaskedInputRequest | None:
        if isinstance(request, sm.MaskedInputRequest) and isinstance(self.state, ClientSharesSent):
            return request
        return None

    def contribute(
        self, vector: npt.NDArray[np.uint64], request: sm.MaskedInputRequest
    ) -> tuple[SecureSummation, sm.ClientMessage]:
        """The masked input: ``vector`` attached to the state, then the request answered."""
        loaded = replace(self, state=secagg_client.with_input(self.state, vector))
        return loaded.answer(request)

    def answer(self, request: sm.ServerMessage) -> tuple[SecureSummation, sm.ClientMessage]:
        state, reply = secagg_client.step(self.state, request)
        if isinstance(state, ClientAborted) or reply is None:
            reason = state.reason if isinstance(state, ClientAborted) else "no reply"
            raise ProtocolAborted(f"secure aggregation aborted: {reason}")
        return replace(self, state=state), reply


@dataclass(frozen=True, slots=True)
class PlainSummation:
    """A round without secure aggregation: one acknowledgement, then the vector itself, once.

    ``stage`` is ``ADVERTISE_KEYS`` until the vector is out (``sent``), then ``MASKED_INPUT``.
    """

    job_id: str
    round: int
    session_id: bytes
    params: PlainParameters
    sent: bool = False

    secure = False
    mode = "no secure aggregation: the coordinator sees this agent's noised vector"
    input_note = "unmasked (no secure aggregation)"

    @property
    def stage(self) -> sm.Stage:
        return sm.Stage.MASKED_INPUT if self.sent else sm.Stage.ADVERTISE_KEYS

    def header(self, stage: sm.Stage) -> sm.RoundHeader:
        return sm.RoundHeader(self.job_id, self.round, stage, self.session_id)

    def acknowledgement(self) -> sm.AdvertiseKeysResponse:
        """The answer to the setup: an ``AdvertiseKeysResponse`` with empty keys."""
        return sm.AdvertiseKeysResponse(self.header(sm.Stage.ADVERTISE_KEYS), b"", b"")

    def input_request(self, request: sm.ServerMessage) -> sm.MaskedInputRequest:
        """The masked-input request, the only one a plain round has after its setup: another
        job, round or session is stale, the setup or a second request a duplicate, a share-keys
        or unmask request the wrong stage, and shares in the request abort the round."""
        header = request.header
        if header.job_id != self.job_id or header.round != self.round:
            raise StaleMessage(
                f"message of job {header.job_id!r} round {header.round}, expected "
                f"{self.job_id!r} round {self.round}"
            )
        if header.session_id != self.session_id:
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
        if self.sent:
            raise DuplicateMessage("the vector of this plain round was already sent")
        if request.shares:
            raise ProtocolAborted(
                f"plain round aborted: the masked-input request of a plain round carries "
                f"{len(request.shares)} shares"
            )
        return request

    def contribute(
        self, vector: npt.NDArray[np.uint64], request: sm.MaskedInputRequest
    ) -> tuple[PlainSummation, sm.ClientMessage]:
        """The masked-input response: ``vector`` itself, unmasked, once."""
        self.input_request(request)
        params = self.params
        ring = as_ring_vector(vector, ring_bits=params.ring_bits, length=params.vector_length)
        reply = sm.MaskedInputResponse(self.header(sm.Stage.MASKED_INPUT), masked_input=ring)
        return replace(self, sent=True), reply

    def answer(self, request: sm.ServerMessage) -> tuple[PlainSummation, sm.ClientMessage]:
        """No answer: after its setup a plain round has only the masked-input request."""
        self.input_request(request)
        raise WrongStage("a plain round has only the masked input")


#: One attempt's summation, from the acknowledged setup on.
Summation = SecureSummation | PlainSummation
