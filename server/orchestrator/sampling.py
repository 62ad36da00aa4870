"""Which clients a round attempt invites, and how a round releases a small sample.

The client-sampled charge bounds the release of a sample drawn exactly as its event says
(docs/accounting.md#client-sampling-every-sample-is-released), so a round draws once and keeps
the sample across its uncommitted attempts (:func:`attempt_sample`), and, where
``Algorithm.releases_every_sample`` holds, never skips a small sample
(:func:`~dpfl.learning.algorithms.parts.sample_release.release_for`, shared with the audit and
the simulations).
Everything here is a pure function of its arguments and ``Algorithm.select``'s CSPRNG.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dpfl.learning.algorithms.base import AnyCoordinator
from dpfl.learning.algorithms.parts.sample_release import Release, minimum_accepted, release_for
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


def _kept(previous: Sequence[Round]) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    if not previous:
        return None
    latest = max(previous, key=lambda r: r.attempt)
    if latest.committed_at is not None:
        return None  # charged as a release of its own sample: the next attempt is a new draw
    return latest.setup.kept_sample()


def attempt_sample(
    side: AnyCoordinator,
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
            return AttemptSample(sample, drawn, invited, kept=True)
    drawn_sample = side.select(round_number=round_number, population=population)
    return AttemptSample(
        sample=tuple(drawn_sample),
        drawn_from=tuple(population),
        invited=tuple(sorted(drawn_sample)),
        kept=False,
    )
