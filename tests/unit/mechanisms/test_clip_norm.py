"""L2 clipping computes norms without BLAS yet stays exact enough for the sensitivity bound, also
when the squares overflow a float."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpfl.mechanisms.encoding import clip_l2, norm_at_most


def _reference_norm(v: np.ndarray) -> float:
    """Exact to float rounding at any magnitude: math.hypot scales internally."""
    return math.hypot(*v.tolist())


@pytest.mark.parametrize("scale", [1e-300, 1e-3, 1.0, 1e3, 1e150, 1e200, 1e300])
def test_clip_never_exceeds_the_bound_and_keeps_direction(scale: float) -> None:
    rng = np.random.default_rng(3)
    v = rng.normal(size=10_001) * scale
    clipped = clip_l2(v, 1.0)
    norm = _reference_norm(clipped)
    assert norm <= 1.0
    if _reference_norm(v) > 1.0:
        assert norm > 1.0 - 1e-9
        cosine = float(np.add.reduce((clipped / norm) * (v / _reference_norm(v))))
        assert math.isclose(cosine, 1.0, rel_tol=1e-12)
    else:
        np.testing.assert_array_equal(clipped, v)


def test_integer_norm_decision_matches_exact_arithmetic() -> None:
    z = np.array([3, 4] + [0] * 98, dtype=np.int64)
    assert norm_at_most(z, 5.0)
    assert not norm_at_most(z, math.nextafter(5.0, 0.0))
