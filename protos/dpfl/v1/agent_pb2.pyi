from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Stage(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STAGE_UNSPECIFIED: _ClassVar[Stage]
    STAGE_INVITATION: _ClassVar[Stage]
    STAGE_ADVERTISE_KEYS: _ClassVar[Stage]
    STAGE_SHARE_KEYS: _ClassVar[Stage]
    STAGE_MASKED_INPUT: _ClassVar[Stage]
    STAGE_UNMASK: _ClassVar[Stage]
    STAGE_RESULT: _ClassVar[Stage]
    STAGE_CONSISTENCY: _ClassVar[Stage]

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_UNSPECIFIED: _ClassVar[ErrorCode]
    ERROR_INVALID_ARGUMENT: _ClassVar[ErrorCode]
    ERROR_STALE_ROUND: _ClassVar[ErrorCode]
    ERROR_WRONG_STAGE: _ClassVar[ErrorCode]
    ERROR_UNKNOWN_JOB: _ClassVar[ErrorCode]
    ERROR_UNAUTHENTICATED: _ClassVar[ErrorCode]
    ERROR_BUDGET_EXCEEDED: _ClassVar[ErrorCode]
    ERROR_POLICY_DECLINED: _ClassVar[ErrorCode]
    ERROR_PROTOCOL_ABORT: _ClassVar[ErrorCode]
    ERROR_INTERNAL: _ClassVar[ErrorCode]
    ERROR_DUPLICATE: _ClassVar[ErrorCode]

class BlobKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BLOB_UNSPECIFIED: _ClassVar[BlobKind]
    BLOB_MODEL: _ClassVar[BlobKind]
    BLOB_PUBLIC_DATA: _ClassVar[BlobKind]

class ShareKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SHARE_UNSPECIFIED: _ClassVar[ShareKind]
    SHARE_SELF_MASK_SEED: _ClassVar[ShareKind]
    SHARE_MASKING_KEY: _ClassVar[ShareKind]
STAGE_UNSPECIFIED: Stage
STAGE_INVITATION: Stage
STAGE_ADVERTISE_KEYS: Stage
STAGE_SHARE_KEYS: Stage
STAGE_MASKED_INPUT: Stage
STAGE_UNMASK: Stage
STAGE_RESULT: Stage
STAGE_CONSISTENCY: Stage
ERROR_UNSPECIFIED: ErrorCode
ERROR_INVALID_ARGUMENT: ErrorCode
ERROR_STALE_ROUND: ErrorCode
ERROR_WRONG_STAGE: ErrorCode
ERROR_UNKNOWN_JOB: ErrorCode
ERROR_UNAUTHENTICATED: ErrorCode
ERROR_BUDGET_EXCEEDED: ErrorCode
ERROR_POLICY_DECLINED: ErrorCode
ERROR_PROTOCOL_ABORT: ErrorCode
ERROR_INTERNAL: ErrorCode
ERROR_DUPLICATE: ErrorCode
BLOB_UNSPECIFIED: BlobKind
BLOB_MODEL: BlobKind
BLOB_PUBLIC_DATA: BlobKind
SHARE_UNSPECIFIED: ShareKind
SHARE_SELF_MASK_SEED: ShareKind
SHARE_MASKING_KEY: ShareKind

class RoundHeader(_message.Message):
    __slots__ = ("job_id", "round", "stage", "session_id")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    round: int
    stage: Stage
    session_id: bytes
    def __init__(self, job_id: _Optional[str] = ..., round: _Optional[int] = ..., stage: _Optional[_Union[Stage, str]] = ..., session_id: _Optional[bytes] = ...) -> None: ...

class PackedVector(_message.Message):
    __slots__ = ("bit_width", "length", "data", "offset", "total_length")
    BIT_WIDTH_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TOTAL_LENGTH_FIELD_NUMBER: _ClassVar[int]
    bit_width: int
    length: int
    data: bytes
    offset: int
    total_length: int
    def __init__(self, bit_width: _Optional[int] = ..., length: _Optional[int] = ..., data: _Optional[bytes] = ..., offset: _Optional[int] = ..., total_length: _Optional[int] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("header", "code", "message")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    header: RoundHeader
    code: ErrorCode
    message: str
    def __init__(self, header: _Optional[_Union[RoundHeader, _Mapping]] = ..., code: _Optional[_Union[ErrorCode, str]] = ..., message: _Optional[str] = ...) -> None: ...

class EnrollRequest(_message.Message):
    __slots__ = ("enrollment_token", "name", "agent_version", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ENROLLMENT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    enrollment_token: str
    name: str
    agent_version: str
    labels: _containers.ScalarMap[str, str]
    def __init__(self, enrollment_token: _Optional[str] = ..., name: _Optional[str] = ..., agent_version: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class EnrollResponse(_message.Message):
    __slots__ = ("agent_id", "credential", "coordinator_id", "api_token")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_ID_FIELD_NUMBER: _ClassVar[int]
    API_TOKEN_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    credential: str
    coordinator_id: str
    api_token: str
    def __init__(self, agent_id: _Optional[str] = ..., credential: _Optional[str] = ..., coordinator_id: _Optional[str] = ..., api_token: _Optional[str] = ...) -> None: ...

class DownloadRequest(_message.Message):
    __slots__ = ("job_id", "kind", "version")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    kind: BlobKind
    version: int
    def __init__(self, job_id: _Optional[str] = ..., kind: _Optional[_Union[BlobKind, str]] = ..., version: _Optional[int] = ...) -> None: ...

class DownloadChunk(_message.Message):
    __slots__ = ("offset", "total_size", "data", "sha256", "media_type")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    MEDIA_TYPE_FIELD_NUMBER: _ClassVar[int]
    offset: int
    total_size: int
    data: bytes
    sha256: bytes
    media_type: str
    def __init__(self, offset: _Optional[int] = ..., total_size: _Optional[int] = ..., data: _Optional[bytes] = ..., sha256: _Optional[bytes] = ..., media_type: _Optional[str] = ...) -> None: ...

class Invitation(_message.Message):
    __slots__ = ("header", "algorithm", "job_name", "params_json", "privacy_events_json", "model_version", "deadline_unix", "expected_participants")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    JOB_NAME_FIELD_NUMBER: _ClassVar[int]
    PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    PRIVACY_EVENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_PARTICIPANTS_FIELD_NUMBER: _ClassVar[int]
    header: RoundHeader
    algorithm: str
    job_name: str
    params_json: str
    privacy_events_json: str
    model_version: int
    deadline_unix: float
    expected_participants: int
    def __init__(self, header: _Optional[_Union[RoundHeader, _Mapping]] = ..., algorithm: _Optional[str] = ..., job_name: _Optional[str] = ..., params_json: _Optional[str] = ..., privacy_events_json: _Optional[str] = ..., model_version: _Optional[int] = ..., deadline_unix: _Optional[float] = ..., expected_participants: _Optional[int] = ...) -> None: ...

class SecAggSetup(_message.Message):
    __slots__ = ("client_index", "num_clients", "degree", "threshold", "ring_bits", "vector_length", "min_survivors", "encoding_json", "session_nonce", "threat_model")
    CLIENT_INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_CLIENTS_FIELD_NUMBER: _ClassVar[int]
    DEGREE_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    RING_BITS_FIELD_NUMBER: _ClassVar[int]
    VECTOR_LENGTH_FIELD_NUMBER: _ClassVar[int]
    MIN_SURVIVORS_FIELD_NUMBER: _ClassVar[int]
    ENCODING_JSON_FIELD_NUMBER: _ClassVar[int]
    SESSION_NONCE_FIELD_NUMBER: _ClassVar[int]
    THREAT_MODEL_FIELD_NUMBER: _ClassVar[int]
    client_index: int
    num_clients: int
    degree: int
    threshold: int
    ring_bits: int
    vector_length: int
    min_survivors: int
    encoding_json: str
    session_nonce: bytes
    threat_model: str
    def __init__(self, client_index: _Optional[int] = ..., num_clients: _Optional[int] = ..., degree: _Optional[int] = ..., threshold: _Optional[int] = ..., ring_bits: _Optional[int] = ..., vector_length: _Optional[int] = ..., min_survivors: _Optional[int] = ..., encoding_json: _Optional[str] = ..., session_nonce: _Optional[bytes] = ..., threat_model: _Optional[str] = ...) -> None: ...

class AdvertiseKeysRequest(_message.Message):
    __slots__ = ("header", "setup")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SETUP_FIELD_NUMBER: _ClassVar[int]
    header: RoundHeader
    setup: SecAggSetup
    def __init__(self, header: _Optional[_Union[RoundHeader, _Mapping]] = ..., setup: _Optional[_Union[SecAggSetup, _Mapping]] = ...) -> None: ...

class PeerKeys(_message.Message):
    __slots__ = ("index", "encryption_public_key", "masking_public_key", "signature", "certificate")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ENCRYPTION_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    MASKING_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    index: int
    encryption_public_key: bytes
    masking_public_key: bytes
    signature: bytes
    certificate: bytes
    def __init__(self, index: _Optional[int] = ..., encryption_public_key: _Optional[bytes] = ..., masking_public_key: _Optional[bytes] = ..., signature: _Optional[bytes] = ..., certificate: _Optional[bytes] = ...) -> None: ...

class RosterEntry(_message.Message):
    __slots__ = ("index", "digest")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    index: int
    digest: bytes
    def __init__(self, index: _Optional[int] = ..., digest: _Optional[bytes] = ...) -> None: ...

class ShareKeysRequest(_message.Message):
    __slots__ = ("header", "peers", "roster")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    ROSTER_FIELD_NUMBER: _ClassVar[int]
    header: RoundHeader
    peers: _containers.RepeatedCompositeFieldContainer[PeerKeys]
    roster: _containers.RepeatedCompositeFieldContainer[RosterEntry]
    def __init__(self, header: _Optional[_Union[RoundHeader, _Mapping]] = ..., peers: _Optional[_Iterable[_Union[PeerKeys, _Mapping]]] = ..., roster: _Optional[_Iterable[_Union[RosterEntry, _Mapping]]] = ...) -> None: ...

class EncryptedShare(_message.Message):
    __slots__ = ("sender", "receiver", "ciphertext")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    RECEIVER_FIELD_NUMBER: _ClassVar[int]
    CIPHERTEXT_FIELD_NUMBER: _ClassVar[int]
    sender: int
    receiver: int
    ciphertext: bytes
    def __init__(self, sender: _Optional[int] = ..., receiver: _Optional[int] = ..., ciphertext: _Optional[bytes] = ...) -> None: ...

class MaskedInputRequest(_message.Message):
    __slots__ = ("header", "shares")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SHARES_FIELD_NUMBER: _ClassVar[int]
    header: RoundHeader
    shares: _containers.RepeatedCompositeFieldContainer[EncryptedShare]
    def __init__(self, header: _Optional[_Union[RoundHeader, _Mapping]] = ..., shares: _Optional[_Iterable[_Union[EncryptedShare, _Mapping]]] = ...) -> None: ...

class ConsistencyRequest(_message.Message):
    __slots__ = ("header", "survivors")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SURVIVORS_FIELD_NUMBER: _ClassVar[int]
    header: RoundHeader
    survivors: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, header: _Optional[_Union[RoundHeader, _Mapping]] = ..., survivors: _Optional[_Iterable[int]] = ...) -> None: ...

class Attestation(_message.Message):
    __slots__ = ("index", "signature")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    index: int
    signature: bytes
    def __init__(self, index: _Optional[int] = ..., signature: _Optional[bytes] = ...) -> None: ...

class UnmaskRequest(_message.Message):
    __slots__ = ("header", "alive", "dropped", "survivors", "attestations")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    SURVIVORS_FIELD_NUMBER: _ClassVar[int]
    ATTESTATIONS_FIELD_NUMBER: _ClassVar[int]
    header: RoundHeader
    alive: _containers.RepeatedScalarFieldContainer[int]
    dropped: _containers.RepeatedScalarFieldContainer[int]
    survivors: _containers.RepeatedScalarFieldContainer[int]
    attestations: _containers.RepeatedCompositeFieldContainer[Attestation]
    def __init__(self, header: _Optional[_Union[RoundHeader, _Mapping]] = ..., alive: _Optional[_Iterable[int]] = ..., dropped: _Optional[_Iterable[int]] = ..., survivors: _Optional[_Iterable[int]] = ..., attestations: _Optional[_Iterable[_Union[Attestation, _Mapping]]] = ...) -> None: ...

class RoundResult(_message.Message):
    __slots__ = ("header", "completed", "message", "model_version")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    header: RoundHeader
    completed: bool
    message: str
    model_version: int
    def __init__(self, header: _Optional[_Union[RoundHeader, _Mapping]] = ..., completed: _Optional[bool] = ..., message: _Optional[str] = ..., model_version: _Optional[int] = ...) -> None: ...

class CoordinatorMessage(_message.Message):
    __slots__ = ("invitation", "advertise_keys", "share_keys", "masked_input", "unmask", "result", "error", "ping", "consistency")
    INVITATION_FIELD_NUMBER: _ClassVar[int]
    ADVERTISE_KEYS_FIELD_NUMBER: _ClassVar[int]
    SHARE_KEYS_FIELD_NUMBER: _ClassVar[int]
    MASKED_INPUT_FIELD_NUMBER: _ClassVar[int]
    UNMASK_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PING_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_FIELD_NUMBER: _ClassVar[int]
    invitation: Invitation
    advertise_keys: AdvertiseKeysRequest
    share_keys: ShareKeysRequest
    masked_input: MaskedInputRequest
    unmask: UnmaskRequest
    result: RoundResult
    error: Error
    ping: Ping
    consistency: ConsistencyRequest
    def __init__(self, invitation: _Optional[_Union[Invitation, _Mapping]] = ..., advertise_keys: _Optional[_Union[AdvertiseKeysRequest, _Mapping]] = ..., share_keys: _Optional[_Union[ShareKeysRequest, _Mapping]] = ..., masked_input: _Optional[_Union[MaskedInputRequest, _Mapping]] = ..., unmask: _Optional[_Union[UnmaskRequest, _Mapping]] = ..., result: _Optional[_Union[RoundResult, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., ping: _Optional[_Union[Ping, _Mapping]] = ..., consistency: _Optional[_Union[ConsistencyRequest, _Mapping]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("agent_id", "agent_version", "device", "algorithms")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    ALGORITHMS_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    agent_version: str
    device: str
    algorithms: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, agent_id: _Optional[str] = ..., agent_version: _Optional[str] = ..., device: _Optional[str] = ..., algorithms: _Optional[_Iterable[str]] = ...) -> None: ...

class InvitationResponse(_message.Message):
    __slots__ = ("header", "accept", "reason")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    header: RoundHeader
    accept: bool
    reason: str
    def __init__(self, header: _Optional[_Union[RoundHeader, _Mapping]] = ..., accept: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class AdvertiseKeysResponse(_message.Message):
    __slots__ = ("header", "encryption_public_key", "masking_public_key", "signature", "certificate")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ENCRYPTION_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    MASKING_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    header: RoundHeader
    encryption_public_key: bytes
    masking_public_key: bytes
    signature: bytes
    certificate: bytes
    def __init__(self, header: _Optional[_Union[RoundHeader, _Mapping]] = ..., encryption_public_key: _Optional[bytes] = ..., masking_public_key: _Optional[bytes] = ..., signature: _Optional[bytes] = ..., certificate: _Optional[bytes] = ...) -> None: ...

class ConsistencyResponse(_message.Message):
    __slots__ = ("header", "signature")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    header: RoundHeader
    signature: bytes
    def __init__(self, header: _Optional[_Union[RoundHeader, _Mapping]] = ..., signature: _Optional[bytes] = ...) -> None: ...

class ShareKeysResponse(_message.Message):
    __slots__ = ("header", "shares")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SHARES_FIELD_NUMBER: _ClassVar[int]
    header: RoundHeader
    shares: _containers.RepeatedCompositeFieldContainer[EncryptedShare]
    def __init__(self, header: _Optional[_Union[RoundHeader, _Mapping]] = ..., shares: _Optional[_Iterable[_Union[EncryptedShare, _Mapping]]] = ...) -> None: ...

class MaskedInputResponse(_message.Message):
    __slots__ = ("header", "masked_input")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    MASKED_INPUT_FIELD_NUMBER: _ClassVar[int]
    header: RoundHeader
    masked_input: PackedVector
    def __init__(self, header: _Optional[_Union[RoundHeader, _Mapping]] = ..., masked_input: _Optional[_Union[PackedVector, _Mapping]] = ...) -> None: ...

class UnmaskShare(_message.Message):
    __slots__ = ("owner", "kind", "share")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    owner: int
    kind: ShareKind
    share: bytes
    def __init__(self, owner: _Optional[int] = ..., kind: _Optional[_Union[ShareKind, str]] = ..., share: _Optional[bytes] = ...) -> None: ...

class UnmaskResponse(_message.Message):
    __slots__ = ("header", "shares")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SHARES_FIELD_NUMBER: _ClassVar[int]
    header: RoundHeader
    shares: _containers.RepeatedCompositeFieldContainer[UnmaskShare]
    def __init__(self, header: _Optional[_Union[RoundHeader, _Mapping]] = ..., shares: _Optional[_Iterable[_Union[UnmaskShare, _Mapping]]] = ...) -> None: ...

class Ping(_message.Message):
    __slots__ = ("sent_unix",)
    SENT_UNIX_FIELD_NUMBER: _ClassVar[int]
    sent_unix: float
    def __init__(self, sent_unix: _Optional[float] = ...) -> None: ...

class AgentMessage(_message.Message):
    __slots__ = ("hello", "invitation_response", "advertise_keys", "share_keys", "masked_input", "unmask", "error", "pong", "consistency")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    INVITATION_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ADVERTISE_KEYS_FIELD_NUMBER: _ClassVar[int]
    SHARE_KEYS_FIELD_NUMBER: _ClassVar[int]
    MASKED_INPUT_FIELD_NUMBER: _ClassVar[int]
    UNMASK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PONG_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    invitation_response: InvitationResponse
    advertise_keys: AdvertiseKeysResponse
    share_keys: ShareKeysResponse
    masked_input: MaskedInputResponse
    unmask: UnmaskResponse
    error: Error
    pong: Ping
    consistency: ConsistencyResponse
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., invitation_response: _Optional[_Union[InvitationResponse, _Mapping]] = ..., advertise_keys: _Optional[_Union[AdvertiseKeysResponse, _Mapping]] = ..., share_keys: _Optional[_Union[ShareKeysResponse, _Mapping]] = ..., masked_input: _Optional[_Union[MaskedInputResponse, _Mapping]] = ..., unmask: _Optional[_Union[UnmaskResponse, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., pong: _Optional[_Union[Ping, _Mapping]] = ..., consistency: _Optional[_Union[ConsistencyResponse, _Mapping]] = ...) -> None: ...
