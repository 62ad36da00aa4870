"""The agent process's cache of PATE teachers: trained once per job, reused in every round.

A teacher is a deterministic function of its recipe (model spec, epochs, learning rate, momentum,
batch size, seed) and of the agent's data on a given device, so the cache key is a SHA-256 over
the job's id, the recipe and the data's bytes: a later round of the same job finds it, another
job (or the same job name on changed data) trains a new one. Evicting an entry only costs
retraining the identical teacher. Thread-safe; bounded (least recently used goes first).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import JsonValue

__all__ = ["MAX_TEACHERS", "clear_teacher_cache", "teacher_cache_size", "teacher_for"]

#: Teachers kept per process (in-process simulations hold one per simulated agent).
MAX_TEACHERS = 1024

_lock = threading.Lock()
_teachers: OrderedDict[str, Any] = OrderedDict()


def _key(
    job_key: str, recipe: Mapping[str, JsonValue], x: npt.NDArray[Any], y: npt.NDArray[Any]
) -> str:
    digest = hashlib.sha256()
    digest.update(json.dumps([job_key, dict(recipe)], sort_keys=True).encode())
    for array in (x, y):
        a = np.ascontiguousarray(array)
        digest.update(json.dumps([str(a.dtype), list(a.shape)]).encode())
        digest.update(a.tobytes())
    return digest.hexdigest()


def teacher_for(
    job_key: str,
    recipe: Mapping[str, JsonValue],
    x: npt.NDArray[Any],
    y: npt.NDArray[Any],
    train: Callable[[], Any],
) -> Any:
    """The cached teacher for (job, recipe, data), training it with ``train()`` on a miss."""
    key = _key(job_key, recipe, x, y)
    with _lock:
        if key in _teachers:
            _teachers.move_to_end(key)
            return _teachers[key]
    teacher = train()  # outside the lock: training is slow, and a duplicate is harmless
    with _lock:
        _teachers[key] = teacher
        _teachers.move_to_end(key)
        while len(_teachers) > MAX_TEACHERS:
            _teachers.popitem(last=False)
    return teacher


def clear_teacher_cache() -> None:
    """Forget every teacher (tests; or when a job ends)."""
    with _lock:
        _teachers.clear()


def teacher_cache_size() -> int:
    with _lock:
        return len(_teachers)
