"""Packing of integer vectors into ``PackedVector`` messages, and splitting them into pieces.

The wire form (see ``agent.proto``): unsigned integers of ``bit_width`` bits each, packed LSB-first
in little-endian byte order. For the byte-aligned widths 8/16/32/64 that is exactly a little-endian
numpy array, and packing is a zero-copy view; other widths (a ring of 2^r with r = 20, 41, ...) are
bit-packed so that no bandwidth is spent on unused high bits.

Every decoding step checks lengths eagerly and raises :class:`CodecError` naming the problem, since
these bytes arrive from the network.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from dpfl.protos.dpfl.v1 import agent_pb2 as pb

MAX_BIT_WIDTH = 64
_ALIGNED = {8: "<u1", 16: "<u2", 32: "<u4", 64: "<u8"}


class CodecError(ValueError):
    """A PackedVector is malformed: wrong width, wrong byte count, or values out of range."""


def packed_size(length: int, bit_width: int) -> int:
    """Number of bytes that ``length`` values of ``bit_width`` bits occupy on the wire."""
    return (length * bit_width + 7) // 8


def pack(values: npt.ArrayLike, bit_width: int) -> bytes:
    """Pack non-negative integers ``< 2**bit_width`` into bytes.

    Raises:
        CodecError: a value is negative or does not fit in ``bit_width`` bits.
    """
    _check_width(bit_width)
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise CodecError(f"expected a 1-D vector, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise CodecError(f"expected integers, got dtype {arr.dtype}")
    if arr.size and (arr.min() < 0 or (bit_width < 64 and int(arr.max()) >> bit_width)):
        raise CodecError(f"values do not fit in {bit_width} unsigned bits")
    u64 = arr.astype(np.uint64, copy=False)
    if bit_width in _ALIGNED:
        return u64.astype(_ALIGNED[bit_width]).tobytes()
    return _pack_words(u64, bit_width)


def unpack(data: bytes, bit_width: int, length: int) -> npt.NDArray[np.uint64]:
    """Inverse of :func:`pack`: ``length`` values of ``bit_width`` bits as ``uint64``.

    Raises:
        CodecError: the byte count does not match ``length`` and ``bit_width``, or padding bits
            are set (a sign of a sender using another width).
    """
    _check_width(bit_width)
    if length < 0:
        raise CodecError("negative length")
    expected = packed_size(length, bit_width)
    if len(data) != expected:
        raise CodecError(
            f"{length} values of {bit_width} bits need {expected} bytes, got {len(data)}"
        )
    if bit_width in _ALIGNED:
        return np.frombuffer(data, dtype=_ALIGNED[bit_width]).astype(np.uint64)
    return _unpack_words(data, bit_width, length)


def to_messages(
    values: npt.ArrayLike, bit_width: int, *, max_bytes: int = 1 << 20
) -> Iterator[pb.PackedVector]:
    """Split a vector into ``PackedVector`` pieces of at most ``max_bytes`` of payload each.

    A piece boundary always falls on a multiple of 8 values, so every piece is whole bytes.
    """
    arr = np.asarray(values)
    total = int(arr.shape[0]) if arr.ndim == 1 else -1
    if total < 0:
        raise CodecError(f"expected a 1-D vector, got shape {arr.shape}")
    per_piece = max(8, (max_bytes * 8 // bit_width) // 8 * 8)
    if total == 0:
        yield pb.PackedVector(bit_width=bit_width, length=0, data=b"", offset=0, total_length=0)
        return
    for start in range(0, total, per_piece):
        piece = arr[start : start + per_piece]
        yield pb.PackedVector(
            bit_width=bit_width,
            length=len(piece),
            data=pack(piece, bit_width),
            offset=start,
            total_length=total,
        )


class VectorAssembler:
    """Reassembles a vector from ``PackedVector`` pieces, refusing overlaps, gaps and mismatches.

    Args:
        expected_length: the vector length both sides agreed on (SecAggSetup.vector_length).
        bit_width: the ring width r both sides agreed on.
    """

    def __init__(self, *, expected_length: int, bit_width: int) -> None:
        _check_width(bit_width)
        self.expected_length = expected_length
        self.bit_width = bit_width
        self._out: npt.NDArray[np.uint64] | None = None
        #: [start, end) of every piece received (a handful: pieces are up to 1 MiB)
        self._pieces: list[tuple[int, int]] = []
        self._count = 0

    def add(self, piece: pb.PackedVector) -> bool:
        """Add one piece; return True once the whole vector has arrived.

        Raises:
            CodecError: wrong width or total length, a piece outside the vector, or overlapping
                an earlier piece.
        """
        if piece.bit_width != self.bit_width:
            raise CodecError(f"bit width {piece.bit_width}, expected {self.bit_width}")
        if piece.total_length != self.expected_length:
            raise CodecError(f"vector length {piece.total_length}, expected {self.expected_length}")
        end = piece.offset + piece.length
        if end > self.expected_length:
            raise CodecError(f"piece [{piece.offset}, {end}) exceeds length {self.expected_length}")
        if any(piece.offset < e and s < end for s, e in self._pieces):
            raise CodecError(f"piece [{piece.offset}, {end}) overlaps data already received")
        values = unpack(piece.data, piece.bit_width, piece.length)
        if piece.length == self.expected_length:  # the whole vector in one piece: keep it
            self._out = values
        else:
            if self._out is None:
                self._out = np.zeros(self.expected_length, dtype=np.uint64)
            self._out[piece.offset : end] = values
        self._pieces.append((piece.offset, end))
        self._count += piece.length
        return self.complete

    @property
    def complete(self) -> bool:
        return self._count == self.expected_length

    def result(self) -> npt.NDArray[np.uint64]:
        if not self.complete:
            raise CodecError(f"only {self._count} of {self.expected_length} values received")
        if self._out is None:  # a vector of length 0
            return np.zeros(0, dtype=np.uint64)
        return self._out


@functools.lru_cache(maxsize=8)
def _word_positions(
    length: int, bit_width: int
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.uint64]]:
    """The 64-bit word where each value starts and its bit offset inside that word (read-only,
    cached: every agent of a round sends a vector of the same length and width)."""
    offsets = np.arange(length, dtype=np.uint64) * np.uint64(bit_width)
    word, shift = (offsets >> np.uint64(6)).astype(np.intp), offsets & np.uint64(63)
    word.flags.writeable = False
    shift.flags.writeable = False
    return word, shift


def _pack_words(values: npt.NDArray[np.uint64], bit_width: int) -> bytes:
    """Packing on 64-bit words: each value's low part lands in its start word, the rest in the next.

    The values occupy disjoint bit ranges, so adding the parts that land in one word equals
    OR-ing them (no carries); with ``bit_width`` ≤ 64 every word up to the last value's start
    word holds some value's start, so one ``add.reduceat`` over the runs of equal start words
    sums the low parts and another the high parts. A handful of passes over the vector.
    """
    size = packed_size(values.size, bit_width)
    if values.size == 0:
        return b""
    word, shift = _word_positions(values.size, bit_width)
    low = values << shift
    # v >> (64 − shift), written so that no shift count reaches 64 (shift 0 gives 0)
    high = (values >> np.uint64(1)) >> (np.uint64(63) - shift)
    runs = np.flatnonzero(np.diff(word)) + 1
    starts = np.concatenate(([0], runs))
    words = int(word[-1]) + 1
    out = np.zeros(words + 1, dtype="<u8")
    out[:words] = np.add.reduceat(low, starts)
    out[1:] += np.add.reduceat(high, starts)
    return out.view(np.uint8)[:size].tobytes()


def _unpack_words(data: bytes, bit_width: int, length: int) -> npt.NDArray[np.uint64]:
    """Unpacking on 64-bit words: each value is its start word shifted down, OR the next word's
    low bits shifted up, masked to ``bit_width`` bits."""
    if length == 0:
        return np.zeros(0, np.uint64)
    raw = np.frombuffer(data, dtype=np.uint8)
    tail = length * bit_width
    if tail % 8 and int(raw[tail // 8]) >> (tail % 8):
        raise CodecError("non-zero padding bits after the last value")
    padded = np.zeros((len(data) + 15) // 8 * 8, dtype=np.uint8)
    padded[: len(data)] = raw
    words = padded.view("<u8").astype(np.uint64, copy=False)
    word, shift = _word_positions(length, bit_width)
    value = words[word] >> shift
    # next << (64 − shift), written so that no shift count reaches 64 (shift 0 gives 0)
    value |= (words[word + 1] << np.uint64(1)) << (np.uint64(63) - shift)
    if bit_width < 64:
        value &= np.uint64((1 << bit_width) - 1)
    return value


def _check_width(bit_width: int) -> None:
    if not 1 <= bit_width <= MAX_BIT_WIDTH:
        raise CodecError(f"bit width must be in 1..{MAX_BIT_WIDTH}, got {bit_width}")
