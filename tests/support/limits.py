"""Wall-clock limits of the tests' waits: hang guards, never performance checks.

A test that waits for work (a subprocess, a federation, a server coming up) waits until the work
is done; the limit only ends a hang. :func:`hang_guard` is ten times what the wait takes on the
2-core CI machine while the suite runs there, so a machine three times slower (a loaded runner,
other jobs beside the suite) never reaches it. pyproject's per-test ``timeout``
(pytest-timeout, the guard of the whole test) lies above every such limit.
"""

from __future__ import annotations

__all__ = ["hang_guard"]

#: How many times the usual duration a wait may take before it counts as hung.
MARGIN = 10.0
#: The least limit: process start-up alone (Python, torch) can take seconds on a busy machine.
FLOOR_S = 60.0


def hang_guard(usual_s: float) -> float:
    """The limit, in seconds, of a wait that usually takes ``usual_s`` seconds."""
    return max(FLOOR_S, MARGIN * usual_s)
