"""What a simulated job produced: accuracy, ε, who took part and why not, why it stopped.

Built from the coordinator's store after the job (the round records keep each round's invited,
accepted and declined agents with the reason each decliner sent) and from the runner's round
reports. :class:`SimulationResult` is what ``dpfl.simulate`` returns; its ``to_json()`` is the
``--json`` line (a string) and ``to_dict()`` the same document as a dict; the fields are
documented in docs/utility.md#what-the-simulation-reports.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Literal

from dpfl.learning.algorithms.registry import get_algorithm

if TYPE_CHECKING:
    from dpfl.learning.jobs import JobSpec, RecipeSpec
    from dpfl.server.orchestrator import RoundReport
    from dpfl.server.store import Round, Store

__all__ = [
    "Invitations",
    "RoundInvitations",
    "SimulationResult",
    "StopKind",
    "StopReason",
    "collect_result",
    "decline_rule",
    "invitations_from_rounds",
    "stop_reason",
]

#: Why a job ended before its last round completed.
StopKind = Literal["budget_exhausted", "rounds_aborted", "error", "algorithm_done", "stopped"]

_RULE = re.compile(r"[a-z][a-z0-9_]{0,47}")


def decline_rule(reason: str) -> str:
    """The rule a decline names: the agent's policy writes ``rule: why`` (``max_epsilon_total:
    total ε would reach ...``); any other text (a malformed invitation) counts as ``other``."""
    head, sep, _ = reason.partition(":")
    return head if sep and _RULE.fullmatch(head) else "other"


@dataclass(frozen=True, slots=True)
class RoundInvitations:
    """One round attempt: how many were invited, accepted, declined (per rule), did not answer,
    and how many members the coordinator left out because their budget could not pay."""

    round: int
    attempt: int
    status: str
    invited: int
    accepted: int
    declined: Mapping[str, int]
    no_answer: int
    excluded_over_budget: int
    abort_reason: str | None = None


@dataclass(frozen=True, slots=True)
class Invitations:
    """The job's invitations summed over every round attempt that sent any.

    ``declined_by_rule`` counts declines per rule of the agents' local policy; ``example`` keeps
    one reason text per rule (the first seen) so the summary can show what the agents said.
    """

    sent: int = 0
    accepted: int = 0
    declined: int = 0
    no_answer: int = 0
    excluded_over_budget: int = 0
    declined_by_rule: Mapping[str, int] = field(default_factory=dict)
    example: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StopReason:
    """Why the job ended before completing all its rounds: a kind and the coordinator's words."""

    kind: StopKind
    message: str


def invitations_from_rounds(
    rounds: Iterable[Round],
) -> tuple[Invitations, list[RoundInvitations]]:
    """Sum the round records (``dpfl.server.store.Round``) of a job.

    A round that never sent its invitations (skipped: too few sampled) counts in the per-round
    list with zero invited, so that the list still shows it."""
    per_round: list[RoundInvitations] = []
    rules: Counter[str] = Counter()
    example: dict[str, str] = {}
    sent = accepted = no_answer = excluded = 0
    for r in sorted(rounds, key=lambda r: (r.number, r.attempt)):
        left_out = len(r.setup.excluded_over_budget or ())
        excluded += left_out
        invited_now = len(r.invited) if "invitation" in r.survivors else 0
        declines = r.setup.declined or {}
        counts: Counter[str] = Counter()
        for reason in declines.values():
            rule = decline_rule(str(reason))
            counts[rule] += 1
            example.setdefault(rule, str(reason))
        rules.update(counts)
        took = len(r.accepted) if invited_now else 0
        silent = max(0, invited_now - took - sum(counts.values()))
        sent += invited_now
        accepted += took
        no_answer += silent
        per_round.append(
            RoundInvitations(
                round=r.number,
                attempt=r.attempt,
                status=r.status.value,
                invited=invited_now,
                accepted=took,
                declined=dict(sorted(counts.items())),
                no_answer=silent,
                excluded_over_budget=left_out,
                abort_reason=r.abort_reason,
            )
        )
    total = Invitations(
        sent=sent,
        accepted=accepted,
        declined=sum(rules.values()),
        no_answer=no_answer,
        excluded_over_budget=excluded,
        declined_by_rule=dict(sorted(rules.items())),
        example=dict(sorted(example.items())),
    )
    return total, per_round


def stop_reason(
    *,
    status: str,
    error: str | None,
    rounds_planned: int,
    rounds_completed: int,
    rounds_skipped: int,
    reports: Sequence[RoundReport],
) -> StopReason | None:
    """Why the job stopped early, or None when every round number was completed or skipped.

    ``reports`` are the runner's ``RoundReport``s (empty after a coordinator restart: the kind
    then comes from the status alone)."""
    last = reports[-1] if reports else None
    if status == "completed":
        if rounds_completed + rounds_skipped >= rounds_planned:
            return None
        return StopReason(
            "algorithm_done",
            f"the algorithm finished after {rounds_completed} of {rounds_planned} rounds",
        )
    message = error or f"the job is {status}"
    if status == "failed":
        if last is not None and last.exhausted:
            return StopReason("budget_exhausted", message)
        if last is not None and not (last.completed or last.skipped):
            return StopReason("rounds_aborted", message)
        return StopReason("error", message)
    return StopReason("stopped", message)


@dataclass(frozen=True)
class SimulationResult:
    """What a simulated job produced: :meth:`to_json` is the ``--json`` line (a string),
    :meth:`to_dict` the same document as a dict."""

    job: str
    job_id: str
    algorithm: str
    status: str
    rounds_completed: int
    accuracy: float | None
    epsilon: Mapping[str, float]
    delta: float
    noise_multiplier: float | None
    wall_s: float
    metrics: Mapping[str, float] = field(default_factory=dict)
    error: str | None = None
    claimed_epsilon: float | None = None
    claim: str | None = None
    rounds_planned: int = 0
    rounds_skipped: int = 0
    invitations: Invitations = field(default_factory=Invitations)
    per_round: Sequence[RoundInvitations] = ()
    stop: StopReason | None = None
    recipe: RecipeSpec | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "job": self.job,
            "algorithm": self.algorithm,
            "status": self.status,
            "rounds_planned": self.rounds_planned,
            "rounds_completed": self.rounds_completed,
            "rounds_skipped": self.rounds_skipped,
            "accuracy": self.accuracy,
            "epsilon": dict(self.epsilon),
            "delta": self.delta,
            "noise_multiplier": self.noise_multiplier,
            "wall_s": round(self.wall_s, 3),
            "claimed_epsilon": self.claimed_epsilon,
            "claim": self.claim,
            "metrics": dict(self.metrics),
            "invitations": asdict(self.invitations),
            "per_round": [asdict(r) for r in self.per_round],
            "stop_reason": None if self.stop is None else asdict(self.stop),
            "recipe": _recipe_json(self.recipe),
        }

    def to_json(self) -> str:
        """The ``dpfl simulate --json`` line: :meth:`to_dict` as one line of JSON (an unbounded
        ε is written ``Infinity``, as Python's ``json`` module reads and writes it)."""
        return json.dumps(self.to_dict())


def _recipe_json(recipe: RecipeSpec | None) -> dict[str, object] | None:
    """The job's recipe as the JSON line shows it: the fields its document left unset, those
    of them that kept their default, and what a search chose (null when none ran)."""
    if recipe is None:
        return None
    chosen = recipe.chosen
    return {
        "defaults": list(recipe.defaults or ()),
        "defaults_used": list(recipe.defaults_used()),
        "chosen": None if chosen is None else chosen.model_dump(mode="json"),
    }


def collect_result(
    store: Store,
    spec: JobSpec,
    *,
    job_id: str,
    agents: Sequence[str],
    reports: Sequence[RoundReport],
    wall_s: float,
) -> SimulationResult:
    """The result of job ``job_id`` (run from ``spec`` with ``agents`` as its population), read
    from the coordinator's store and the runner's round ``reports`` after it ended."""
    job = store.get_job(job_id)
    rounds = store.list_rounds(job_id)
    done = [r for r in rounds if r.status.value == "completed"]
    last = max(done, key=lambda r: r.number) if done else None
    delta = spec.privacy.delta
    # each client's ε for this job in the ledger: the smaller of the job's RDP figure and its
    # tight figure, both proven bounds unless the job's noise is discrete Gaussian (entries
    # marked approximate; docs/accounting.md#which-bound-each-ledger-figure-is); 0 for a
    # client the job never charged. One read of the job's entries for all clients.
    charged = store.job_epsilons(job_id, delta=delta)
    stored = rounds[-1].setup.plan if rounds else None
    algorithm = get_algorithm(spec.algorithm)
    plan = None if stored is None else algorithm.parse_plan(stored.model_dump(mode="json"))
    shown = None if plan is None else plan.details.shown_claim()
    completed = [r for r in reports if r.completed]
    skipped = {r.round.number for r in reports if r.skipped and r.round is not None} - {
        d.number for d in done
    }
    invitations, per_round = invitations_from_rounds(rounds)
    return SimulationResult(
        job=spec.name,
        job_id=job_id,
        algorithm=spec.algorithm,
        status=job.status.value,
        rounds_completed=len(done),
        accuracy=last.accuracy if last is not None else None,
        epsilon={a: float(charged.get(a, 0.0)) for a in agents},
        delta=delta,
        noise_multiplier=None if plan is None else plan.noise_multiplier,
        wall_s=wall_s,
        metrics=dict(completed[-1].metrics) if completed else {},
        error=job.error,
        claimed_epsilon=None if shown is None else shown[0],
        claim=None if shown is None else shown[1],
        rounds_planned=spec.rounds,
        rounds_skipped=len(skipped),
        invitations=invitations,
        per_round=per_round,
        stop=stop_reason(
            status=job.status.value,
            error=job.error,
            rounds_planned=spec.rounds,
            rounds_completed=len(done),
            rounds_skipped=len(skipped),
            reports=reports,
        ),
        recipe=spec.recipe,
    )
