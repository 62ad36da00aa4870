"""t-of-n Shamir secret sharing over GF(p), p = 2^521 − 1 (a Mersenne prime above any 32-byte
secret).

Client j's evaluation point is x_j = j + 1, so x = 0 (where the secret lives) is nobody's; a
share's y travels as 66 big-endian bytes. Reconstruction is the server's hot path, so
:func:`reconstruct_many` rebuilds every secret of an unmask round together, with Lagrange
coefficients cached per x-set (:class:`LagrangeCache`) and the missing denominators inverted in
one batch (Montgomery's trick). Invariants (docs/secagg.md#shamir): any t shares determine the
secret, t − 1 are independent of it, x = 0 and duplicate x raise :class:`InvalidShare`.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence

from .errors import InvalidShare, ParameterError
from .randomness import RandomStream

PRIME = (1 << 521) - 1
SHARE_BYTES = 66
SECRET_BYTES = 32
_FIELD_BITS = 521
_FIELD_BYTES = 66


def secret_to_int(secret: bytes) -> int:
    """The field element of a 32-byte secret."""
    if len(secret) != SECRET_BYTES:
        raise ParameterError(f"a secret has {SECRET_BYTES} bytes, got {len(secret)}")
    return int.from_bytes(secret, "big")


def int_to_secret(value: int) -> bytes:
    """Inverse of :func:`secret_to_int`.

    Raises:
        InvalidShare: the reconstructed value does not fit in 32 bytes (the shares were wrong).
    """
    if not 0 <= value < 1 << (8 * SECRET_BYTES):
        raise InvalidShare("reconstructed value does not fit in 32 bytes: inconsistent shares")
    return value.to_bytes(SECRET_BYTES, "big")


def encode_share(y: int) -> bytes:
    """A share's y value as 66 big-endian bytes."""
    if not 0 <= y < PRIME:
        raise InvalidShare("share value outside the field")
    return y.to_bytes(SHARE_BYTES, "big")


def decode_share(data: bytes) -> int:
    """Inverse of :func:`encode_share`, with eager checks (the bytes come from the network).

    Raises:
        InvalidShare: wrong length or a value ≥ p.
    """
    if len(data) != SHARE_BYTES:
        raise InvalidShare(f"a share has {SHARE_BYTES} bytes, got {len(data)}")
    y = int.from_bytes(data, "big")
    if y >= PRIME:
        raise InvalidShare("share value outside the field")
    return y


def _check_points(xs: Sequence[int]) -> None:
    seen: set[int] = set()
    for x in xs:
        if isinstance(x, bool) or not isinstance(x, int):
            raise InvalidShare(f"x-coordinate {x!r} is not an integer")
        if x % PRIME == 0:
            raise InvalidShare("x-coordinate 0 would reveal the secret")
        if not 0 < x < PRIME:
            raise InvalidShare(f"x-coordinate {x} outside (0, p)")
        if x in seen:
            raise InvalidShare(f"duplicate x-coordinate {x}")
        seen.add(x)


def _random_field_elements(rng: RandomStream, count: int) -> list[int]:
    out: list[int] = []
    mask = (1 << _FIELD_BITS) - 1
    while len(out) < count:
        raw = rng.read(_FIELD_BYTES * (count - len(out)))
        for i in range(0, len(raw), _FIELD_BYTES):
            value = int.from_bytes(raw[i : i + _FIELD_BYTES], "big") & mask
            if value < PRIME:  # rejects only 2^521 − 1 itself
                out.append(value)
    return out


def share(
    secrets: Sequence[int], *, xs: Sequence[int], threshold: int, rng: RandomStream
) -> list[list[int]]:
    """Shamir-share each secret at the points ``xs``.

    Args:
        secrets: field elements (e.g. from :func:`secret_to_int`).
        xs: distinct non-zero evaluation points.
        threshold: t, the number of shares that reconstruct; 2 ≤ t ≤ len(xs).
        rng: the stream the random coefficients come from.

    Returns:
        ``out[s][j]`` = the share of ``secrets[s]`` at ``xs[j]``.

    Raises:
        ParameterError: a secret outside the field or t out of range.
        InvalidShare: a zero or duplicate x.
    """
    _check_points(xs)
    if not 2 <= threshold <= len(xs):
        raise ParameterError(f"threshold {threshold} outside [2, {len(xs)}]")
    out: list[list[int]] = []
    for secret in secrets:
        if not 0 <= secret < PRIME:
            raise ParameterError("secret outside the field")
        # coefficients c_{t-1}, ..., c_1 (uniform), then c_0 = secret: Horner order.
        coefficients = [*_random_field_elements(rng, threshold - 1), secret]
        row = []
        for x in xs:
            acc = 0
            for c in coefficients:
                acc = (acc * x + c) % PRIME
            row.append(acc)
        out.append(row)
    return out


class LagrangeCache:
    """Lagrange coefficients at 0 per x-set (bounded LRU: x-sets recur across owners and rounds)."""

    __slots__ = ("_entries", "_maxsize")

    def __init__(self, maxsize: int = 65536) -> None:
        self._maxsize = maxsize
        self._entries: OrderedDict[tuple[int, ...], tuple[int, ...]] = OrderedDict()

    def get(self, xs: tuple[int, ...]) -> tuple[int, ...] | None:
        found = self._entries.get(xs)
        if found is not None:
            self._entries.move_to_end(xs)
        return found

    def put(self, xs: tuple[int, ...], coefficients: tuple[int, ...]) -> None:
        self._entries[xs] = coefficients
        if len(self._entries) > self._maxsize:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


_DEFAULT_CACHE = LagrangeCache()


def _batch_invert(values: list[int]) -> list[int]:
    """Inverses mod p of non-zero values with one exponentiation (Montgomery's trick)."""
    prefix = [1] * (len(values) + 1)
    for i, v in enumerate(values):
        prefix[i + 1] = prefix[i] * v % PRIME
    inv = pow(prefix[-1], -1, PRIME)
    out = [0] * len(values)
    for i in range(len(values) - 1, -1, -1):
        out[i] = inv * prefix[i] % PRIME
        inv = inv * values[i] % PRIME
    return out


def lagrange_at_zero(
    x_sets: Sequence[tuple[int, ...]], *, cache: LagrangeCache | None = None
) -> list[tuple[int, ...]]:
    """Lagrange coefficients at 0 for each x-set, computing the missing ones in one batch."""
    cache = _DEFAULT_CACHE if cache is None else cache
    result: list[tuple[int, ...] | None] = [cache.get(xs) for xs in x_sets]
    missing: dict[tuple[int, ...], list[int]] = {}
    for xs, found in zip(x_sets, result, strict=True):
        if found is None and xs not in missing:
            _check_points(xs)
            missing[xs] = []
    # λ_j = (Π_m x_m) / (x_j · Π_{m≠j} (x_m − x_j)); the denominators are inverted together.
    denominators: list[int] = []
    for xs in missing:
        for j, xj in enumerate(xs):
            den = xj
            for m, xm in enumerate(xs):
                if m != j:
                    den *= xm - xj
            denominators.append(den % PRIME)
    inverses = _batch_invert(denominators) if denominators else []
    pos = 0
    for xs in missing:
        numerator = math.prod(xs) % PRIME
        coefficients = tuple(numerator * inverses[pos + j] % PRIME for j in range(len(xs)))
        pos += len(xs)
        cache.put(xs, coefficients)
        missing[xs] = list(coefficients)
    return [
        found if found is not None else tuple(missing[xs])
        for xs, found in zip(x_sets, result, strict=True)
    ]


def reconstruct_many(
    share_sets: Sequence[Sequence[tuple[int, int]]],
    *,
    threshold: int,
    cache: LagrangeCache | None = None,
) -> list[int]:
    """Rebuild many secrets at once from their (x, y) shares (the first ``threshold`` of each).

    Raises:
        ParameterError: threshold < 2.
        InvalidShare: a set has fewer than ``threshold`` shares, or a zero/duplicate x, or y ≥ p.
    """
    if threshold < 2:
        raise ParameterError(f"threshold {threshold} must be ≥ 2")
    x_sets: list[tuple[int, ...]] = []
    y_sets: list[tuple[int, ...]] = []
    for index, shares in enumerate(share_sets):
        if len(shares) < threshold:
            raise InvalidShare(f"secret #{index} has {len(shares)} shares, {threshold} are needed")
        used = shares[:threshold]
        ys = tuple(y for _, y in used)
        if any(not 0 <= y < PRIME for y in ys):
            raise InvalidShare(f"secret #{index} has a share value outside the field")
        x_sets.append(tuple(x for x, _ in used))
        y_sets.append(ys)
    coefficient_sets = lagrange_at_zero(x_sets, cache=cache)
    return [
        sum(lam * y for lam, y in zip(lams, ys, strict=True)) % PRIME
        for lams, ys in zip(coefficient_sets, y_sets, strict=True)
    ]


def reconstruct(shares: Sequence[tuple[int, int]], *, threshold: int) -> int:
    """Rebuild one secret from at least ``threshold`` (x, y) shares."""
    return reconstruct_many([shares], threshold=threshold)[0]
