"""Shamir sharing over GF(2^521 − 1) (docs/secagg.md#shamir)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpfl.secagg import shamir
from dpfl.secagg.errors import InvalidShare, ParameterError
from dpfl.secagg.randomness import SeededRandomSource

P = shamir.PRIME
secrets_st = st.integers(min_value=0, max_value=2**256 - 1)


def _stream(label: str = "shamir"):  # type: ignore[no-untyped-def]
    return SeededRandomSource(b"shamir-test-seed").stream(label)


def test_prime_is_the_mersenne_prime() -> None:
    assert P == 2**521 - 1
    assert pow(3, P - 1, P) == 1  # Fermat witness (P is a known Mersenne prime)


@settings(max_examples=40, deadline=None)
@given(
    secret=secrets_st,
    k=st.integers(min_value=2, max_value=12),
    data=st.data(),
)
def test_any_t_shares_reconstruct(secret: int, k: int, data: st.DataObject) -> None:
    t = data.draw(st.integers(min_value=2, max_value=k))
    xs = data.draw(st.lists(st.integers(1, 10**6), min_size=k, max_size=k, unique=True))
    (ys,) = shamir.share([secret], xs=xs, threshold=t, rng=_stream(str(secret)))
    subset = data.draw(st.lists(st.sampled_from(range(k)), min_size=t, max_size=k, unique=True))
    pairs = [(xs[i], ys[i]) for i in subset]
    assert shamir.reconstruct(pairs, threshold=t) == secret


def test_t_minus_one_shares_say_nothing() -> None:
    """With t−1 shares fixed, every secret is still possible: a polynomial of degree t−1 passes
    through the t−1 known shares and (0, candidate) for any candidate."""
    t, xs = 4, [3, 7, 11, 20]
    (ys,) = shamir.share([12345], xs=xs, threshold=t, rng=_stream())
    known = list(zip(xs[: t - 1], ys[: t - 1], strict=True))
    for candidate in (0, 1, 12345, 2**255):
        extra = (10**9, _through(known, candidate, 10**9))
        assert shamir.reconstruct([*known, extra], threshold=t) == candidate
    with pytest.raises(InvalidShare, match="needed"):
        shamir.reconstruct(known, threshold=t)


def _through(points: list[tuple[int, int]], secret: int, x: int) -> int:
    """y at x of the degree-(len(points)) polynomial through (0, secret) and ``points``."""
    nodes = [(0, secret), *points]
    total = 0
    for j, (xj, yj) in enumerate(nodes):
        num = den = 1
        for m, (xm, _) in enumerate(nodes):
            if m != j:
                num = num * (x - xm) % P
                den = den * (xj - xm) % P
        total = (total + yj * num * pow(den, -1, P)) % P
    return total


def test_every_t_subset_agrees() -> None:
    t, xs = 3, [1, 2, 5, 9, 13]
    (ys,) = shamir.share([987654321], xs=xs, threshold=t, rng=_stream("all"))
    for subset in itertools.combinations(range(5), t):
        assert shamir.reconstruct([(xs[i], ys[i]) for i in subset], threshold=t) == 987654321


def test_reconstruct_many_batches_and_caches() -> None:
    cache = shamir.LagrangeCache()
    secrets = [7, 2**200, 0, 2**256 - 1]
    xs = [4, 8, 15, 16, 23, 42]
    rows = shamir.share(secrets, xs=xs, threshold=4, rng=_stream("many"))
    sets = [
        [(x, y) for x, y in zip(xs, row, strict=True)][i : i + 4]
        for i, row in zip((0, 1, 2, 0), rows, strict=True)
    ]
    assert shamir.reconstruct_many(sets, threshold=4, cache=cache) == secrets
    assert len(cache) == 3  # x-sets (0..3) shared by two secrets, (1..4), (2..5)
    assert shamir.reconstruct_many(sets, threshold=4, cache=cache) == secrets


def test_lagrange_cache_is_bounded() -> None:
    cache = shamir.LagrangeCache(maxsize=2)
    shamir.lagrange_at_zero([(1, 2), (1, 3), (2, 3)], cache=cache)
    assert len(cache) == 2


@pytest.mark.parametrize(
    ("xs", "message"),
    [([1, 1, 2], "duplicate"), ([0, 1, 2], "x-coordinate 0"), ([P, 1, 2], "x-coordinate 0")],
)
def test_duplicate_or_zero_x_is_rejected(xs: list[int], message: str) -> None:
    with pytest.raises(InvalidShare, match=message):
        shamir.share([5], xs=xs, threshold=2, rng=_stream())
    with pytest.raises(InvalidShare, match=message):
        shamir.reconstruct([(x, 1) for x in xs], threshold=3)


def test_bad_parameters() -> None:
    with pytest.raises(ParameterError):
        shamir.share([5], xs=[1, 2, 3], threshold=1, rng=_stream())
    with pytest.raises(ParameterError):
        shamir.share([5], xs=[1, 2, 3], threshold=4, rng=_stream())
    with pytest.raises(ParameterError):
        shamir.share([P], xs=[1, 2, 3], threshold=2, rng=_stream())
    with pytest.raises(InvalidShare, match="outside the field"):
        shamir.reconstruct([(1, P), (2, 0)], threshold=2)


def test_share_encoding() -> None:
    assert len(shamir.encode_share(P - 1)) == shamir.SHARE_BYTES == 66
    assert shamir.decode_share(shamir.encode_share(12345)) == 12345
    with pytest.raises(InvalidShare):
        shamir.decode_share(b"\x00" * 65)
    with pytest.raises(InvalidShare):
        shamir.decode_share(P.to_bytes(66, "big"))
    with pytest.raises(InvalidShare):
        shamir.int_to_secret(2**256)
    assert shamir.secret_to_int(shamir.int_to_secret(2**256 - 1)) == 2**256 - 1
