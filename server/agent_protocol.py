"""Transport-free handlers of the agent protocol: ``(request, store, ...) -> response``.

The gRPC servicer and the in-process link are thin adapters over these functions
(docs/architecture.md#handlers-free-of-transport-typed-errors). Every handler validates before
touching the store, so a refused request changes nothing; authentication is constant-time and
answers every failure alike, binds an agent to its certificate's common name under mutual TLS,
serves downloads only to job members (NOT_FOUND otherwise, so ids cannot be probed), and never
echoes a secret.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import ClassVar, Protocol, TypeAlias, cast

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.protos.enums import enum_name
from dpfl.server.errors import InvalidCredential, InvalidInput, NotFound, ServerError
from dpfl.server.jobs_control import submit_job
from dpfl.server.settings import Settings
from dpfl.server.store import Agent, Budget, Job, Store
from dpfl.server.store.core import MAX_INT, check_labels, check_name

__all__ = [
    "AGENT_ID_HEADER",
    "AUTHORIZATION_HEADER",
    "DEFAULT_CHUNK_BYTES",
    "MAX_ECHOED_JOB_ID",
    "MAX_ERROR_TEXT",
    "MODEL_MEDIA_TYPE",
    "PUBLIC_DATA_MEDIA_TYPE",
    "BlobSource",
    "DuplicateMessage",
    "InboxFull",
    "MalformedMessage",
    "MessageTooLarge",
    "RoundMessageError",
    "StaleRound",
    "UnknownEnumValue",
    "UnknownJob",
    "WrongStage",
    "authenticate",
    "authenticate_member",
    "check_certificate_binding",
    "check_enums",
    "check_round_header",
    "chunk_blob",
    "default_budget",
    "download",
    "echoed_header",
    "enroll",
    "enum_name",
    "error_message",
    "error_reply",
    "shown",
    "submit",
]

#: gRPC metadata key carrying the agent id (lower case: gRPC metadata keys are).
AGENT_ID_HEADER = "x-dpfl-agent-id"
#: gRPC metadata key carrying ``Bearer <credential>``.
AUTHORIZATION_HEADER = "authorization"
#: Payload bytes per ``DownloadChunk`` (well under the default 4 MiB message limit).
DEFAULT_CHUNK_BYTES = 1 << 20
MODEL_MEDIA_TYPE = "application/x-dpfl-model"
#: The public query set of a voting job: a ``.npy`` float32 array (``numpy.save``, no pickle).
PUBLIC_DATA_MEDIA_TYPE = "application/x-npy"
_MAX_NAME = 200
_MAX_TOKEN = 512
_UNAUTHENTICATED = "unknown agent or invalid credential"
_log = logging.getLogger("dpfl.coordinator")
#: Characters of the text of an ``Error`` the coordinator sends; a longer text is cut.
MAX_ERROR_TEXT = 1024
#: The longest job id an ``Error`` repeats from the message it refuses (longer ones name no job).
MAX_ECHOED_JOB_ID = _MAX_NAME
#: The longest session id an ``Error`` repeats (a real one is a 32-byte SHA-256).
_MAX_ECHOED_SESSION_ID = 64


# -- errors of round-scoped messages -------------------------------------------------------------


class RoundMessageError(ServerError):
    """A round-scoped message the coordinator refuses; answered on the stream with an ``Error``
    carrying :attr:`error_code` and the message, or with :attr:`grpc_status` on unary RPCs."""

    grpc_status = "INVALID_ARGUMENT"
    http_status = 422
    code = "invalid_message"
    error_code: ClassVar[pb.ErrorCode] = pb.ERROR_INVALID_ARGUMENT


class MalformedMessage(RoundMessageError):  # noqa: N818 (names read as outcomes)
    """Content that cannot be parsed or is out of range (wrong vector length, bad enum ...)."""


class MessageTooLarge(RoundMessageError):  # noqa: N818 (names read as outcomes)
    """A message over the configured ``max_message_bytes`` (gRPC refuses it itself; in-process
    links raise this)."""

    grpc_status = "RESOURCE_EXHAUSTED"
    http_status = 413
    code = "too_large"


class UnknownEnumValue(MalformedMessage):
    """An enum field of an agent's message holds a value this coordinator does not know (a
    newer or broken agent): refused, naming the field and the value, never raised as a
    ``ValueError`` from ``Enum.Name``."""

    def __init__(self, field: str, enum: str, value: int) -> None:
        super().__init__(f"{field}: unknown value {value} of {enum}")
        self.field = field
        self.enum = enum
        self.value = value


#: Per message type: its fields that are enums (with their known numbers) or hold one.
_ENUM_FIELDS: dict[str, tuple[tuple[FieldDescriptor, frozenset[int] | None], ...]] = {}


def _enum_fields(
    descriptor: Descriptor | None,
) -> tuple[tuple[FieldDescriptor, frozenset[int] | None], ...]:
    """The fields of a message type that are enums (with their known numbers) or hold one at
    any depth, memoized: the walk of :func:`check_enums` then never touches a bytes field (a
    masked input's vector) nor a message without enums."""
    if descriptor is None:
        return ()
    found = _ENUM_FIELDS.get(descriptor.full_name)
    if found is not None:
        return found
    _ENUM_FIELDS[descriptor.full_name] = ()  # a recursive type is walked once
    found = tuple(
        (f, frozenset(f.enum_type.values_by_number) if f.enum_type is not None else None)
        for f in descriptor.fields
        if f.enum_type is not None or _enum_fields(f.message_type)
    )
    _ENUM_FIELDS[descriptor.full_name] = found
    return found


def _first_unknown(message: Message) -> tuple[str, str, int] | None:
    """(path, enum type, value) of the first enum value outside its type, or None."""
    for f, known in _enum_fields(cast(Descriptor, message.DESCRIPTOR)):
        if known is not None:
            values = getattr(message, f.name) if f.is_repeated else (getattr(message, f.name),)
            for i, value in enumerate(values):
                if value not in known:
                    at = f"{f.name}[{i}]" if f.is_repeated else f.name
                    return at, f.enum_type.full_name if f.enum_type else "", int(value)
        elif f.is_repeated:
            for i, item in enumerate(getattr(message, f.name)):
                inner = _first_unknown(item)
                if inner is not None:
                    return f"{f.name}[{i}].{inner[0]}", inner[1], inner[2]
        elif message.HasField(f.name):
            inner = _first_unknown(getattr(message, f.name))
            if inner is not None:
                return f"{f.name}.{inner[0]}", inner[1], inner[2]
    return None


def check_enums(message: Message, path: str = "") -> None:
    """Refuse a message with an enum value outside its type, wherever it is (the stage of a
    header, the code of an ``Error``, the kind of an unmask share or a download).

    proto3 keeps an unknown value as its number, so it reaches the coordinator intact; this
    names it before anything converts it to a name or a Python enum. ``path`` prefixes the
    field's path in the error.

    Raises:
        UnknownEnumValue: the first such field, by its path (``unmask.shares[2].kind``).
    """
    found = _first_unknown(message)
    if found is not None:
        where, enum, value = found
        raise UnknownEnumValue(f"{path}.{where}" if path else where, enum, value)


class InboxFull(RoundMessageError):  # noqa: N818 (names read as outcomes)
    """More of an agent's messages wait for the round to read them than the coordinator's
    ``stream_limits.inbox_*`` allow: this one is refused unread, so an agent that floods a
    round cannot grow the coordinator's memory (an honest agent has one or two waiting)."""

    grpc_status = "RESOURCE_EXHAUSTED"
    http_status = 429
    code = "inbox_full"


class StaleRound(RoundMessageError):  # noqa: N818 (names read as outcomes)
    """A message of another round or session than the one the job is running."""

    grpc_status = "FAILED_PRECONDITION"
    code = "stale_round"
    error_code = pb.ERROR_STALE_ROUND


class WrongStage(RoundMessageError):  # noqa: N818 (names read as outcomes)
    """A message of another stage than the one being collected."""

    grpc_status = "FAILED_PRECONDITION"
    code = "wrong_stage"
    error_code = pb.ERROR_WRONG_STAGE


class UnknownJob(RoundMessageError):  # noqa: N818 (names read as outcomes)
    """A message naming a job that is not running a round (or does not exist)."""

    grpc_status = "NOT_FOUND"
    code = "unknown_job"
    error_code = pb.ERROR_UNKNOWN_JOB


class DuplicateMessage(RoundMessageError):  # noqa: N818 (names read as outcomes)
    """A second answer where exactly one is allowed."""

    grpc_status = "ALREADY_EXISTS"
    code = "duplicate"
    error_code = pb.ERROR_DUPLICATE


def shown(value: str, limit: int = 64) -> str:
    """``repr(value)``, cut to ``limit`` characters and followed by its length when longer.

    An agent's text quoted in a refusal (a job id, say) must not make the refusal as large as
    the agent's message: the ``Error`` is queued for an agent that may not read it.
    """
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}… ({len(value)} characters)"


def echoed_header(header: pb.RoundHeader) -> pb.RoundHeader:
    """The agent's header as an ``Error`` repeats it: job and session ids longer than any real
    one are left out rather than copied (they name no job, and copying a header of megabytes
    made each refusal twice the size of the refused message)."""
    echoed = pb.RoundHeader(round=header.round, stage=header.stage)
    job_id = header.job_id
    if len(job_id) <= MAX_ECHOED_JOB_ID:
        echoed.job_id = job_id
    session_id = header.session_id
    if len(session_id) <= _MAX_ECHOED_SESSION_ID:
        echoed.session_id = session_id
    return echoed


def error_reply(
    code: pb.ErrorCode, text: str, *, header: pb.RoundHeader | None = None
) -> pb.CoordinatorMessage:
    """An ``Error`` of bounded size: at most :data:`MAX_ERROR_TEXT` characters of text and the
    header as :func:`echoed_header` repeats it."""
    if len(text) > MAX_ERROR_TEXT:
        text = f"{text[: MAX_ERROR_TEXT - 30]}… ({len(text)} characters)"
    error = pb.Error(code=code, message=text)
    if header is not None:
        error.header.CopyFrom(echoed_header(header))
    return pb.CoordinatorMessage(error=error)


def error_message(
    exc: BaseException, *, header: pb.RoundHeader | None = None
) -> pb.CoordinatorMessage:
    """The ``Error`` the coordinator sends on a stream for a refused message (bounded in size,
    :func:`error_reply`)."""
    if isinstance(exc, RoundMessageError):
        code = exc.error_code
    elif isinstance(exc, InvalidCredential):
        code = pb.ERROR_UNAUTHENTICATED
    elif isinstance(exc, InvalidInput):
        code = pb.ERROR_INVALID_ARGUMENT
    else:
        code = pb.ERROR_INTERNAL
    text = str(exc) if isinstance(exc, ServerError) else f"internal error ({type(exc).__name__})"
    return error_reply(code, text, header=header)


def check_round_header(
    header: pb.RoundHeader,
    *,
    job_id: str,
    round_number: int,
    stage: pb.Stage,
    session_id: bytes,
) -> None:
    """Refuse a header that is not the expected (job, round, stage, session).

    Raises:
        UnknownJob: another job.
        StaleRound: another round or session.
        WrongStage: another stage.
    """
    if header.job_id != job_id:
        raise UnknownJob(f"job {shown(header.job_id)} is not running a round")
    if header.round != round_number or bytes(header.session_id) != session_id:
        raise StaleRound(
            f"round {header.round} of job {job_id!r} is not the current one ({round_number})"
            if header.round != round_number
            else f"round {round_number} of job {job_id!r}: wrong session id"
        )
    if header.stage != stage:
        raise WrongStage(
            f"a {_stage_name(header.stage)} message during {_stage_name(stage)} of round "
            f"{round_number} of job {job_id!r}"
        )


def _stage_name(stage: int) -> str:
    return enum_name(pb.Stage.DESCRIPTOR, stage)


# -- authentication and enrolment ----------------------------------------------------------------

#: An RPC's metadata: (key, value) pairs, binary values (keys ending in ``-bin``) as bytes.
Metadata: TypeAlias = Iterable[tuple[str, str | bytes]]


def _metadata_value(metadata: Metadata, key: str) -> str | None:
    found = None
    for k, v in metadata:
        if k.lower() == key:
            if found is not None:
                raise InvalidCredential(f"metadata {key!r} given twice")
            found = v.decode("utf-8", "replace") if isinstance(v, bytes) else v
    return found


def authenticate(
    store: Store,
    metadata: Metadata | None,
    *,
    certificate_cn: str | None = None,
) -> Agent:
    """The agent an RPC's metadata (``x-dpfl-agent-id``, ``authorization: Bearer …``) proves.

    Args:
        store: the coordinator's store.
        metadata: the RPC's metadata.
        certificate_cn: the common name of the client certificate the transport verified
            (mutual TLS; ``""`` for a certificate without one), None when the connection
            presented no certificate (TLS without client certificates, in-process links).

    Raises:
        InvalidCredential: missing, malformed or forged id or credential, or a disabled agent
            (one message for all); or, with a verified client certificate, an agent bound to
            another certificate name.
    """
    agent_id, credential = credentials(metadata)
    agent = store.authenticate_agent(agent_id, credential)
    check_certificate_binding(agent, certificate_cn)
    return agent


def authenticate_member(
    store: Store,
    metadata: Metadata | None,
    *,
    certificate_cn: str | None = None,
) -> tuple[Agent, frozenset[str]]:
    """:func:`authenticate` and the ids of the agent's jobs, read in one transaction (what a
    download needs: pass the jobs to :func:`download`).

    Raises:
        InvalidCredential: as :func:`authenticate`.
    """
    agent_id, credential = credentials(metadata)
    agent, jobs = store.authenticate_member(agent_id, credential)
    check_certificate_binding(agent, certificate_cn)
    return agent, jobs


def credentials(metadata: Metadata | None) -> tuple[str, str]:
    """(agent id, credential) from an RPC's metadata, checked for form only."""
    pairs = list(metadata or ())
    agent_id = _metadata_value(pairs, AGENT_ID_HEADER)
    auth = _metadata_value(pairs, AUTHORIZATION_HEADER)
    if not agent_id or not auth:
        raise InvalidCredential(
            f"missing {AGENT_ID_HEADER!r} or {AUTHORIZATION_HEADER!r} metadata (enrol first)"
        )
    scheme, _, credential = auth.partition(" ")
    if scheme.lower() != "bearer" or not credential or len(credential) > _MAX_TOKEN:
        raise InvalidCredential("authorization metadata must be 'Bearer <credential>'")
    if len(agent_id) > _MAX_NAME:
        raise InvalidCredential(_UNAUTHENTICATED)
    return agent_id, credential.strip()


def check_certificate_binding(agent: Agent, certificate_cn: str | None) -> None:
    """Refuse a connection whose client certificate is not the one ``agent`` enrolled with.

    Checked only when the connection presented a verified certificate: a coordinator that does
    not require client certificates authenticates every agent by its credential alone (the
    operator's choice; gRPC either requires and verifies client certificates or does not ask
    for any, so an attacker cannot skip the certificate on a mutual-TLS coordinator).

    Raises:
        InvalidCredential: the agent is bound to another common name.
    """
    if certificate_cn is None or agent.certificate_cn is None:
        return
    if not hmac.compare_digest(certificate_cn.encode(), agent.certificate_cn.encode()):
        raise InvalidCredential(
            f"the client certificate (CN {certificate_cn!r}) is not the one agent {agent.id} "
            "enrolled with; each agent must keep using its own certificate"
        )


def default_budget(settings: Settings) -> Budget | None:
    """The budget of an agent enrolled with a token that carries none."""
    if settings.default_budget_epsilon is None:
        return None
    return Budget(settings.default_budget_epsilon, settings.default_budget_delta)


def enroll(
    store: Store,
    settings: Settings,
    request: pb.EnrollRequest,
    *,
    coordinator_id: str,
    certificate_cn: str | None = None,
) -> pb.EnrollResponse:
    """Redeem a one-time enrollment token for an agent id, its credential and its API token.

    With a verified client certificate (``certificate_cn``, see :func:`authenticate`), the
    agent is bound to its common name for good.

    Raises:
        InvalidCredential: an unknown, expired or used token; a client certificate without a
            common name.
        InvalidInput: an empty or overlong name, bad labels, a character no name may hold
            (``dpfl.server.store.core.text_problem``), each named with its field.
    """
    token = request.enrollment_token
    if not token or len(token) > _MAX_TOKEN:
        raise InvalidCredential("unknown enrollment token")
    name = request.name.strip()
    if not name:
        raise InvalidInput("enrol request: name must not be empty")
    name = check_name(name, "enrol request: name")
    labels = check_labels(dict(request.labels), "enrol request: label")
    if certificate_cn is not None and not certificate_cn.strip():
        raise InvalidCredential(
            "the client certificate has no common name, so it cannot identify an agent "
            "(issue one with 'dpfl-coordinator certs agent NAME')"
        )
    enrolment = store.redeem_enrollment_token(
        token,
        name=name,
        labels=labels,
        default_budget=default_budget(settings),
        certificate_cn=certificate_cn,
    )
    return pb.EnrollResponse(
        agent_id=enrolment.agent.id,
        credential=enrolment.credential,
        coordinator_id=coordinator_id,
        api_token=enrolment.api_token,
    )


# -- downloads -----------------------------------------------------------------------------------


class BlobSource(Protocol):
    """Where the public query sets of running voting jobs come from, and where recently served
    model versions are kept (the orchestrator)."""

    def public_data(self, job_id: str) -> bytes | None:
        """The ``.npy`` bytes of the job's public query set, or None when it has none."""
        ...

    def cached_model(self, job_id: str, version: int) -> bytes | None:
        """A model version's bytes kept from an earlier download, or None."""
        ...

    def cache_model(self, job_id: str, version: int, data: bytes) -> None:
        """Keep a model version's bytes for the next downloads (versions never change)."""
        ...


def download(
    store: Store,
    agent: Agent,
    request: pb.DownloadRequest,
    *,
    blobs: BlobSource | None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    jobs: Collection[str] | None = None,
) -> Iterator[pb.DownloadChunk]:
    """The chunks of a model version or public data blob, for a member of the job.

    The blob is fetched before the first chunk is produced, so every error surfaces on the
    first ``next()``, before anything was streamed. ``jobs``: the agent's job ids when already
    read (:func:`authenticate_member`); default: read them here.

    Raises:
        InvalidInput: no job id, an unknown blob kind, a model version over 2**31 - 1 (what
            the store's version column holds, as on the REST API).
        NotFound: no such job, not a member of it, no such version or no public data.
    """
    if not request.job_id or len(request.job_id) > _MAX_NAME:
        raise InvalidInput("download request: job_id is missing")
    try:
        check_enums(request)
    except UnknownEnumValue as exc:
        _log.warning("agent %s: download request: %s", agent.id, exc)
        raise InvalidInput(f"download request: {exc}") from None
    if request.kind not in (pb.BLOB_MODEL, pb.BLOB_PUBLIC_DATA):
        raise InvalidInput(
            "download request: kind must be BLOB_MODEL or BLOB_PUBLIC_DATA, not "
            + enum_name(pb.BlobKind.DESCRIPTOR, request.kind)
        )
    if request.kind == pb.BLOB_MODEL and request.version > MAX_INT:
        raise InvalidInput(
            f"download request: version must be at most {MAX_INT}, got {request.version}"
        )
    # the agent's own memberships (a few rows), not the job's population: every member
    # downloads every round, so a population-sized check would cost O(N²) rows per round
    try:
        member = request.job_id in (store.agent_jobs(agent.id) if jobs is None else jobs)
    except NotFound:
        member = False
    if not member:
        raise NotFound(f"job {request.job_id!r} not found")
    if request.kind == pb.BLOB_MODEL:
        # every member fetches the same version each round: read it from the store once
        version = int(request.version)
        cached = blobs.cached_model(request.job_id, version) if blobs is not None else None
        if cached is None:
            cached = store.get_model_version(request.job_id, version).data or b""
            if blobs is not None:
                blobs.cache_model(request.job_id, version, cached)
        data, media = cached, MODEL_MEDIA_TYPE
    else:
        blob = blobs.public_data(request.job_id) if blobs is not None else None
        if blob is None:
            raise NotFound(f"job {request.job_id!r} has no public data")
        data, media = blob, PUBLIC_DATA_MEDIA_TYPE
    return chunk_blob(data, media_type=media, chunk_bytes=chunk_bytes)


def serve_download(
    store: Store,
    metadata: Metadata | None,
    request: pb.DownloadRequest,
    *,
    blobs: BlobSource | None,
    live: Agent | None,
    invited: bool,
    certificate_cn: str | None = None,
) -> list[pb.DownloadChunk]:
    """A download as every transport serves it (blocking: run it on a worker thread).

    ``live``: the agent whose open, authenticated stream carries the credential in ``metadata``
    (``SessionRegistry.verified_agent``), trusted as that stream is, since evicting the agent
    closes both; None authenticates against the store. ``invited``: ``live`` is an invitee of the
    job's running round, and so a member for this download without reading its memberships.

    Raises:
        InvalidCredential, InvalidInput, NotFound: as :func:`authenticate_member` and
            :func:`download`.
    """
    jobs: frozenset[str] | None = None
    if live is not None:
        agent = live
        check_certificate_binding(agent, certificate_cn)
        if invited:
            jobs = frozenset({request.job_id})
    else:
        agent, jobs = authenticate_member(store, metadata, certificate_cn=certificate_cn)
    return list(download(store, agent, request, blobs=blobs, jobs=jobs))


def chunk_blob(data: bytes, *, media_type: str, chunk_bytes: int) -> Iterator[pb.DownloadChunk]:
    """Split ``data`` into chunks; the last carries the SHA-256 of the whole blob."""
    if chunk_bytes < 1:
        raise InvalidInput(f"chunk size must be >= 1, got {chunk_bytes}")
    digest = hashlib.sha256(data).digest()
    total = len(data)

    def chunks() -> Iterator[pb.DownloadChunk]:
        offset = 0
        while True:
            piece = data[offset : offset + chunk_bytes]
            last = offset + len(piece) >= total
            yield pb.DownloadChunk(
                offset=offset,
                total_size=total,
                data=piece,
                sha256=digest if last else b"",
                media_type=media_type,
            )
            offset += len(piece)
            if last:
                return

    return chunks()


# -- jobs ----------------------------------------------------------------------------------------


def submit(
    store: Store,
    document: str | bytes | Mapping[str, object],
    *,
    members: Sequence[str] = (),
    job_id: str | None = None,
) -> Job:
    """Validate and store a job (the function behind the CLI and the REST create).

    Without ``members`` the job's population is filled at its start with every active agent.

    Raises:
        JobSpecError: an invalid document (nothing is written).
        NotFound: a member agent does not exist.
    """
    return submit_job(store, document, members=members, job_id=job_id)
