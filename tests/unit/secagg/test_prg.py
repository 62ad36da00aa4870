"""The AES-CTR mask generator and mask cancellation (docs/secagg.md#masks-cancel)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dpfl.secagg.errors import ParameterError
from dpfl.secagg.prg import PAIR_MASK, SELF_MASK, MaskAccumulator, expand, prg_key
from dpfl.secagg.primitives import agree, keypair_from_private, mask_seed

SESSION = b"s" * 32
SEED = b"seed" * 8


def test_expand_is_deterministic_per_seed_session_and_name() -> None:
    a = expand(SEED, session_id=SESSION, name=SELF_MASK, length=64, ring_bits=20)
    assert np.array_equal(
        a, expand(SEED, session_id=SESSION, name=SELF_MASK, length=64, ring_bits=20)
    )
    for other in (
        expand(SEED, session_id=b"t" * 32, name=SELF_MASK, length=64, ring_bits=20),
        expand(SEED, session_id=SESSION, name=PAIR_MASK, length=64, ring_bits=20),
        expand(b"x" * 32, session_id=SESSION, name=SELF_MASK, length=64, ring_bits=20),
        expand(SEED, session_id=SESSION, name=SELF_MASK, length=64, ring_bits=21)[:64] & 0xFFFFF,
    ):
        assert not np.array_equal(a, other)


@pytest.mark.parametrize("bits", [1, 7, 16, 20, 31, 32, 33, 48, 63, 64])
def test_words_lie_in_the_ring(bits: int) -> None:
    words = expand(SEED, session_id=SESSION, name=SELF_MASK, length=2000, ring_bits=bits)
    assert words.dtype == (np.uint32 if bits <= 32 else np.uint64)
    assert words.shape == (2000,)
    if bits < 64:
        assert int(words.max()) < 1 << bits
    assert int(words.max()) >= (1 << bits) // 2  # the top bit is used


def test_the_key_binds_length_and_ring() -> None:
    keys = {
        prg_key(SEED, session_id=SESSION, name=SELF_MASK, length=m, ring_bits=r)
        for m in (10, 11)
        for r in (16, 17)
    }
    assert len(keys) == 4
    with pytest.raises(ParameterError):
        prg_key(b"short", session_id=SESSION, name=SELF_MASK, length=1, ring_bits=8)


@pytest.mark.parametrize("bits", [12, 32, 41, 64])
def test_top_bits_are_uniform(bits: int) -> None:
    words = expand(SEED, session_id=SESSION, name=PAIR_MASK, length=40000, ring_bits=bits)
    top = (words.astype(np.uint64) >> np.uint64(bits - 4)).astype(int)
    assert stats.chisquare(np.bincount(top, minlength=16)).pvalue > 1e-6


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(min_value=2, max_value=8),
    bits=st.sampled_from([8, 20, 32, 50, 64]),
    data=st.data(),
)
def test_pairwise_masks_cancel(n: int, bits: int, data: st.DataObject) -> None:
    """Σ_i Σ_{j≠i} sgn(i,j)·PRG(s_ij) = 0: each s_ij = s_ji and enters once with each sign."""
    privates = [bytes([i + 1]) * 32 for i in range(n)]
    pairs = [keypair_from_private(p) for p in privates]
    total = MaskAccumulator(length=33, ring_bits=bits, session_id=SESSION)
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            seed = mask_seed(agree(pairs[i].private, pairs[j].public), session_id=SESSION, a=i, b=j)
            total.add_prg(seed, name=PAIR_MASK, sign=1 if i < j else -1)
    assert not total.result().any()
    x = np.array(
        data.draw(st.lists(st.integers(0, 2**bits - 1), min_size=33, max_size=33)), dtype=np.uint64
    )
    acc = MaskAccumulator(length=33, ring_bits=bits, session_id=SESSION)
    acc.add_vector(x)
    acc.add_prg(SEED, name=SELF_MASK)
    acc.add_prg(SEED, name=SELF_MASK, sign=-1)
    assert np.array_equal(acc.result(), x)


def test_bad_ring_bits() -> None:
    for bits in (0, 65):
        with pytest.raises(ParameterError):
            expand(SEED, session_id=SESSION, name=SELF_MASK, length=1, ring_bits=bits)
