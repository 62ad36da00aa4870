"""DP-SGD in the secure-aggregation ring: DP-FedSGD's local steps with exact integer noise.

Per step: a Poisson batch at rate exactly p; per-record gradients (``torch.func``), each clipped
to C, scaled by 2^b and conditionally rounded PER RECORD, so every record's integer vector has
the encoder's bounds Δ₂, Δ₁; their exact sum clamped per coordinate to what the ring was sized for
(1-Lipschitz, so the step's sensitivities are unchanged, whatever the data set's size); plus this
agent's noise share; then ``θ ← θ − γ·(I_s + n_s)/(B·2^b)``. The agent sends the exact sum of its
S noisy steps, so each step's sum over agents is one subsampled Skellam release
(docs/algorithms.md#dp-fedsgd).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from dpfl.accounting import DpEvent, GaussianEvent, PoissonSampledEvent, SkellamEvent
from dpfl.learning.algorithms import common
from dpfl.learning.algorithms.base import AlgorithmError
from dpfl.secagg.encoding import (
    DEFAULT_KAPPA,
    EncodingConfig,
    bit_budget,
    norm_at_most,
    stochastic_round,
)
from dpfl.secagg.noise import NoiseSpec
from dpfl.secagg.randomness import RandomStream

__all__ = [
    "IntegerSteps",
    "clamped_sum",
    "clip_rows",
    "integer_dp_sgd",
    "required_ring_bits",
    "round_rows",
    "step_event",
]

_MAX_ROUNDING_ATTEMPTS = 10_000


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


def clamped_sum(rows: npt.NDArray[np.int64], limit: int | None) -> npt.NDArray[np.int64]:
    """``Σ_j rows_j`` with every coordinate clamped to ``[−limit, limit]`` (None: unclamped).

    Per coordinate ``|clamp(a + z) − clamp(a)| ≤ |z|``, so adding one row moves the result by at
    most that row in every coordinate, and its L1 and L2 norms bound the move."""
    summed: npt.NDArray[np.int64] = rows.sum(axis=0)
    if limit is None:
        return summed
    out: npt.NDArray[np.int64] = np.clip(summed, -limit, limit)
    return out


def round_rows(
    scaled: npt.NDArray[np.float64], bound: float, stream: RandomStream
) -> npt.NDArray[np.int64]:
    """Conditional stochastic rounding of every row until its L2 norm is ≤ ``bound``.

    Raises:
        AlgorithmError: a row still over the bound after 10 000 draws (impossible for rows of
            norm ≤ C·2^b with the encoder's β).
    """
    n, d = scaled.shape
    out = np.empty((n, d), dtype=np.int64)
    pending = np.arange(n)
    for _ in range(_MAX_ROUNDING_ATTEMPTS):
        if pending.size == 0:
            return out
        rounded = stochastic_round(scaled[pending].reshape(-1), stream).reshape(pending.size, d)
        squares = np.einsum("ij,ij->i", rounded.astype(np.float64), rounded.astype(np.float64))
        slack = squares * (d + 2) * 2.0**-52
        limit = bound * bound
        sure = squares + slack < limit * (1 - 2.0**-51)
        unsure = ~sure & (squares - slack <= limit * (1 + 2.0**-51))
        for i in np.flatnonzero(unsure):
            sure[i] = norm_at_most(rounded[i], bound)
        out[pending[sure]] = rounded[sure]
        pending = pending[~sure]
    raise AlgorithmError("conditional rounding of a record's gradient did not meet its bound")


def _per_sample_gradients(model: Any, names: list[str], xb: Any, yb: Any) -> Any:
    import torch
    from torch.func import functional_call, grad, vmap
    from torch.nn.functional import cross_entropy

    params = {name: p.detach() for name, p in model.named_parameters() if name in names}

    def loss(p: dict[str, Any], x: Any, y: Any) -> Any:
        out = functional_call(model, p, (x.unsqueeze(0),))
        return cross_entropy(out, y.unsqueeze(0))

    grads = vmap(grad(loss), in_dims=(None, 0, 0))(params, xb, yb)
    return torch.cat([grads[name].reshape(xb.shape[0], -1) for name in names], dim=1)


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
    rounding_bound: float,
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
        rounding_bound: Δ₂, the conditional rounding's L2 bound for one record.
        noise: this agent's per-step noise share (ring units).
        stream: the agent's CSPRNG stream (batches, rounding, noise).
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
    sizes = []
    for _ in range(steps):
        chosen = common.poisson_sample(members, sampling_rate, stream)
        sizes.append(len(chosen))
        released = noise.sample(dimension, stream)
        if chosen:
            index = torch.tensor(chosen, dtype=torch.int64)
            try:
                rows = _per_sample_gradients(
                    model, names, xt[index].to(target), yt[index].to(target)
                )
            except RuntimeError as exc:
                raise AlgorithmError(f"per-record gradients failed: {exc}") from None
            clipped = clip_rows(rows.detach().to("cpu", torch.float64).numpy(), clip)
            integers = round_rows(np.ldexp(clipped, scale_bits), rounding_bound, stream)
            released = released + clamped_sum(integers, coordinate_limit)
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
