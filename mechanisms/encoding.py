"""Real vectors to the ring Z_{2^r} and back (Kairouz, Liu & Steinke 2021, DDG).

``encode(x) = (round_cond(2^b · clip_S(x)) + noise) mod 2^r`` and ``decode(z) = centre(z)/2^b``.
Conditional stochastic rounding makes Δ₂ an exact L2 sensitivity of one agent's integer vector
(:meth:`EncodingConfig.rounded_l2_bound`), and :func:`bit_budget` picks the smallest ring in
which N vectors plus κ = 10 standard deviations of their summed noise cannot wrap
(:meth:`EncodingConfig.check_no_wrap` refuses any that could). Formulas:
docs/mechanisms.md#encoding-for-secure-aggregation.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt

from dpfl.secagg.errors import EncodingOverflow, ParameterError, SecAggError
from dpfl.secagg.prg import MAX_RING_BITS
from dpfl.secagg.randomness import RandomStream

from .noise import NoiseSpec

DEFAULT_KAPPA = 10.0
#: DDG's default failure probability of one rounding attempt (about 2.5 attempts on average).
DEFAULT_ROUNDING_BETA = math.exp(-0.5)
_MAX_ROUNDING_ATTEMPTS = 10_000
_MAX_SCALE_BITS = 62


def bit_budget(
    *, summands: int, coordinate_bound: int, noise_std: float, kappa: float = DEFAULT_KAPPA
) -> int:
    """The smallest r with 2^r > 2(N·B + κσ_Z).

    Args:
        summands: N, the number of vectors summed.
        coordinate_bound: B, the largest |coordinate| of one encoded vector before noise.
        noise_std: σ_Z, the standard deviation of the *summed* noise per coordinate.
        kappa: how many standard deviations of noise the margin covers.

    Raises:
        ParameterError: negative or non-finite inputs.
    """
    if isinstance(summands, bool) or not isinstance(summands, int) or summands < 1:
        raise ParameterError(f"summands must be an integer ≥ 1, got {summands!r}")
    if isinstance(coordinate_bound, bool) or not isinstance(coordinate_bound, int):
        raise ParameterError(f"coordinate bound must be an integer, got {coordinate_bound!r}")
    if coordinate_bound < 0:
        raise ParameterError(f"coordinate bound must be ≥ 0, got {coordinate_bound}")
    if not (math.isfinite(noise_std) and noise_std >= 0):
        raise ParameterError(f"noise std must be finite and ≥ 0, got {noise_std}")
    if not (math.isfinite(kappa) and kappa >= 0):
        raise ParameterError(f"kappa must be finite and ≥ 0, got {kappa}")
    # 2(N·B + ⌈κσ⌉) is an integer ≥ the real bound; 2^r must exceed it.
    need = 2 * (summands * coordinate_bound + math.ceil(kappa * noise_std))
    return max(1, need.bit_length())


@dataclass(frozen=True, slots=True)
class EncodingConfig:
    """How agents turn a real vector into ring elements; carried as ``SecAggSetup.encoding_json``.

    Attributes:
        clip: S, the L2 norm every vector is clipped to (> 0).
        scale_bits: b; values are multiplied by 2^b before rounding.
        ring_bits: r; values live in Z_{2^r}, 1 ≤ r ≤ 64.
        noise: each agent's integer noise (in scaled units).
        rounding_beta: β of conditional rounding in [0, 1); 0 disables re-drawing.
    """

    clip: float
    scale_bits: int
    ring_bits: int
    noise: NoiseSpec = field(default_factory=NoiseSpec.none)
    rounding_beta: float = DEFAULT_ROUNDING_BETA

    def __post_init__(self) -> None:
        if not (isinstance(self.clip, int | float) and math.isfinite(self.clip) and self.clip > 0):
            raise ParameterError(f"clip must be a finite number > 0, got {self.clip!r}")
        sb = self.scale_bits
        if isinstance(sb, bool) or not isinstance(sb, int) or not 0 <= sb <= _MAX_SCALE_BITS:
            raise ParameterError(f"scale_bits must be an integer in [0, 62], got {sb!r}")
        rb = self.ring_bits
        if isinstance(rb, bool) or not isinstance(rb, int) or not 1 <= rb <= MAX_RING_BITS:
            raise ParameterError(f"ring_bits must be an integer in [1, 64], got {rb!r}")
        if not isinstance(self.noise, NoiseSpec):
            raise ParameterError(f"noise must be a NoiseSpec, got {self.noise!r}")
        if self.scaled_clip >= 2.0**62:
            raise ParameterError(f"clip·2^scale_bits = {self.scaled_clip:.3g} must stay below 2^62")
        beta = self.rounding_beta
        if not (isinstance(beta, int | float) and 0 <= beta < 1):
            raise ParameterError(f"rounding_beta must lie in [0, 1), got {beta!r}")

    @classmethod
    def for_summands(
        cls,
        *,
        clip: float,
        scale_bits: int,
        summands: int,
        noise: NoiseSpec | None = None,
        kappa: float = DEFAULT_KAPPA,
        rounding_beta: float = DEFAULT_ROUNDING_BETA,
    ) -> EncodingConfig:
        """The config with the smallest ring that ``summands`` vectors cannot wrap.

        Raises:
            EncodingOverflow: even 64 bits are too few.
        """
        noise = NoiseSpec.none() if noise is None else noise
        probe = cls(
            clip=clip, scale_bits=scale_bits, ring_bits=64, noise=noise, rounding_beta=rounding_beta
        )
        bits = probe.required_ring_bits(summands, kappa=kappa)
        if bits > MAX_RING_BITS:
            raise EncodingOverflow(
                f"{summands} summands of bound {probe.coordinate_bound} with noise std "
                f"{noise.summed_std(summands):.3g} need {bits} ring bits (> 64)"
            )
        return cls(
            clip=clip,
            scale_bits=scale_bits,
            ring_bits=bits,
            noise=noise,
            rounding_beta=rounding_beta,
        )

    @property
    def scaled_clip(self) -> float:
        """c = S·2^b, the L2 bound of a scaled vector before rounding."""
        return math.ldexp(self.clip, self.scale_bits)

    @property
    def coordinate_bound(self) -> int:
        """B = ⌈S·2^b⌉ ≥ |z_i| for every coordinate of an encoded vector before noise."""
        return math.ceil(self.scaled_clip)

    def rounded_l2_bound(self, dimension: int) -> float:
        """Δ₂: the L2 sensitivity of one agent's rounded integer vector (DDG Theorem 1)."""
        _check_dimension(dimension)
        c, d = self.scaled_clip, float(dimension)
        bound = c + math.sqrt(d)
        if self.rounding_beta > 0:
            sq = (
                c * c
                + d / 4
                + math.sqrt(2 * math.log(1 / self.rounding_beta)) * (c + math.sqrt(d) / 2)
            )
            bound = min(bound, math.sqrt(sq))
        return bound

    def rounded_l1_bound(self, dimension: int) -> float:
        """Δ₁ = Δ₂·min(√d, Δ₂): integer coordinates have |z_i| ≤ z_i²."""
        l2 = self.rounded_l2_bound(dimension)
        return l2 * min(math.sqrt(dimension), l2)

    def required_ring_bits(self, summands: int, *, kappa: float = DEFAULT_KAPPA) -> int:
        """The smallest r that ``summands`` encoded vectors plus their noise cannot wrap."""
        return bit_budget(
            summands=summands,
            coordinate_bound=self.coordinate_bound,
            noise_std=self.noise.summed_std(summands),
            kappa=kappa,
        )

    def check_no_wrap(self, summands: int, *, kappa: float = DEFAULT_KAPPA) -> None:
        """Refuse this config for ``summands`` vectors when the sum could wrap.

        Raises:
            EncodingOverflow: 2^r ≤ 2(N·B + κσ_Z).
        """
        need = self.required_ring_bits(summands, kappa=kappa)
        if need > self.ring_bits:
            raise EncodingOverflow(
                f"ring of {self.ring_bits} bits is too small for {summands} summands "
                f"(bound {self.coordinate_bound}, summed noise std "
                f"{self.noise.summed_std(summands):.3g}, κ={kappa}): {need} bits needed"
            )

    def check_round(self, *, ring_bits: int, summands: int, kappa: float = DEFAULT_KAPPA) -> None:
        """Refuse this config for a summation over Z_{2^ring_bits} of ``summands`` vectors: the
        summation's ring must be the encoding's, and the sum must not wrap it. Whoever puts an
        encoding beside a summation's parameters (the round setup, the agent reading it) calls
        this, since the summation itself only adds ring elements.

        Raises:
            ParameterError: another ring. EncodingOverflow: the sum could wrap.
        """
        if self.ring_bits != ring_bits:
            raise ParameterError(
                f"encoding ring ({self.ring_bits} bits) differs from the round's ({ring_bits} bits)"
            )
        self.check_no_wrap(summands, kappa=kappa)

    def to_dict(self) -> dict[str, Any]:
        return {
            "clip": self.clip,
            "scale_bits": self.scale_bits,
            "ring_bits": self.ring_bits,
            "noise": self.noise.to_dict(),
            "rounding_beta": self.rounding_beta,
        }

    def to_json(self) -> str:
        """Canonical JSON (sorted keys) for ``SecAggSetup.encoding_json``."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: Any) -> EncodingConfig:
        keys = {"clip", "scale_bits", "ring_bits", "noise", "rounding_beta"}
        if not isinstance(data, dict) or set(data) != keys:
            raise ParameterError(f"encoding must be an object with exactly the keys {sorted(keys)}")
        return cls(
            clip=data["clip"],
            scale_bits=data["scale_bits"],
            ring_bits=data["ring_bits"],
            noise=NoiseSpec.from_dict(data["noise"]),
            rounding_beta=data["rounding_beta"],
        )

    @classmethod
    def from_json(cls, text: str) -> EncodingConfig:
        """Inverse of :meth:`to_json`; raises :class:`ParameterError` naming what is wrong."""
        try:
            data = json.loads(text)
        except (TypeError, ValueError) as exc:
            raise ParameterError(f"encoding_json is not valid JSON: {exc}") from exc
        return cls.from_dict(data)


def _check_dimension(dimension: int) -> None:
    if isinstance(dimension, bool) or not isinstance(dimension, int) or dimension < 1:
        raise ParameterError(f"dimension must be an integer ≥ 1, got {dimension!r}")


def _as_vector(values: npt.ArrayLike) -> npt.NDArray[np.float64]:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ParameterError(f"expected a non-empty 1-D vector, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ParameterError("vector contains NaN or infinity")
    return arr


def _l2_norm(arr: npt.NDArray[np.float64]) -> float:
    """‖v‖₂ by numpy's pairwise summation of squares (relative error within (d + 8)·2^−52).

    Not ``np.linalg.norm``: for a vector that is ``sqrt(dot(v, v))`` through BLAS, whose worker
    threads spin (a process hosting many agents on few cores then waits milliseconds for a
    microsecond reduction), and whose squares overflow to ``inf`` for entries above ~1e154, which
    would clip such a vector to zero. Squares that overflow are summed after scaling by the
    largest magnitude (one more rounding per entry, inside the margin's +8).
    """
    with np.errstate(over="ignore"):
        squares = float(np.add.reduce(arr * arr))
    if math.isfinite(squares):
        return math.sqrt(squares)
    largest = float(np.max(np.abs(arr)))
    scaled = arr / largest
    return largest * math.sqrt(float(np.add.reduce(scaled * scaled)))


def clip_l2(values: npt.ArrayLike, clip: float) -> npt.NDArray[np.float64]:
    """v·min(1, S/‖v‖₂), with a margin that keeps the *true* norm ≤ S despite float rounding.

    The computed norm is within a relative (d + 8)·2^−52 of the true one, so vectors within
    that margin of S are scaled to S·(1 − margin); every coordinate then obeys |v_i| ≤ S and the
    bounds B = ⌈S·2^b⌉ and Δ₂ hold exactly.
    """
    arr = _as_vector(values)
    margin = (arr.size + 8) * 2.0**-52
    norm = _l2_norm(arr)
    if norm > clip * (1 - margin):
        return arr * (clip * (1 - 3 * margin) / norm)
    return arr.copy()


def stochastic_round(
    values: npt.NDArray[np.float64], stream: RandomStream
) -> npt.NDArray[np.int64]:
    """⌊v⌋ + Bernoulli(v − ⌊v⌋), the Bernoulli decided by a 64-bit uniform (bias < 2^−64)."""
    floor = np.floor(values)
    frac = values - floor  # exact in binary floating point
    threshold = np.ceil(np.ldexp(frac, 64))  # exact: scaling by a power of two
    draws = stream.uint64(values.size)
    up = draws < threshold.astype(np.uint64)  # frac < 1, so threshold ≤ 2^64 − 2^11
    return floor.astype(np.int64) + up.astype(np.int64)


def encode(
    values: npt.ArrayLike, *, config: EncodingConfig, stream: RandomStream, add_noise: bool = True
) -> npt.NDArray[np.uint64]:
    """clip → scale → conditional stochastic rounding → + noise → mod 2^r.

    Args:
        values: the real vector.
        config: the round's encoding.
        stream: randomness for rounding and noise (a CSPRNG stream).
        add_noise: False only for tests and for noise-free (non-DP) aggregation.

    Raises:
        ParameterError: not a finite 1-D vector.
        SecAggError: conditional rounding failed 10 000 times (impossible unless β is near 1).
    """
    arr = clip_l2(values, config.clip)
    scaled = np.ldexp(arr, config.scale_bits)
    # with β = 0 the bound c + √d holds for every rounding: ‖z‖ ≤ ‖v‖ + ‖z − v‖ < c + √d
    bound = config.rounded_l2_bound(arr.size) if config.rounding_beta > 0 else None
    for _ in range(_MAX_ROUNDING_ATTEMPTS):
        rounded = stochastic_round(scaled, stream)
        if bound is None or norm_at_most(rounded, bound):
            break
    else:
        raise SecAggError("conditional rounding did not meet the norm bound")
    if add_noise:
        rounded = rounded + config.noise.sample(arr.size, stream)
    return to_ring(rounded, config.ring_bits)


def norm_at_most(values: npt.NDArray[np.int64], bound: float) -> bool:
    """‖z‖₂ ≤ bound for an integer vector, decided exactly.

    The float sum of squares (relative error ≤ (d + 2)·2^−52) settles all but borderline cases;
    those are settled with Python integers against the exact square of the float ``bound``, so
    the sensitivity the accountant is given is never exceeded.
    """
    as_float = values.astype(np.float64)
    squares = float(np.add.reduce(as_float * as_float))
    slack = squares * (values.size + 2) * 2.0**-52
    limit = bound * bound
    if squares + slack < limit * (1 - 2.0**-51):
        return True
    if squares - slack > limit * (1 + 2.0**-51):
        return False
    return sum(int(v) * int(v) for v in values.tolist()) <= Fraction(bound) ** 2


def to_ring(values: npt.NDArray[np.int64], ring_bits: int) -> npt.NDArray[np.uint64]:
    """Signed integers mod 2^r, as uint64 (two's complement wrap, then mask)."""
    out = values.astype(np.int64).view(np.uint64).copy()
    if ring_bits < 64:
        out &= np.uint64((1 << ring_bits) - 1)
    return out


def centre(values: npt.ArrayLike, ring_bits: int) -> npt.NDArray[np.int64]:
    """Z_{2^r} → [−2^{r−1}, 2^{r−1}) as int64."""
    arr = np.asarray(values, dtype=np.uint64)
    if ring_bits < 64:
        mask = np.uint64((1 << ring_bits) - 1)
        if (arr & ~mask).any():
            raise EncodingOverflow(f"values do not fit in {ring_bits} bits")
        half = np.uint64(1 << (ring_bits - 1))
        shifted = (arr + half) & mask  # x + R/2 mod R, in [0, R)
        return shifted.astype(np.int64) - np.int64(1 << (ring_bits - 1))
    return arr.view(np.int64).copy()


def decode(values: npt.ArrayLike, *, config: EncodingConfig) -> npt.NDArray[np.float64]:
    """The real sum: centre the ring sum and divide by 2^b."""
    return np.ldexp(centre(values, config.ring_bits).astype(np.float64), -config.scale_bits)
