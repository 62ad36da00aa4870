"""Reading a stored round's record in tests: the summation parameters every run records."""

from __future__ import annotations

from dpfl.server.store import Round
from dpfl.server.store.round_setup import SecAggRecord


def secagg_of(rnd: Round) -> SecAggRecord:
    """The round's summation parameters; a round that reached its summation always has them."""
    assert rnd.setup.secagg is not None, f"round {rnd.number} recorded no summation"
    return rnd.setup.secagg
