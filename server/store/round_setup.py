"""What a round attempt stores about itself (column ``rounds.noise``): :class:`RoundSetup`.

The plan, state and sample a restart resumes from, and what operators and auditors read back
(declines, the summation). Read and written only through this typed, versioned model, so that
a record this coordinator cannot read is refused naming the round and the field. Only the
fields an attempt set are stored (``exclude_unset``): a record reads back as written. A change
of shape takes a new version and a migration of the rows (0005 added the version).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, JsonValue, ValidationError

from dpfl.server.errors import LedgerIntegrityError

__all__ = ["ROUND_SETUP_VERSION", "EncodingRecord", "PlanRecord", "RoundSetup", "SecAggRecord"]

#: The version of :class:`RoundSetup` this code writes and reads.
ROUND_SETUP_VERSION: Final = 1

#: A JSON number kept as written (an integer stays an integer).
Number = int | float


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PlanRecord(_Record):
    """``JobPlan.to_json``; ``details`` are validated by the algorithm's ``parse_plan``."""

    noise_multiplier: Number
    calibration: dict[str, JsonValue]
    population: int
    details: dict[str, JsonValue]


class StateRecord(_Record):
    """The coordinator state before the round: its model as a version, its blobs in base64."""

    model_version: int | None
    details: dict[str, JsonValue]
    blobs: dict[str, str]


class NoiseShareRecord(_Record):
    kind: str
    parameter: Number


class EncodingRecord(_Record):
    """``EncodingConfig.to_dict``: how the agents encode their vectors, and their noise."""

    clip: Number
    scale_bits: int
    ring_bits: int
    noise: NoiseShareRecord
    rounding_beta: Number


class SecAggRecord(_Record):
    """The summation's parameters: ``enabled`` False and only the count and ring width for a
    plain sum; the Bell et al. parameters and the threat model for secure aggregation."""

    enabled: bool | None = None
    num_clients: int
    ring_bits: int
    degree: int | None = None
    threshold: int | None = None
    vector_length: int | None = None
    min_survivors: int | None = None
    threat_model: str | None = None


class RoundSetup(_Record):
    """One attempt's stored record (``Round.setup``): ``population`` the attempt's size, less
    the ``excluded_over_budget``; ``sample``, drawn from ``sample_population``, kept until an
    attempt commits; ``declined`` each decliner's reason; ``restored_noise_shares`` dropouts'
    noise carried by the release; ``audit`` an attempt of a privacy audit."""

    version: Literal[1]
    plan: PlanRecord | None = None
    state: StateRecord | None = None
    population: int | None = None
    excluded_over_budget: list[str] | None = None
    sample: list[str] | None = None
    sample_population: list[str] | None = None
    sample_kept: bool | None = None
    declined: dict[str, str] | None = None
    encoding: EncodingRecord | None = None
    secagg: SecAggRecord | None = None
    noise_alone: bool | None = None
    restored_noise_shares: int | None = None
    audit: bool | None = None

    @classmethod
    def empty(cls) -> RoundSetup:
        return cls(version=ROUND_SETUP_VERSION)

    @classmethod
    def from_stored(cls, data: object, *, where: str) -> RoundSetup:
        """A stored record, validated. Raises LedgerIntegrityError: not a record of
        :data:`ROUND_SETUP_VERSION`, naming ``where`` (the round) and the field at fault."""
        if not isinstance(data, Mapping):
            raise LedgerIntegrityError(
                f"the stored record of {where} is not an object: {type(data).__name__}"
            )
        if data.get("version") != ROUND_SETUP_VERSION:
            raise LedgerIntegrityError(
                f"the stored record of {where} has version {data.get('version')!r}; this "
                f"coordinator reads version {ROUND_SETUP_VERSION} (run the store's migrations)"
            )
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            error = exc.errors()[0]
            field = ".".join(str(part) for part in error["loc"])
            raise LedgerIntegrityError(
                f"the stored record of {where} is malformed at {field!r}: {error['msg']}"
            ) from None

    def to_json(self) -> dict[str, JsonValue]:
        """The stored form: the fields this record set, and its version."""
        return {**self.document(), "version": self.version}

    def document(self) -> dict[str, JsonValue]:
        """The REST API's ``noise`` object of a round: the stored form without its version."""
        data: dict[str, JsonValue] = self.model_dump(mode="json", exclude_unset=True)
        data.pop("version", None)
        return data

    def kept_sample(self) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
        """The draw and the population it came from, or None when the attempt kept none."""
        if self.sample is None or self.sample_population is None:
            return None
        return tuple(self.sample), tuple(self.sample_population)
