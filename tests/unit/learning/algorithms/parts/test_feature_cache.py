"""Features through a frozen map are computed once per record array and map, never reused for
another array or map, and never outlive their records (the agent's use of it:
test_model_features.py)."""

from __future__ import annotations

import gc
import threading
from functools import partial
from typing import Any

import numpy as np
import pytest

from dpfl.learning.algorithms.parts.feature_cache import FeatureCache


class _Counting:
    def __init__(self, scale: float = 2.0) -> None:
        self.calls = 0
        self.scale = scale

    def __call__(self, x: np.ndarray) -> np.ndarray:
        self.calls += 1
        return np.asarray(x, np.float32) * self.scale


def test_the_same_array_and_map_are_computed_once() -> None:
    cache, phi = FeatureCache(budget=1 << 20), _Counting()
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    first = cache.features(x, "map-a", partial(phi, x))
    again = cache.features(x, "map-a", partial(phi, x))
    assert phi.calls == 1
    assert again is first
    np.testing.assert_array_equal(first, x * 2)
    assert not first.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        first[0, 0] = 1.0


def test_another_map_or_another_array_is_computed_afresh() -> None:
    cache, phi, psi = FeatureCache(budget=1 << 20), _Counting(2.0), _Counting(3.0)
    x = np.ones((2, 3), np.float32)
    equal = x.copy()  # same values, another array: identity, not content, is the key
    np.testing.assert_array_equal(cache.features(x, "a", partial(phi, x)), 2 * x)
    np.testing.assert_array_equal(cache.features(x, "b", partial(psi, x)), 3 * x)
    np.testing.assert_array_equal(cache.features(equal, "a", partial(phi, equal)), 2 * x)
    assert (phi.calls, psi.calls) == (2, 1)
    assert len(cache) == 3


def test_an_entry_goes_with_its_records() -> None:
    cache, phi = FeatureCache(budget=1 << 20), _Counting()
    x = np.ones((4, 4), np.float32)
    cache.features(x, "a", partial(phi, x))
    assert len(cache) == 1
    assert cache.held_bytes == x.nbytes
    del x
    gc.collect()
    assert len(cache) == 0
    assert cache.held_bytes == 0
    # a new array that happens to get the freed one's address is not served the old features
    for _ in range(50):
        y = np.zeros((4, 4), np.float32)
        np.testing.assert_array_equal(cache.features(y, "a", partial(phi, y)), np.zeros((4, 4)))
        del y


def test_the_budget_evicts_the_least_recently_used() -> None:
    row = np.ones((1, 256), np.float32)  # 1 KiB of features each
    cache, phi = FeatureCache(budget=2 * row.nbytes), _Counting()
    a, b, c = row.copy(), row.copy(), row.copy()
    cache.features(a, "m", partial(phi, a))
    cache.features(b, "m", partial(phi, b))
    cache.features(a, "m", partial(phi, a))  # a is now the most recent
    cache.features(c, "m", partial(phi, c))  # b goes
    assert phi.calls == 3
    assert cache.held_bytes == 2 * row.nbytes
    cache.features(a, "m", partial(phi, a))
    assert phi.calls == 3
    cache.features(b, "m", partial(phi, b))
    assert phi.calls == 4
    big = np.ones((3, 256), np.float32)
    out = cache.features(big, "m", partial(phi, big))
    np.testing.assert_array_equal(out, 2 * big)  # larger than the budget: given, not kept
    assert cache.held_bytes <= cache.budget


def test_threads_get_the_same_features() -> None:
    cache = FeatureCache(budget=1 << 24)
    xs = [np.full((50, 8), i, np.float32) for i in range(8)]
    results: list[list[Any]] = [[] for _ in range(8)]

    def work(k: int) -> None:
        for _ in range(40):
            x = xs[(k + _) % len(xs)]
            results[k].append((id(x), cache.features(x, "m", lambda x=x: x * 2)))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    by_id = {id(x): x for x in xs}
    for got in results:
        for key, features in got:
            np.testing.assert_array_equal(features, by_id[key] * 2)
    assert cache.held_bytes == sum(x.nbytes for x in xs)
