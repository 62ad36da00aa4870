"""dpfl for researchers: run a simulated federation and query the privacy accounting from Python.

``dpfl.simulate(job, agents=N)`` runs what ``dpfl simulate`` runs and returns its
:class:`~dpfl.simulation.SimulationResult` (``to_json()`` is the command's ``--json`` line);
``dpfl.privacy`` gives ε and the noise calibration of a job or of a single mechanism. Importing
``dpfl`` loads neither torch nor gRPC: both attributes are resolved on first use. Example and
fields: docs/utility.md#python-api.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dpfl import privacy as privacy
    from dpfl.simulation import SimulationResult as SimulationResult
    from dpfl.simulation import simulate as simulate

__all__ = ["SimulationResult", "privacy", "simulate"]

#: attribute -> (module, name in it; "" for the module itself)
_LAZY = {
    "simulate": ("dpfl.simulation", "simulate"),
    "SimulationResult": ("dpfl.simulation", "SimulationResult"),
    "privacy": ("dpfl.privacy", ""),
}


def __getattr__(name: str) -> Any:
    try:
        module, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'dpfl' has no attribute {name!r}") from None
    loaded = importlib.import_module(module)
    value = getattr(loaded, attribute) if attribute else loaded
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
