"""From an algorithm's :class:`~dpfl.learning.algorithms.base.ClientCharge` to the ledger's
:class:`~dpfl.server.store.Charge`, shared by the round engine and the audit recorder."""

from __future__ import annotations

from dpfl.accounting import guaranteed_event
from dpfl.learning.algorithms.base import ClientCharge
from dpfl.server.store import Charge, ProtectedUnit

__all__ = ["store_charge"]


def store_charge(
    agent_id: str, charge: ClientCharge, *, own_noise_fraction: float | None
) -> Charge:
    """A ledger charge; the data-dependent figure goes with it when its guaranteed part is
    exactly the algorithm's guaranteed event (never under-count). ``own_noise_fraction``: the
    round's f₁ (``Commitment.own_noise_fraction``), None where it is unknown."""
    event = charge.event
    dd = charge.data_dependent_event
    if dd is not None and guaranteed_event(dd) == event:
        event = dd
    return Charge(
        agent_id=agent_id,
        event=event,
        unit=ProtectedUnit(charge.unit),
        approximate=charge.approximate,
        secure_aggregation=charge.secure_aggregation,
        honest_fraction=charge.honest_fraction,
        own_noise_fraction=own_noise_fraction,
    )
