"""The agent's local privacy policy: which tasks it accepts, checked before every round.

Loaded from YAML (``dpfl-agent run --policy FILE``); every field is optional and unknown fields
are errors, so a typo cannot silently widen a policy. The ε checks use the events the algorithm
says the agent must record (``agent_charge``, without amplification by client sampling) and the
agent's own :class:`~dpfl.client.local_ledger.LocalLedger`. :meth:`Policy.decide` never raises on
what the coordinator sent: anything it cannot account for is a decline naming the rule
(docs/agent.md#what-the-agent-refuses). The fields and their defaults are listed in
docs/agent.md#the-policy-file.

Every ε the agent accepts must be a proven upper bound, so the default policy declines rounds
whose ε is only approximate (``privacy.noise: gaussian``: a sum of discrete Gaussians is only
close to a Gaussian); ``allow_approximate: true`` accepts them knowingly.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dpfl.accounting import DpEvent, UnsupportedEventError
from dpfl.client.errors import AgentError
from dpfl.client.local_ledger import LocalLedger, LocalLedgerError
from dpfl.learning.algorithms.registry import algorithm_names

__all__ = ["APPROXIMATE_REASON", "Decision", "Policy", "PolicyError", "noise_multiplier"]


class PolicyError(AgentError, ValueError):
    """A policy file or field that cannot be used; the message names the field."""

    exit_code = 2  # bad input on the command line, like DataSpecError


@dataclass(frozen=True, slots=True)
class Decision:
    """Accept or decline, the rule that decided and why (the reason goes to the coordinator).

    ``epsilon_job`` / ``epsilon_total``: the agent's ε after this round, when computed.
    """

    accept: bool
    rule: str
    reason: str
    epsilon_job: float | None = None
    epsilon_total: float | None = None

    def __bool__(self) -> bool:
        return self.accept


def noise_multiplier(event: DpEvent) -> float:
    """The smallest noise multiplier (noise std over L2 sensitivity) of any release in ``event``.

    Each event kind computes its own (:meth:`DpEvent.min_noise_multiplier`): sampling and
    composition do not change the noise of one release; a voting event counts per query; events
    without any noisy release give infinity.

    Raises:
        PolicyError: an event kind that states no noise multiplier.
    """
    if not isinstance(event, DpEvent):
        raise PolicyError(f"not a dpfl privacy event: {type(event).__name__}")
    try:
        return event.min_noise_multiplier()
    except UnsupportedEventError as exc:
        raise PolicyError(str(exc)) from None


#: Why a round with approximate ε is declined, and what the operator can do about it.
APPROXIMATE_REASON = (
    "the round's ε is approximate, not a proven upper bound (discrete Gaussian noise, "
    "privacy.noise: gaussian); run the job with privacy.noise: skellam (the default, charged "
    "with a proven bound), or set allow_approximate: true in this agent's policy to accept "
    "approximate ε knowingly"
)


class Policy(BaseModel):
    """The agent's policy; its fields and their defaults: docs/agent.md#the-policy-file.

    ``allow_approximate`` (default False): accept rounds whose ε is not a proven upper bound
    (discrete Gaussian noise, ``privacy.noise: gaussian``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    allowed_algorithms: tuple[str, ...] = Field(default_factory=algorithm_names)
    max_epsilon_per_job: float = Field(default=10.0, gt=0)
    max_epsilon_total: float = Field(default=30.0, gt=0)
    delta: float = Field(default=1e-5, gt=0, lt=1)
    min_noise_multiplier: float = Field(default=0.5, ge=0)
    allowed_coordinators: tuple[str, ...] | None = None
    allowed_jobs: tuple[str, ...] | None = None
    require_secure_aggregation: bool = False
    max_honest_fraction: float = Field(default=1.0, gt=0, le=1)
    allow_approximate: bool = False
    max_colluding_peers: int | None = Field(default=None, ge=0)
    trust_announced_cohort: bool = False

    @field_validator("allowed_algorithms")
    @classmethod
    def _known(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        known = algorithm_names()
        unknown = [a for a in value if a not in known]
        if unknown:
            raise ValueError(f"unknown algorithm(s) {unknown} (known: {', '.join(known)})")
        return value

    @model_validator(mode="after")
    def _budgets(self) -> Policy:
        if self.max_epsilon_per_job > self.max_epsilon_total:
            raise ValueError("max_epsilon_per_job must not exceed max_epsilon_total")
        return self

    # -- what the agent can verify -------------------------------------------------------------

    def verified_shares(self, *, malicious_secure: bool, threshold: int, degree: int) -> int:
        """How many noise shares, this agent's own included, are in every sum the coordinator
        can decode that contains this agent's input: t − c in a malicious-secure round between
        certified peers when 2t > k + 1 + c (c = ``max_colluding_peers``), else 1, its own
        (docs/accounting.md#what-the-agent-can-verify)."""
        c = self.max_colluding_peers
        if not malicious_secure or c is None or 2 * threshold <= degree + 1 + c:
            return 1
        return max(1, threshold - c)

    def recorded_fraction(self, own_fraction: float, verified_shares: int) -> float:
        """The fraction of the claimed noise's variance the agent records: ``verified_shares``
        shares of ``own_fraction`` each, at most 1; all of it when the policy trusts the
        coordinator's announced cohort (``trust_announced_cohort``)."""
        if self.trust_announced_cohort:
            return 1.0
        return min(1.0, own_fraction * verified_shares)

    # -- loading -------------------------------------------------------------------------------

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None) -> Policy:
        """Validate a policy document (None or empty: the defaults).

        Raises:
            PolicyError: ``field: problem`` for every invalid field.
        """
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise PolicyError("a policy must be a mapping of fields")
        try:
            return cls.model_validate(dict(data))
        except ValidationError as exc:
            problems = [
                f"{'.'.join(str(p) for p in err['loc']) or 'policy'}: {err['msg']}"
                for err in exc.errors()
            ]
            raise PolicyError("invalid policy: " + "; ".join(problems)) from None

    @classmethod
    def load(cls, path: str | Path | None) -> Policy:
        """The policy in YAML file ``path``, or the defaults when ``path`` is None.

        Raises:
            PolicyError: unreadable file, bad YAML, or invalid fields (the path is named).
        """
        if path is None:
            return cls()
        try:
            text = Path(path).read_text(encoding="utf-8")
            data = yaml.safe_load(text)
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise PolicyError(f"cannot read policy file {path}: {exc}") from None
        try:
            return cls.from_mapping(data)
        except PolicyError as exc:
            raise PolicyError(f"{path}: {exc}") from None

    # -- the decision --------------------------------------------------------------------------

    def decide(
        self,
        *,
        algorithm: str,
        job_id: str,
        events: Sequence[DpEvent],
        ledger: LocalLedger,
        job_name: str = "",
        coordinator: str = "",
        secure_aggregation: bool = True,
        honest_fraction: float = 1.0,
        approximate: bool = False,
        unit: str = "",
    ) -> Decision:
        """Accept or decline one round.

        Args:
            algorithm: the invitation's algorithm tag.
            job_id: the job's id (the local ledger's key); ``job_name`` is also matched against
                ``allowed_jobs``.
            events: what the agent would record (``Algorithm.agent_charge`` of the claimed
                events), NOT the coordinator's population-level charge.
            ledger: the agent's own ledger.
            coordinator: the coordinator's id.
            secure_aggregation: whether the task's vectors are masked.
            honest_fraction: the t the coordinator's noise split assumes.
            approximate: the events are approximate (Gaussian noise in the ring): declined
                unless ``allow_approximate``.
            unit: the task's privacy unit (the relation of votes, in the ledger's total).

        Returns:
            The :class:`Decision`; ``rule`` names the rule that declined (``""`` on accept).
        """
        if self.allowed_coordinators is not None and coordinator not in self.allowed_coordinators:
            return _no("allowed_coordinators", f"coordinator {coordinator!r} is not allowed")
        if algorithm not in self.allowed_algorithms:
            return _no("allowed_algorithms", f"algorithm {algorithm!r} is not allowed")
        if self.allowed_jobs is not None and not any(
            fnmatch.fnmatchcase(name, pattern)
            for pattern in self.allowed_jobs
            for name in (job_id, job_name)
            if name
        ):
            return _no("allowed_jobs", f"job {job_name or job_id!r} is not allowed")
        if self.require_secure_aggregation and not secure_aggregation:
            return _no("require_secure_aggregation", "the round is summed without masking")
        # t only matters when the noise is split across agents and the agent records the
        # announced cohort's noise: in a plain round every agent adds the whole noise itself, and
        # an agent that does not trust the cohort records only the noise it verified.
        trusting = secure_aggregation and self.trust_announced_cohort
        if trusting and honest_fraction > self.max_honest_fraction:
            return _no(
                "max_honest_fraction",
                f"the noise assumes honest fraction {honest_fraction:g} > "
                f"{self.max_honest_fraction:g}",
            )
        if approximate and not self.allow_approximate:
            return _no("allow_approximate", APPROXIMATE_REASON)
        return self._decide_cost(algorithm, job_id, events, ledger, unit)

    def _decide_cost(
        self,
        algorithm: str,
        job_id: str,
        events: Sequence[DpEvent],
        ledger: LocalLedger,
        unit: str,
    ) -> Decision:
        """The claimed events' noise multiplier and the ε they leave in ``ledger`` (recorded at
        the task's ``unit``), against this policy's floor and budgets."""
        try:
            if not events:
                raise PolicyError("no privacy events claimed")
            z = min(noise_multiplier(e) for e in events)
            job_eps, total_eps = ledger.epsilon_with(
                events, job_id=job_id, delta=self.delta, algorithm=algorithm, unit=unit
            )
        except (PolicyError, LocalLedgerError) as exc:
            return _no("events", f"cannot account for the claimed events: {exc}")
        if z < self.min_noise_multiplier:
            return _no(
                "min_noise_multiplier",
                f"noise multiplier {z:.4g} is below the minimum {self.min_noise_multiplier:g}",
            )
        if job_eps > self.max_epsilon_per_job:
            return _no(
                "max_epsilon_per_job",
                f"ε for job {job_id!r} would reach {job_eps:.4g} > {self.max_epsilon_per_job:g} "
                f"at δ = {self.delta:g}",
                job_eps,
                total_eps,
            )
        if total_eps > self.max_epsilon_total:
            return _no(
                "max_epsilon_total",
                f"total ε would reach {total_eps:.4g} > {self.max_epsilon_total:g} "
                f"at δ = {self.delta:g}",
                job_eps,
                total_eps,
            )
        return Decision(
            accept=True,
            rule="",
            reason=f"ε after the round: job {job_eps:.4g}, total {total_eps:.4g} at δ = "
            f"{self.delta:g}",
            epsilon_job=job_eps,
            epsilon_total=total_eps,
        )

    def charge(
        self,
        ledger: LocalLedger,
        *,
        job_id: str,
        round: int,
        attempt: int | str,
        events: Sequence[DpEvent],
        algorithm: str = "",
        coordinator: str = "",
        unit: str = "",
    ) -> bool:
        """Record ``events`` in ``ledger``, re-checking this policy's budgets in the same
        transaction (call it right before sending the masked input).

        Returns:
            True if recorded now, False if this attempt was already recorded.

        Raises:
            LocalBudgetExceeded: a budget would be exceeded; nothing was recorded.
            LocalLedgerError: bad or conflicting record.
        """
        return ledger.record(
            job_id=job_id,
            round=round,
            attempt=attempt,
            events=events,
            algorithm=algorithm,
            coordinator=coordinator,
            unit=unit,
            max_epsilon_job=self.max_epsilon_per_job,
            max_epsilon_total=self.max_epsilon_total,
            delta=self.delta,
        )


def _no(rule: str, reason: str, job: float | None = None, total: float | None = None) -> Decision:
    return Decision(
        accept=False, rule=rule, reason=f"{rule}: {reason}", epsilon_job=job, epsilon_total=total
    )
