"""Which clients a round attempt invites, and how a round releases a small sample.

docs/accounting.md, "Client sampling: every sample is released", proves why; in short, the
client-sampled charge (``PoissonSampledEvent(q, M)``, ``SampledWithoutReplacementEvent``) bounds
the release of ``M(S)`` for a sample S drawn exactly as the event says, so:

- **one draw per round, kept across its attempts** (:func:`attempt_sample`): an attempt that
  aborted before its ledger commit released nothing, and the next attempt invites the same
  sample again (those of it still in the population). Drawing afresh would release the first
  sample that got through, a draw conditioned on the aborts. An attempt that committed was
  charged as a release of its own sample; the next one draws afresh (charged again, a new
  independent release). A sample is kept only while the population is a subset of the one it
  was drawn from, so the charge's ratio never falls below the draw's.
- **no skip** (:func:`~dpfl.learning.algorithms.release.release_for`, the pure policy the
  audit and the simulations share): when :meth:`Algorithm.releases_every_sample` holds, an
  empty sample releases the coordinator's noise alone (``M(∅)``) and one agent is summed in the
  plain transport with the whole noise; only algorithms whose charge does not rest on the
  secrecy of the sample skip a sample too small for secure aggregation.

Everything here is a pure function of its arguments (and of ``Algorithm.select``'s CSPRNG), so
the policy can be driven many times without running rounds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dpfl.learning.algorithms.base import Algorithm, JobPlan
from dpfl.learning.algorithms.release import Release, minimum_accepted, release_for
from dpfl.learning.jobs import JobSpec
from dpfl.server.store import Round

__all__ = ["AttemptSample", "Release", "attempt_sample", "minimum_accepted", "release_for"]


@dataclass(frozen=True, slots=True)
class AttemptSample:
    """The sample of one attempt.

    Attributes:
        sample: the round's draw (kept for every attempt until one commits).
        drawn_from: the population it was drawn from.
        invited: the members of ``sample`` in this attempt's population, sorted.
        kept: the draw is an earlier attempt's.
    """

    sample: tuple[str, ...]
    drawn_from: tuple[str, ...]
    invited: tuple[str, ...]
    kept: bool

    def record(self) -> dict[str, Any]:
        """What the round record keeps so that a later attempt (or a restarted coordinator)
        invites the same sample."""
        return {
            "sample": list(self.sample),
            "sample_population": list(self.drawn_from),
            "sample_kept": self.kept,
        }


def _kept(previous: Sequence[Round]) -> tuple[list[str], list[str]] | None:
    if not previous:
        return None
    latest = max(previous, key=lambda r: r.attempt)
    if latest.committed_at is not None:
        return None  # charged as a release of its own sample: the next attempt is a new draw
    noise: Mapping[str, Any] = latest.noise
    sample, drawn = noise.get("sample"), noise.get("sample_population")
    if not isinstance(sample, list) or not isinstance(drawn, list):
        return None
    if not all(isinstance(a, str) for a in [*sample, *drawn]):
        return None
    return sample, drawn


def attempt_sample(
    algorithm: Algorithm,
    spec: JobSpec,
    plan: JobPlan,
    *,
    round_number: int,
    population: Sequence[str],
    previous: Sequence[Round],
) -> AttemptSample:
    """The sample an attempt at ``round_number`` invites (see the module docstring).

    Args:
        previous: the earlier attempts at this round number (any order).
    """
    kept = _kept(previous)
    if kept is not None:
        sample, drawn = kept
        if set(population) <= set(drawn):
            members = set(population)
            invited = tuple(sorted(a for a in sample if a in members))
            return AttemptSample(tuple(sample), tuple(drawn), invited, kept=True)
    drawn_sample = algorithm.select(spec, plan, round_number=round_number, population=population)
    return AttemptSample(
        sample=tuple(drawn_sample),
        drawn_from=tuple(population),
        invited=tuple(sorted(drawn_sample)),
        kept=False,
    )
