"""What a round attempt stores about itself: :class:`RoundSetup`, typed and versioned.

Every attempt keeps, in the ``rounds.noise`` column, what a restarted coordinator needs to redo
it (the job's plan, the state before the round, the sample it drew) and what operators and
auditors read back (declines, the summation's encoding and secure-aggregation parameters). The
column is read and written only through this model, so that a stored record that is not one of
these (an unknown version, a missing or misspelt field) is refused with the round and the field
named instead of surfacing later as a missing key. Migration 0005 gave the stored rows their
``version``; a change of shape takes a new version and a migration of the rows.

Only the fields an attempt set are stored (``exclude_unset``), so a record reads back as the
same JSON object it was written from.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, JsonValue, ValidationError

from dpfl.server.errors import LedgerIntegrityError

__all__ = [
    "ROUND_SETUP_VERSION",
    "EncodingRecord",
    "NoiseShareRecord",
    "PlanRecord",
    "RoundSetup",
    "SecAggRecord",
    "StateRecord",
]

#: The version of :class:`RoundSetup` this code writes and reads.
ROUND_SETUP_VERSION: Final = 1

#: A JSON number kept as written (an integer stays an integer).
Number = int | float


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PlanRecord(_Record):
    """The job's plan (``JobPlan.to_json``); ``details`` are the algorithm's, validated by its
    ``parse_plan`` when the plan is used."""

    noise_multiplier: Number
    calibration: dict[str, JsonValue]
    population: int
    details: dict[str, JsonValue]


class StateRecord(_Record):
    """The coordinator state before the round, without its model bytes (kept as the store's
    ``model_version``); ``blobs`` base64-encoded."""

    model_version: int | None
    details: dict[str, JsonValue]
    blobs: dict[str, str]


class NoiseShareRecord(_Record):
    """The integer noise each carrier of the sum adds (``NoiseSpec.to_dict``)."""

    kind: str
    parameter: Number


class EncodingRecord(_Record):
    """How the agents encode their vectors into the ring (``EncodingConfig.to_dict``)."""

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
    """One attempt's stored record (``Round.setup``).

    Attributes:
        version: :data:`ROUND_SETUP_VERSION`.
        plan, state: the job's plan and the state before the round (what a restart resumes from).
        population: the size of the population the sample was drawn from.
        excluded_over_budget: the clients left out of it, their budgets spent.
        sample, sample_population, sample_kept: the round's draw, the population it was drawn
            from, and whether it is an earlier attempt's (a round keeps its sample until one
            attempt commits).
        declined: each decliner's reason, by agent id.
        encoding, secagg, noise_alone: the summation's setup.
        restored_noise_shares: dropouts' noise shares the release carries (secure aggregation).
        audit: an attempt of a privacy audit, not of a job's training.
    """

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
        """The record of an attempt that stored nothing yet."""
        return cls(version=ROUND_SETUP_VERSION)

    @classmethod
    def from_stored(cls, data: object, *, where: str) -> RoundSetup:
        """A stored record, validated.

        Args:
            where: the round it belongs to, for the error.

        Raises:
            LedgerIntegrityError: not a record of :data:`ROUND_SETUP_VERSION` (naming ``where``
                and the first field at fault).
        """
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
        data: dict[str, JsonValue] = self.model_dump(mode="json", exclude_unset=True)
        data["version"] = self.version
        return data

    def document(self) -> dict[str, JsonValue]:
        """The REST API's ``noise`` object of a round: the stored form without its version."""
        data = self.to_json()
        del data["version"]
        return data

    def kept_sample(self) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
        """The draw and the population it came from, or None when the attempt kept none."""
        if self.sample is None or self.sample_population is None:
            return None
        return tuple(self.sample), tuple(self.sample_population)
