"""Public feature extractors: identity and the seeded random projection."""

from __future__ import annotations

import numpy as np
import pytest

from dpfl.learning.errors import LearningError
from dpfl.learning.features import feature_extractor


def test_identity_flattens() -> None:
    ext = feature_extractor("identity", input_shape=(1, 8, 8))
    x = np.arange(2 * 64, dtype=np.float32).reshape(2, 1, 8, 8)
    out = ext(x)
    assert ext.dim == 64
    assert ext.name == "identity"
    assert out.shape == (2, 64)
    np.testing.assert_array_equal(out[1], x[1].reshape(-1))


def test_random_projection_is_fixed_by_its_public_seed() -> None:
    a = feature_extractor("random-projection?dim=32&seed=7", input_shape=(1, 8, 8))
    b = feature_extractor("random-projection?seed=7&dim=32", input_shape=(1, 8, 8))
    c = feature_extractor("random-projection?dim=32&seed=8", input_shape=(1, 8, 8))
    x = np.random.default_rng(0).random((50, 1, 8, 8), dtype=np.float32)
    assert a.dim == 32
    assert a.name == "random-projection?dim=32&seed=7"
    np.testing.assert_array_equal(a(x), b(x))
    assert not np.allclose(a(x), c(x))
    # Johnson-Lindenstrauss: squared norms preserved in expectation
    ratio = (np.linalg.norm(a(x), axis=1) / np.linalg.norm(x.reshape(50, -1), axis=1)) ** 2
    assert abs(float(ratio.mean()) - 1.0) < 0.2


def test_bad_extractors() -> None:
    with pytest.raises(LearningError, match="unknown feature extractor"):
        feature_extractor("pca", input_shape=(4,))
    with pytest.raises(LearningError, match="unknown option"):
        feature_extractor("identity?dim=3", input_shape=(4,))
    with pytest.raises(LearningError, match=">= 1"):
        feature_extractor("random-projection?dim=0", input_shape=(4,))
    with pytest.raises(LearningError, match="4-value records"):
        feature_extractor("identity", input_shape=(4,))(np.zeros((2, 5)))


def test_gabor_is_a_function_of_each_record_alone() -> None:
    rng = np.random.default_rng(0)
    x = rng.random((40, 1, 28, 28)).astype(np.float32)
    phi = feature_extractor("gabor", input_shape=(1, 28, 28))
    assert phi.name == "gabor?norm=8&orientations=8&pool=3"
    out = phi(x)
    assert out.shape == (40, phi.dim) == (40, 153)
    assert out.dtype == np.float32
    # no statistic of the batch: a record maps alike alone, in any batch, in any order
    np.testing.assert_allclose(phi(x[7:8]), out[7:8], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(phi(x[::-1]), out[::-1], rtol=1e-5, atol=1e-6)
    # each record's vector is centred and has the stated norm
    np.testing.assert_allclose(out.mean(axis=1), 0.0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 8.0, rtol=1e-5)
    # a blank image has no direction: zeros, not NaN
    assert np.all(phi(np.zeros((1, 1, 28, 28), np.float32)) == 0)


def test_gabor_responds_to_orientation() -> None:
    """A vertical and a horizontal bar give different features (the bank sees angles)."""
    vertical = np.zeros((1, 1, 16, 16), np.float32)
    vertical[..., :, 7:9] = 1.0
    horizontal = vertical.transpose(0, 1, 3, 2).copy()
    phi = feature_extractor("gabor?orientations=4&pool=2&norm=1", input_shape=(1, 16, 16))
    assert phi.dim == (2 * 4 + 1) * 4
    a, b = phi(vertical)[0], phi(horizontal)[0]
    assert float(a @ b) < 0.9  # unit vectors: far from parallel


def test_gabor_channels_and_bad_options() -> None:
    phi = feature_extractor("gabor?pool=2", input_shape=(3, 20, 20))
    assert phi.dim == 3 * 17 * 4
    assert phi(np.ones((2, 3, 20, 20), np.float32)).shape == (2, phi.dim)
    for spec, shape in [
        ("gabor", (64,)),  # tabular records
        ("gabor?pool=9", (1, 28, 28)),
        ("gabor?orientations=0", (1, 28, 28)),
        ("gabor?norm=0", (1, 28, 28)),
        ("gabor?colour=red", (1, 28, 28)),
        ("gabor?pool=4", (1, 3, 3)),
    ]:
        with pytest.raises(LearningError):
            feature_extractor(spec, input_shape=shape)
    with pytest.raises(LearningError, match="shape"):
        feature_extractor("gabor", input_shape=(1, 28, 28))(np.zeros((2, 1, 16, 16), np.float32))
