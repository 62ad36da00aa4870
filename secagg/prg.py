"""The mask generator: AES-256-CTR with a zero IV, keyed per (seed, session, name, m, ring).

PRG(seed) = AES-CTR keystream under K = HKDF(seed, session_id, "prg" ‖ name ‖ m ‖ r), read as m
little-endian words of the container width (32 bits when R ≤ 2^32, else 64 bits) and reduced mod
R = 2^r (docs/secagg.md#stage-3-masked-input). The key changes with the session, the name ("self"
for b_i, "pair" for s_ij), the length and the ring, so no two uses ever share a keystream. R is a
power of two, so the reduction is a mask and the words are exactly uniform.

:class:`MaskAccumulator` adds and subtracts many expansions into one vector in the container ring
Z_{2^32} or Z_{2^64} and reduces mod R once at the end: reduction commutes with ring addition
because R divides the container modulus. No Python loop ever runs per element.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from .errors import ParameterError
from .kdf import derive_key

MAX_RING_BITS = 64
SELF_MASK = "self"
PAIR_MASK = "pair"
_ZERO_IV = bytes(16)

Words = npt.NDArray[np.uint32] | npt.NDArray[np.uint64]


def container_dtype(ring_bits: int) -> type[np.unsignedinteger]:
    """uint32 for rings up to 2^32, uint64 above: the word type of masks and accumulators."""
    _check_ring_bits(ring_bits)
    return np.uint32 if ring_bits <= 32 else np.uint64


def _check_ring_bits(ring_bits: int) -> None:
    if not 1 <= ring_bits <= MAX_RING_BITS:
        raise ParameterError(f"ring_bits {ring_bits} outside [1, {MAX_RING_BITS}]")


def _keystream_words(key: bytes, count: int, dtype: type[np.unsignedinteger]) -> Words:
    width = np.dtype(dtype).itemsize
    raw = Cipher(algorithms.AES(key), modes.CTR(_ZERO_IV)).encryptor().update(bytes(width * count))
    return np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<"))


def prg_key(seed: bytes, *, session_id: bytes, name: str, length: int, ring_bits: int) -> bytes:
    """K = HKDF(seed, session_id, "prg" ‖ name ‖ m ‖ r)."""
    if len(seed) < 16:
        raise ParameterError(f"a PRG seed needs ≥ 16 bytes, got {len(seed)}")
    return derive_key(seed, session_id=session_id, label="prg", fields=(name, length, ring_bits))


def _raw_words(seed: bytes, *, session_id: bytes, name: str, length: int, ring_bits: int) -> Words:
    if length < 0:
        raise ParameterError(f"negative PRG length {length}")
    key = prg_key(seed, session_id=session_id, name=name, length=length, ring_bits=ring_bits)
    return _keystream_words(key, length, container_dtype(ring_bits))


def expand(seed: bytes, *, session_id: bytes, name: str, length: int, ring_bits: int) -> Words:
    """m = ``length`` uniform words in [0, 2^ring_bits), deterministic per (seed, session, name)."""
    words = _raw_words(seed, session_id=session_id, name=name, length=length, ring_bits=ring_bits)
    if ring_bits in (32, 64):
        return words
    return words & words.dtype.type((1 << ring_bits) - 1)


class MaskAccumulator:
    """Sums ± PRG expansions and plain vectors into one ring vector (a local, mutable helper).

    The keystream of every expansion is written into one preallocated buffer (``update_into``),
    which is about three times faster than allocating 4·m fresh bytes per expansion.
    """

    __slots__ = ("_acc", "_buffer", "_length", "_ring_bits", "_session_id", "_words", "_zeros")

    def __init__(self, *, length: int, ring_bits: int, session_id: bytes) -> None:
        if length < 0:
            raise ParameterError(f"negative PRG length {length}")
        self._ring_bits = ring_bits
        self._length = length
        self._session_id = session_id
        dtype = container_dtype(ring_bits)
        self._acc = np.zeros(length, dtype=dtype)
        nbytes = np.dtype(dtype).itemsize * length
        self._zeros = bytes(nbytes)
        self._buffer = bytearray(nbytes + 15)  # update_into needs block_size − 1 spare bytes
        self._words = np.frombuffer(
            self._buffer, dtype=np.dtype(dtype).newbyteorder("<"), count=length
        )

    def add_vector(self, values: Words, sign: int = 1) -> None:
        """Add (sign=+1) or subtract (sign=−1) a vector of ring elements."""
        vec = values.astype(self._acc.dtype, copy=False)
        if sign > 0:
            np.add(self._acc, vec, out=self._acc)
        else:
            np.subtract(self._acc, vec, out=self._acc)

    def add_prg(self, seed: bytes, *, name: str, sign: int = 1) -> None:
        """Add or subtract PRG(seed) for the accumulator's session, length and ring."""
        key = prg_key(
            seed,
            session_id=self._session_id,
            name=name,
            length=self._length,
            ring_bits=self._ring_bits,
        )
        encryptor = Cipher(algorithms.AES(key), modes.CTR(_ZERO_IV)).encryptor()
        encryptor.update_into(self._zeros, self._buffer)
        if sign > 0:
            np.add(self._acc, self._words, out=self._acc)
        else:
            np.subtract(self._acc, self._words, out=self._acc)

    def result(self) -> npt.NDArray[np.uint64]:
        """The accumulated vector reduced mod 2^ring_bits, as uint64 (the wire codec's type)."""
        out = self._acc.astype(np.uint64)
        if self._ring_bits < 64:
            out &= np.uint64((1 << self._ring_bits) - 1)
        return out
