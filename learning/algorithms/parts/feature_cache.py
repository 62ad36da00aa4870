"""Records seen through a frozen feature map φ, kept while the records live.

φ is a pure function of its spec, its artifact and its input (docs/features.md), so the
features of one record array under one map never change: an agent invited to many rounds, and
a coordinator scoring every round on its test split, compute them once. An entry is keyed by
the array's identity and the map's name (spec and artifact SHA-256), checked against a weak
reference to the array, dropped when the array is freed, and evicted least recently used first
once the features held pass a byte budget. The cached arrays are read-only.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from functools import partial

import numpy as np
import numpy.typing as npt

__all__ = ["FEATURES", "FeatureCache"]

Features = npt.NDArray[np.float32]
_Slot = tuple[int, str]


class FeatureCache:
    """φ(x) per (array, map name), within ``budget`` bytes of features; thread-safe (agents of
    one host train on a pool of threads)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._entries: OrderedDict[_Slot, tuple[weakref.ref[npt.NDArray[np.generic]], Features]]
        self._entries = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()
        self._freed: list[tuple[_Slot, weakref.ref[npt.NDArray[np.generic]]]] = []

    def features(
        self, x: npt.NDArray[np.generic], name: str, compute: Callable[[], Features]
    ) -> Features:
        """φ(``x``) for the map ``name``: kept, or ``compute()`` once and kept."""
        slot = (id(x), name)
        with self._lock:
            self._purge()
            hit = self._entries.get(slot)
            if hit is not None and hit[0]() is x:
                self._entries.move_to_end(slot)
                return hit[1]
        out = np.asarray(compute(), dtype=np.float32)
        if out.base is not None:  # a view: its owner could still write through the base
            out = out.copy()
        out.flags.writeable = False
        if out.nbytes > self.budget:
            return out
        ref = weakref.ref(x, partial(self._on_freed, slot))
        with self._lock:
            self._purge()
            self._remove(slot)
            self._entries[slot] = (ref, out)
            self._held += out.nbytes
            while self._held > self.budget:
                self._remove(next(iter(self._entries)))
        return out

    def __len__(self) -> int:
        with self._lock:
            self._purge()
            return len(self._entries)

    @property
    def held_bytes(self) -> int:
        """The bytes of features held now (entries of freed arrays not yet purged included)."""
        return self._held

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._held = 0

    def _on_freed(self, slot: _Slot, ref: weakref.ref[npt.NDArray[np.generic]]) -> None:
        # a weak-reference callback may run inside any allocation, so it only records the slot
        self._freed.append((slot, ref))

    def _purge(self) -> None:
        while self._freed:
            slot, ref = self._freed.pop()
            hit = self._entries.get(slot)
            if hit is not None and hit[0] is ref:
                self._remove(slot)

    def _remove(self, slot: _Slot) -> None:
        hit = self._entries.pop(slot, None)
        if hit is not None:
            self._held -= hit[1].nbytes


# one per process: a simulation's hundred agents of a large data set hold a few hundred MB
FEATURES = FeatureCache(budget=2 << 30)
