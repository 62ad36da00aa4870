"""PackedVector codec: round trips at every width, chunking, and clear errors on bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpfl.protos import codec, pb


@given(width=st.integers(1, 64), data=st.data())
def test_round_trip_any_width(width: int, data: st.DataObject) -> None:
    values = data.draw(st.lists(st.integers(0, 2**width - 1), max_size=40))
    arr = np.array(values, dtype=np.uint64)
    packed = codec.pack(arr, width)
    assert len(packed) == codec.packed_size(len(values), width)
    np.testing.assert_array_equal(codec.unpack(packed, width, len(values)), arr)


def test_aligned_widths_are_plain_little_endian() -> None:
    arr = np.array([1, 2**31 + 5, 7], dtype=np.uint64)
    assert codec.pack(arr, 32) == arr.astype("<u4").tobytes()


def test_bit_packing_is_dense() -> None:
    assert len(codec.pack(np.arange(8), 3)) == 3


@pytest.mark.parametrize(
    ("values", "width", "match"),
    [
        ([4], 2, "fit"),
        ([-1], 8, "fit"),
        ([1.5], 8, "integers"),
        ([[1]], 8, "1-D"),
        ([1], 0, "bit width"),
        ([1], 65, "bit width"),
    ],
)
def test_pack_rejects(values: list[object], width: int, match: str) -> None:
    with pytest.raises(codec.CodecError, match=match):
        codec.pack(np.array(values), width)


def test_unpack_rejects_wrong_size_and_padding() -> None:
    with pytest.raises(codec.CodecError, match="need 2 bytes"):
        codec.unpack(b"\x00", 12, 1)
    with pytest.raises(codec.CodecError, match="padding"):
        codec.unpack(b"\xff\xff", 12, 1)


def test_chunking_and_reassembly() -> None:
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 2**41, size=10_001, dtype=np.uint64)
    pieces = list(codec.to_messages(arr, 41, max_bytes=4096))
    assert len(pieces) > 1
    assert all(len(p.data) <= 4096 for p in pieces)
    asm = codec.VectorAssembler(expected_length=arr.size, bit_width=41)
    done = [asm.add(p) for p in reversed(pieces)]
    assert done[-1]
    assert not any(done[:-1])
    np.testing.assert_array_equal(asm.result(), arr)


def test_assembler_rejects_mismatches() -> None:
    asm = codec.VectorAssembler(expected_length=16, bit_width=8)
    piece = next(codec.to_messages(np.arange(16), 8))
    with pytest.raises(codec.CodecError, match="bit width"):
        codec.VectorAssembler(expected_length=16, bit_width=16).add(piece)
    with pytest.raises(codec.CodecError, match="vector length"):
        codec.VectorAssembler(expected_length=17, bit_width=8).add(piece)
    asm.add(pb.PackedVector(bit_width=8, length=8, data=bytes(8), offset=0, total_length=16))
    with pytest.raises(codec.CodecError, match="overlaps"):
        asm.add(piece)
    with pytest.raises(codec.CodecError, match="exceeds"):
        asm.add(pb.PackedVector(bit_width=8, length=8, data=bytes(8), offset=12, total_length=16))
    with pytest.raises(codec.CodecError, match="only 8 of 16"):
        asm.result()


def _bitwise_reference(values: np.ndarray, width: int) -> bytes:
    """The wire format spelled out bit by bit: value i's bit j is stream bit i·width + j."""
    bits = ((values[:, None] >> np.arange(width, dtype=np.uint64)) & np.uint64(1)).astype(np.uint8)
    return np.packbits(bits.reshape(-1), bitorder="little").tobytes()


@pytest.mark.parametrize("width", [1, 3, 7, 12, 20, 33, 41, 47, 56, 57, 61, 63])
def test_word_packing_is_the_bitwise_wire_format(width: int) -> None:
    rng = np.random.default_rng(width)
    for n in (1, 2, 7, 8, 9, 63, 64, 65, 1000, 4099):
        arr = rng.integers(0, 2**width, size=n, dtype=np.uint64)
        arr[: min(n, 3)] = 2**width - 1  # all ones, next to each other
        packed = codec.pack(arr, width)
        assert packed == _bitwise_reference(arr, width)
        np.testing.assert_array_equal(codec.unpack(packed, width, n), arr)


def test_word_packing_needs_a_few_words_per_value() -> None:
    """Packing and unpacking make a handful of n-word passes, not per-byte index arrays
    (gathering 8 bytes per value took more than 90 bytes per value at peak)."""
    import tracemalloc

    arr = np.random.default_rng(1).integers(0, 2**41, size=50_000, dtype=np.uint64)
    packed = codec.pack(arr, 41)
    for work in (lambda: codec.unpack(packed, 41, arr.size), lambda: codec.pack(arr, 41)):
        tracemalloc.start()
        try:
            work()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 70 * arr.size


def test_positions_are_computed_once_per_shape_and_a_whole_piece_is_kept() -> None:
    """Every agent's masked input has the round's length and width: the word positions are
    computed once, and a vector that arrives in one piece is used as unpacked (no copy)."""
    codec._word_positions.cache_clear()
    rng = np.random.default_rng(3)
    for _ in range(5):
        arr = rng.integers(0, 2**41, size=3001, dtype=np.uint64)
        (piece,) = codec.to_messages(arr, 41)
        asm = codec.VectorAssembler(expected_length=arr.size, bit_width=41)
        assert asm.add(piece)
        np.testing.assert_array_equal(asm.result(), arr)
        assert asm.result().flags.writeable
    info = codec._word_positions.cache_info()
    assert info.misses == 1  # pack once, then unpack: the same shape
    assert info.hits == 9
    empty = codec.VectorAssembler(expected_length=0, bit_width=41)
    assert empty.complete
    assert empty.result().size == 0
