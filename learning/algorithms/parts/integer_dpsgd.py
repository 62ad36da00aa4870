"""DP-SGD in the secure-aggregation ring: DP-FedSGD's local steps with exact integer noise.

Per step: a Poisson batch at rate exactly p; per-record gradients (``torch.func``), each clipped
to C and scaled by 2^b, then truncated toward zero to a fixed point of f fractional bits (which
never raises a record's norm); their exact sum clamped per coordinate to what the ring was sized
for (1-Lipschitz); that sum stochastically rounded ONCE, ``⌊(A + U)/2^f⌋`` with U uniform on f
bits; plus this agent's noise share; then ``θ ← θ − γ·(I_s + n_s)/(B·2^b)``. Coupling the two
neighbours through the same U bounds one record's move by ``c + √d`` in L2 and ``c·√d + d`` in L1
(:func:`step_sensitivities`; docs/accounting.md#dp-fedsgd-one-rounding-per-step). The agent sends
the exact sum of its S noisy steps, so each step's sum over agents is one subsampled Skellam
release (docs/algorithms.md#dp-fedsgd).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from dpfl.accounting import DpEvent, GaussianEvent, PoissonSampledEvent, SkellamEvent
from dpfl.learning.algorithms.base import AlgorithmError
from dpfl.learning.algorithms.parts import common
from dpfl.mechanisms.encoding import DEFAULT_KAPPA, EncodingConfig, bit_budget
from dpfl.mechanisms.noise import NoiseSpec
from dpfl.secagg.randomness import RandomStream

__all__ = [
    "IntegerSteps",
    "clamp",
    "clip_rows",
    "fixed_point_rows",
    "fixed_point_sum",
    "integer_dp_sgd",
    "required_ring_bits",
    "round_sum",
    "step_event",
    "step_sensitivities",
]

#: Fractional bits of the fixed point in which a step's records are summed exactly.
FRACTION_BITS = 16
#: Every fixed-point sum stays below 2^62 in magnitude (int64 without overflow).
_SUM_BITS = 62
#: Records in every batched pass of the per-record gradients (the last pass padded to this
#: size): each record's float32 row then comes from the same kernels whatever the batch, so
#: removing a record leaves every other row bit for bit
#: (docs/accounting.md#dp-fedsgd-one-rounding-per-step). vmap's dispatch costs per pass: the
#: cnn's 600-record step takes 0.30 s in passes of 128 and 0.40 s in passes of 32.
GRADIENT_CHUNK = 128
#: Rows converted to float64 at once: a whole batch of a CNN is hundreds of MB of float64 rows,
#: freshly mapped (and page-faulted) at every step; chunks stay in the heap.
RECORD_CHUNK = 32


@dataclass(frozen=True, slots=True)
class IntegerSteps:
    """The result of the local steps.

    Attributes:
        total: ``Z = Σ_s (I_s + n_s)`` (int64), what the agent sends.
        batch_sizes: the realised Poisson batch sizes (local diagnostic, NOT private).
    """

    total: npt.NDArray[np.int64]
    batch_sizes: tuple[int, ...]


def clip_rows(rows: npt.NDArray[np.float64], clip: float) -> npt.NDArray[np.float64]:
    """Each row ``v·min(1, C/‖v‖)``, with the encoder's margin so the TRUE norm is ≤ C."""
    margin = (rows.shape[1] + 8) * 2.0**-52
    norms = np.linalg.norm(rows, axis=1)
    over = norms > clip * (1 - margin)
    factor = np.where(over, clip * (1 - 3 * margin) / np.where(over, norms, 1.0), 1.0)
    out: npt.NDArray[np.float64] = rows * factor[:, None]
    return out


def clamp(summed: npt.NDArray[np.int64], limit: int | None) -> npt.NDArray[np.int64]:
    """Every coordinate of a step's integer sum clamped to ``[−limit, limit]`` (None: unchanged).

    Per coordinate ``|clamp(a + z) − clamp(a)| ≤ |z|``, so adding one record's row to the sum
    moves the result by at most that row in every coordinate, and its L1 and L2 norms bound the
    move."""
    if limit is None:
        return summed
    out: npt.NDArray[np.int64] = np.clip(summed, -limit, limit)
    return out


def step_sensitivities(*, clip: float, scale_bits: int, dimension: int) -> tuple[float, float]:
    """(Δ₁, Δ₂) of one record in one step's rounded sum: ``c·√d + d`` and ``c + √d``, c = C·2^b.

    The step rounds the fixed-point sum once (:func:`round_sum`); with the two neighbours coupled
    through the same draws every coordinate moves by at most ⌈|δ_i|⌉ ≤ |δ_i| + 1 where the record
    moves it by δ_i, and by 0 elsewhere. These are the encoder's bounds without conditional
    rounding (``rounding_beta = 0``)."""
    probe = EncodingConfig(clip=clip, scale_bits=scale_bits, ring_bits=64, rounding_beta=0.0)
    return probe.rounded_l1_bound(dimension), probe.rounded_l2_bound(dimension)


def fraction_bits(records: int, coordinate_bound: int) -> int:
    """f ≤ :data:`FRACTION_BITS` such that ``records`` rows of magnitude ≤ ``coordinate_bound``
    (ring units), in fixed point of f fractional bits, sum below 2^62.

    Raises:
        AlgorithmError: even whole units would overflow (more than 2^62/⌈C·2^b⌉ records).
    """
    headroom = _SUM_BITS - (max(records, 1) * coordinate_bound).bit_length()
    if headroom < 0:
        raise AlgorithmError(
            f"{records} records at {coordinate_bound} units per coordinate overflow 64 bits"
        )
    return min(FRACTION_BITS, headroom)


def fixed_point_rows(scaled: npt.NDArray[np.float64], bits: int) -> npt.NDArray[np.int64]:
    """Every value times 2^``bits``, truncated toward zero: |out_i| ≤ |v_i|·2^bits, so no row's
    norm grows (exact for |v|·2^bits < 2^63: the product by a power of two is exact and the
    integer cast truncates)."""
    product = scaled * math.ldexp(1.0, bits)
    out: npt.NDArray[np.int64] = product.astype(np.int64)
    return out


def round_sum(
    fixed: npt.NDArray[np.int64], bits: int, stream: RandomStream
) -> npt.NDArray[np.int64]:
    """``⌊(A + U)/2^bits⌋`` per coordinate, U uniform on ``bits`` bits: A/2^bits rounded up with
    probability exactly its fractional part (unbiased), and monotone in A for fixed U."""
    if bits == 0:
        return fixed.copy()
    draws = (stream.uint64(fixed.size) >> np.uint64(64 - bits)).astype(np.int64)
    out: npt.NDArray[np.int64] = np.right_shift(fixed + draws, bits)
    return out


def _per_sample_gradients(model: Any, names: list[str], xb: Any, yb: Any) -> Any:
    import torch
    from torch.func import functional_call, grad, vmap
    from torch.nn.functional import cross_entropy

    params = {name: p.detach() for name, p in model.named_parameters() if name in names}

    def loss(p: dict[str, torch.Tensor], x: Any, y: Any) -> Any:
        out = functional_call(model, p, (x.unsqueeze(0),))
        return cross_entropy(out, y.unsqueeze(0))

    grads = vmap(grad(loss), in_dims=(None, 0, 0))(params, xb, yb)
    return torch.cat([grads[name].reshape(xb.shape[0], -1) for name in names], dim=1)


def fixed_point_sum(
    model: Any,
    names: list[str],
    x: Any,
    y: Any,
    *,
    clip: float,
    bits: int,
    chunk: int = GRADIENT_CHUNK,
) -> npt.NDArray[np.int64]:
    """``Σ_j fixed_point_rows(clip_rows(g_j))``: the exact integer sum of the records' clipped
    fixed-point gradients. The gradients come in passes of exactly ``chunk`` records, the last
    pass padded with zero records whose rows are dropped, and each pass's rows are converted
    :data:`RECORD_CHUNK` at a time (integer sums do not depend on the grouping).

    Raises:
        AlgorithmError: no records, or a chunk below 1.
    """
    import torch

    if chunk < 1:
        raise AlgorithmError(f"chunk must be >= 1, got {chunk}")
    records = int(x.shape[0])
    total: npt.NDArray[np.int64] | None = None
    for start in range(0, records, chunk):
        real = min(chunk, records - start)
        xb, yb = x[start : start + real], y[start : start + real]
        if real < chunk:
            xb = torch.cat([xb, xb.new_zeros((chunk - real, *xb.shape[1:]))])
            yb = torch.cat([yb, yb.new_zeros(chunk - real)])
        rows = _per_sample_gradients(model, names, xb, yb).detach()
        for lo in range(0, real, RECORD_CHUNK):
            hi = min(lo + RECORD_CHUNK, real)
            part64 = rows[lo:hi].to("cpu", torch.float64).numpy()
            part = fixed_point_rows(clip_rows(part64, clip), bits).sum(axis=0)
            total = part if total is None else total + part
    if total is None:
        raise AlgorithmError("no records to sum")
    return total


def integer_dp_sgd(
    model: Any,
    x: npt.ArrayLike,
    y: npt.ArrayLike,
    *,
    steps: int,
    sampling_rate: float,
    clip: float,
    learning_rate: float,
    normalizer: float,
    scale_bits: int,
    noise: NoiseSpec,
    stream: RandomStream,
    device: str = "cpu",
    coordinate_limit: int | None = None,
) -> IntegerSteps:
    """Run the local steps on ``model`` IN PLACE (see the module docstring).

    Args:
        model: the global model (a copy the caller may modify), trained in place.
        x: local features ``(M, *input_shape)``.
        y: local labels ``(M,)``.
        steps: S ≥ 1.
        sampling_rate: p in (0, 1].
        clip: C > 0.
        learning_rate: γ > 0.
        normalizer: B > 0, the common expected batch size.
        scale_bits: b.
        noise: this agent's per-step noise share (ring units).
        stream: the agent's CSPRNG stream (batches, rounding draws, noise).
        device: where gradients are computed.
        coordinate_limit: L, the clamp of every coordinate of each step's integer sum (None:
            no clamp).

    Raises:
        AlgorithmError: bad data or hyper-parameters, or inputs the model cannot take.
    """
    import torch

    from dpfl.learning.errors import LearningError
    from dpfl.learning.training import as_tensors

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise AlgorithmError(f"steps must be an integer >= 1, got {steps!r}")
    if coordinate_limit is not None and (
        isinstance(coordinate_limit, bool)
        or not isinstance(coordinate_limit, int)
        or coordinate_limit < 1
    ):
        raise AlgorithmError(f"coordinate_limit must be an integer >= 1, got {coordinate_limit!r}")
    for name, value in (
        ("clip", clip),
        ("learning_rate", learning_rate),
        ("normalizer", normalizer),
    ):
        if not (math.isfinite(value) and value > 0):
            raise AlgorithmError(f"{name} must be a positive number, got {value!r}")
    try:
        xt, yt = as_tensors(np.asarray(x), np.asarray(y))
    except LearningError as exc:
        raise AlgorithmError(f"local data: {exc}") from exc
    assert yt is not None
    target = torch.device(device)
    model.to(target).train()
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in model.named_parameters() if p.requires_grad]
    dimension = sum(p.numel() for p in params)
    step_size = learning_rate / (normalizer * math.ldexp(1.0, scale_bits))
    total = np.zeros(dimension, dtype=np.int64)
    members = list(range(int(yt.shape[0])))
    # a pass size from the task alone (B is common to the agents): never a function of the data
    passes = min(GRADIENT_CHUNK, max(1, math.ceil(normalizer)))
    sizes = []
    for _ in range(steps):
        chosen = common.poisson_sample(members, sampling_rate, stream)
        sizes.append(len(chosen))
        released = noise.sample(dimension, stream)
        if chosen:
            index = torch.tensor(chosen, dtype=torch.int64)
            bits = fraction_bits(len(chosen), math.ceil(math.ldexp(clip, scale_bits)))
            try:
                summed = fixed_point_sum(
                    model,
                    names,
                    xt[index].to(target),
                    yt[index].to(target),
                    clip=clip,
                    bits=scale_bits + bits,
                    chunk=passes,
                )
            except RuntimeError as exc:
                raise AlgorithmError(f"per-record gradients failed: {exc}") from None
            limit = (
                None if coordinate_limit is None else min(coordinate_limit << bits, 1 << _SUM_BITS)
            )
            released = released + round_sum(clamp(summed, limit), bits, stream)
        total += released
        update = torch.from_numpy(released.astype(np.float64) * -step_size)
        with torch.no_grad():
            offset = 0
            for p in params:
                n = p.numel()
                p.add_(update[offset : offset + n].reshape(p.shape).to(target, p.dtype))
                offset += n
    return IntegerSteps(total=total, batch_sizes=tuple(sizes))


def step_event(
    *, noise: str, total: float, l1: float, l2: float, dimension: int, rate: float
) -> DpEvent:
    """One step's release over the union of the agents' data (ring units)."""
    inner: DpEvent
    if noise == "skellam":
        inner = SkellamEvent(mu=total, l1_sensitivity=l1, l2_sensitivity=l2, dimension=dimension)
    else:
        inner = GaussianEvent(sigma=total, sensitivity=l2)
    return PoissonSampledEvent(rate, inner) if rate < 1.0 else inner


def required_ring_bits(
    *, participants: int, steps: int, max_local_size: int, config: EncodingConfig
) -> int:
    """The smallest r that ``participants`` vectors ``Z_i`` of S steps cannot wrap.

    Per coordinate ``|Z_i| ≤ S·M_max·⌈C·2^b⌉`` (every record's rounded coordinate is at most
    ``⌈C·2^b⌉``, a batch holds at most M_max records), plus κ standard deviations of the S steps'
    summed noise of ``participants`` agents (``config.noise`` is one agent's per-step share).
    """
    bound = steps * max_local_size * config.coordinate_bound
    std = math.sqrt(steps) * config.noise.summed_std(participants)
    return bit_budget(
        summands=participants, coordinate_bound=bound, noise_std=std, kappa=DEFAULT_KAPPA
    )
