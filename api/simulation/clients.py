"""What each simulated client may spend: its coordinator-side budget and its agent's local policy.

A simulation gives every client the same terms (``--budget-epsilon``, ``--agent-policy`` and the
``--agent-...`` overrides, or ``dpfl.simulate``'s arguments of the same names); how the two
limits act on a run: docs/utility.md#honest-simulation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dpfl.learning.jobs import JobSpec

if TYPE_CHECKING:
    from dpfl.client.policy import Policy

__all__ = ["ClientTerms", "agent_policy", "client_budget", "uniform_clients"]


@dataclass(frozen=True)
class ClientTerms:
    """Per agent index, the (ε, δ) budget of its enrollment token and its local policy (an
    index left out gets the coordinator's default budget, the default policy):
    :class:`~dpfl.simulation.Simulation`'s ``budgets`` and ``policies``."""

    budgets: Mapping[int, tuple[float, float]] = field(default_factory=dict)
    policies: Mapping[int, Policy] = field(default_factory=dict)


def client_budget(
    job: JobSpec, epsilon: float | None, delta: float | None = None
) -> tuple[float, float] | None:
    """The coordinator-side budget (ε, δ) every simulated client gets, or None for the
    coordinator's default; δ defaults to the job's.

    Raises:
        ValueError: ε not a finite number > 0, δ outside (0, 1), or δ without ε.
    """
    if epsilon is None:
        if delta is not None:
            raise ValueError("a budget δ needs a budget ε (--budget-epsilon)")
        return None
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"the budget ε must be a finite number > 0, got {epsilon!r}")
    d = job.privacy.delta if delta is None else delta
    if not (math.isfinite(d) and 0 < d < 1):
        raise ValueError(f"the budget δ must be in (0, 1), got {d!r}")
    return (float(epsilon), float(d))


def agent_policy(
    policy: Policy | Mapping[str, object] | str | Path | None = None,
    *,
    max_epsilon_per_job: float | None = None,
    max_epsilon_total: float | None = None,
    delta: float | None = None,
) -> Policy | None:
    """The local policy every simulated agent runs (``dpfl.client.policy.Policy``), or None for
    the agents' default policy.

    Args:
        policy: a ``Policy``, a mapping of its fields, a YAML file's path, or None.
        max_epsilon_per_job, max_epsilon_total, delta: override those fields. When only the
            per-job cap is raised above the total cap, the total follows it (one job alone
            cannot need more than its own cap).

    Raises:
        dpfl.client.policy.PolicyError: an unreadable file or an invalid field (named).
    """
    from dpfl.client.policy import Policy

    overrides = {
        k: v
        for k, v in (
            ("max_epsilon_per_job", max_epsilon_per_job),
            ("max_epsilon_total", max_epsilon_total),
            ("delta", delta),
        )
        if v is not None
    }
    if policy is None and not overrides:
        return None
    if isinstance(policy, Policy):
        base = policy
    elif policy is None or isinstance(policy, Mapping):
        base = Policy.from_mapping(policy)
    else:
        base = Policy.load(Path(policy))
    if "trust_announced_cohort" not in base.model_fields_set:
        # a simulated agent faces the simulation's own coordinator unless the policy says
        # otherwise (dpfl.client.simulation.SIMULATION_POLICY)
        base = base.model_copy(update={"trust_announced_cohort": True})
    if not overrides:
        return base
    fields = base.model_dump()
    if max_epsilon_total is None and max_epsilon_per_job is not None:
        fields["max_epsilon_total"] = max(fields["max_epsilon_total"], max_epsilon_per_job)
    return Policy.from_mapping({**fields, **overrides})


def uniform_clients(
    agents: int, *, budget: tuple[float, float] | None, policy: Policy | None
) -> ClientTerms:
    """The same budget and policy for every one of ``agents`` agents (None: the default)."""
    return ClientTerms(
        budgets={} if budget is None else dict.fromkeys(range(agents), budget),
        policies={} if policy is None else dict.fromkeys(range(agents), policy),
    )
