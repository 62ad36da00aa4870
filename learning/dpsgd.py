"""DP-SGD with Opacus per-sample gradients: the record-level local training of DP-FedSGD.

One step as in docs/algorithms.md#dp-fedsgd: Poisson batch, per-record clipping to ``C``, sum, this
agent's noise (``noise_std``, or integer noise from ``noise_sampler``), divided by the expected
batch size so the sensitivity is not data-dependent. Sampling and noise draw from OS entropy
unless seeded (seeds are for tests only). ``grad_sample_mode`` selects Opacus's per-sample engine
(``ew`` by default, ``hooks``, ``functorch``, ``ghost``); the choice is measured in
docs/performance.md#learning-dp-sgd-step-cost-benchmarksdpsgdpy.
"""

from __future__ import annotations

import copy
import math
import secrets
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn
from torch.nn.functional import cross_entropy

from dpfl.learning.device import select_device
from dpfl.learning.errors import ModelError, TrainingError
from dpfl.learning.models import with_memory_format
from dpfl.learning.params import flatten_parameters
from dpfl.learning.training import LocalUpdate, as_tensors

__all__ = [
    "DEFAULT_GRAD_SAMPLE_MODE",
    "GRAD_SAMPLE_MODES",
    "DpSgdTrainer",
    "GradSampleMode",
    "NoiseSampler",
    "StepStats",
    "check_dp_compatible",
    "dp_sgd_update",
]

GradSampleMode = Literal["hooks", "functorch", "ew", "ghost"]
GRAD_SAMPLE_MODES: tuple[GradSampleMode, ...] = ("hooks", "functorch", "ew", "ghost")
DEFAULT_GRAD_SAMPLE_MODE: GradSampleMode = "ew"
#: Called once per step with the model dimension d; returns d noise values (any float dtype) in
#: the units of the summed clipped gradients, e.g. decoded Skellam noise.
NoiseSampler = Callable[[int], NDArray[Any]]
_STABILITY = 1e-6  # Opacus's clipping denominator offset


def check_dp_compatible(model: nn.Module) -> None:
    """Refuse models Opacus cannot train privately (BatchNorm, unsupported layers, buffers).

    Raises:
        ModelError: listing every problem Opacus's ``ModuleValidator`` found.
    """
    from opacus.validators import ModuleValidator  # deferred: Opacus is slow to import

    errors = ModuleValidator.validate(model, strict=False)
    if errors:
        raise ModelError("model is not DP-SGD compatible: " + "; ".join(str(e) for e in errors))


def _wrap(model: nn.Module, mode: GradSampleMode, clip: float) -> nn.Module:
    # Opacus's per-sample samplers assume NCHW activations: on dpfl's channels-last CNN
    # (dpfl.learning.models) its hooks mix records' gradients and torch's expanded weights fail,
    # so the wrapped model computes in NCHW (test_clipped_sum_matches_the_microbatch_ground_truth)
    with_memory_format(model, torch.contiguous_format)
    if mode in ("hooks", "functorch"):
        from opacus import GradSampleModule

        hooked: nn.Module = GradSampleModule(
            model, batch_first=True, loss_reduction="sum", force_functorch=mode == "functorch"
        )
        return hooked
    if mode == "ew":
        from opacus.grad_sample.gsm_exp_weights import GradSampleModuleExpandedWeights

        expanded: nn.Module = GradSampleModuleExpandedWeights(
            model, batch_first=True, loss_reduction="sum"
        )
        return expanded
    if mode == "ghost":
        from opacus.grad_sample import GradSampleModuleFastGradientClipping

        ghost: nn.Module = GradSampleModuleFastGradientClipping(
            model, batch_first=True, loss_reduction="sum", max_grad_norm=clip
        )
        return ghost
    raise TrainingError(f"unknown grad_sample_mode {mode!r} (expected one of {GRAD_SAMPLE_MODES})")


@dataclass(frozen=True, slots=True)
class StepStats:
    """Diagnostics of one DP-SGD step (local only; NOT private, never send them)."""

    batch_size: int
    loss_sum: float
    clipped: int


class DpSgdTrainer:
    """DP-SGD steps on a private copy of a model (the caller's model is never modified).

    Args:
        model: the starting model (copied, then wrapped for per-sample gradients).
        clip: per-sample L2 clipping bound C.
        learning_rate: step size γ.
        noise_std: per-step std of the Gaussian noise this agent adds to the clipped sum
            (chosen by the algorithm); exclusive with ``noise_sampler``.
        noise_sampler: draws the per-step noise vector instead (e.g. integer noise).
        grad_sample_mode: Opacus engine, see the module docstring.
        device: where to train (default: ``cuda`` when available).
        noise_seed: seed of the Gaussian noise; ``None`` (the default) draws from OS entropy.

    Raises:
        ModelError: the model is not DP-SGD compatible.
        TrainingError: bad hyper-parameters.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        clip: float,
        learning_rate: float,
        noise_std: float | None = None,
        noise_sampler: NoiseSampler | None = None,
        grad_sample_mode: GradSampleMode = DEFAULT_GRAD_SAMPLE_MODE,
        device: str | torch.device | None = None,
        noise_seed: int | None = None,
    ) -> None:
        if not (math.isfinite(clip) and clip > 0):
            raise TrainingError(f"clip must be a positive number, got {clip!r}")
        if not (math.isfinite(learning_rate) and learning_rate > 0):
            raise TrainingError(f"learning_rate must be a positive number, got {learning_rate!r}")
        if (noise_std is None) == (noise_sampler is None):
            raise TrainingError("give exactly one of noise_std or noise_sampler")
        if noise_std is not None and not (math.isfinite(noise_std) and noise_std >= 0):
            raise TrainingError(f"noise_std must be a non-negative number, got {noise_std!r}")
        if grad_sample_mode not in GRAD_SAMPLE_MODES:
            raise TrainingError(
                f"unknown grad_sample_mode {grad_sample_mode!r} "
                f"(expected one of {GRAD_SAMPLE_MODES})"
            )
        check_dp_compatible(model)
        self.device = select_device(device)
        self.clip = float(clip)
        self.learning_rate = float(learning_rate)
        self.noise_std = noise_std
        self.noise_sampler = noise_sampler
        self.mode: GradSampleMode = grad_sample_mode
        self.model = copy.deepcopy(model).to(self.device)
        self.model.train()
        self._wrapped = _wrap(self.model, grad_sample_mode, self.clip)
        self._params = [p for p in self.model.parameters() if p.requires_grad]
        self.dimension = sum(p.numel() for p in self._params)
        seed = noise_seed if noise_seed is not None else secrets.randbits(63)
        self._noise_gen = torch.Generator(device=self.device).manual_seed(seed)

    def _clipped_sum(
        self, xb: torch.Tensor, yb: torch.Tensor
    ) -> tuple[list[torch.Tensor], float, int]:
        n = xb.shape[0]
        for p in self._params:
            p.grad = None
            p.grad_sample = None  # type: ignore[attr-defined]
        if self.mode == "ghost":
            wrapped: Any = self._wrapped
            wrapped.enable_hooks()
            losses = cross_entropy(wrapped(xb), yb, reduction="none")
            # torch.autograd.backward: Tensor.backward itself is unannotated
            torch.autograd.backward(losses.sum(), retain_graph=True)
            factors = wrapped.get_clipping_coef()
            for p in self._params:
                p.grad = None
            wrapped.disable_hooks()
            torch.autograd.backward((factors.detach() * losses).sum())
            sums = [
                p.grad.detach() if p.grad is not None else torch.zeros_like(p) for p in self._params
            ]
            return sums, float(losses.detach().sum()), int((factors < 1).sum())
        loss = cross_entropy(self._wrapped(xb), yb, reduction="sum")
        torch.autograd.backward(loss)
        samples = []
        for p in self._params:
            gs = getattr(p, "grad_sample", None)
            if gs is None:  # a parameter the batch did not reach has zero per-sample gradients
                gs = torch.zeros((n, *p.shape), device=p.device, dtype=p.dtype)
            samples.append(gs.reshape(n, -1))
        sq_norms = torch.stack([torch.linalg.vector_norm(s, dim=1) ** 2 for s in samples]).sum(0)
        factors = (self.clip / (sq_norms.sqrt() + _STABILITY)).clamp(max=1.0)
        sums = [(factors @ s).reshape(p.shape) for s, p in zip(samples, self._params, strict=True)]
        for p in self._params:
            p.grad = None
            p.grad_sample = None  # type: ignore[attr-defined]
        return sums, float(loss.detach()), int((factors < 1).sum())

    def _noise(self) -> list[torch.Tensor]:
        if self.noise_sampler is not None:
            flat = np.asarray(self.noise_sampler(self.dimension), dtype=np.float64)
            if flat.shape != (self.dimension,) or not np.isfinite(flat).all():
                raise TrainingError(
                    f"noise_sampler returned shape {flat.shape}, expected ({self.dimension},) "
                    "finite values"
                )
            noise = torch.from_numpy(flat).to(self.device)
            out, offset = [], 0
            for p in self._params:
                out.append(noise[offset : offset + p.numel()].reshape(p.shape).to(p.dtype))
                offset += p.numel()
            return out
        std = float(self.noise_std or 0.0)
        if std == 0.0:
            return [torch.zeros_like(p) for p in self._params]
        return [
            torch.normal(0.0, std, size=p.shape, generator=self._noise_gen, device=self.device)
            for p in self._params
        ]

    @torch.no_grad()
    def _apply(self, sums: list[torch.Tensor], expected_batch_size: float) -> None:
        for p, s, z in zip(self._params, sums, self._noise(), strict=True):
            p.add_(s + z, alpha=-self.learning_rate / expected_batch_size)

    def step(self, xb: torch.Tensor, yb: torch.Tensor, *, expected_batch_size: float) -> StepStats:
        """One DP-SGD step on an already sampled batch (may be empty: noise only).

        Args:
            xb: the batch's features (any device; moved to the trainer's).
            yb: the batch's labels.
            expected_batch_size: ``p·M``, the normaliser of the noisy sum.
        """
        if not expected_batch_size > 0:
            raise TrainingError("expected_batch_size must be positive")
        n = int(xb.shape[0])
        if n == 0:
            sums, loss_sum, clipped = [torch.zeros_like(p) for p in self._params], 0.0, 0
        else:
            with torch.enable_grad(), warnings.catch_warnings():
                # Opacus's hooks fire on module outputs because inputs need no gradient: expected.
                warnings.filterwarnings("ignore", message="Full backward hook is firing")
                try:
                    sums, loss_sum, clipped = self._clipped_sum(
                        xb.to(self.device, non_blocking=True),
                        yb.to(self.device, non_blocking=True),
                    )
                except (RuntimeError, IndexError) as exc:
                    raise TrainingError(
                        f"DP-SGD step failed on inputs of shape {tuple(xb.shape[1:])} "
                        f"(labels up to {int(yb.max())}): {exc}"
                    ) from None
        self._apply(sums, expected_batch_size)
        return StepStats(batch_size=n, loss_sum=loss_sum, clipped=clipped)

    def trained_model(self) -> nn.Module:
        """A plain (unwrapped) CPU copy of the current model."""
        return copy.deepcopy(self.model).to("cpu")


def dp_sgd_update(
    model: nn.Module,
    x: NDArray[Any],
    y: NDArray[Any],
    *,
    steps: int,
    sampling_rate: float,
    clip: float,
    learning_rate: float,
    noise_std: float | None = None,
    noise_sampler: NoiseSampler | None = None,
    grad_sample_mode: GradSampleMode = DEFAULT_GRAD_SAMPLE_MODE,
    device: str | torch.device | None = None,
    sampling_seed: int | None = None,
    noise_seed: int | None = None,
) -> LocalUpdate:
    """The DP-FedSGD agent's local work: S DP-SGD steps from the global model, returning the delta.

    Privacy bookkeeping (done by the algorithm, not here): each call is S compositions of a
    Poisson-subsampled Gaussian mechanism with rate ``sampling_rate`` and noise multiplier
    ``noise_std / clip`` for this agent alone; what the secure sum of several agents costs is the
    algorithm's accounting (``dpfl.learning.algorithms.dp_fedsgd``, docs/accounting.md).

    Args:
        model: the global model (left unchanged).
        x: local features ``(M, *input_shape)``.
        y: local labels ``(M,)``.
        steps: S, the number of DP-SGD steps.
        sampling_rate: p, each record's inclusion probability per step, in (0, 1].
        clip: per-sample clipping bound C.
        learning_rate: γ.
        noise_std: per-step Gaussian std this agent adds (exclusive with ``noise_sampler``).
        noise_sampler: per-step noise vector source (exclusive with ``noise_std``).
        grad_sample_mode: Opacus engine (``ew``, ``hooks``, ``functorch``, ``ghost``).
        device: training device (default: ``cuda`` when available).
        sampling_seed: seed of the Poisson batch draws (tests only; default OS entropy).
        noise_seed: seed of the Gaussian noise (tests only; default OS entropy).

    Returns:
        The :class:`~dpfl.learning.training.LocalUpdate` (float32 delta, realised batch sizes).

    Raises:
        ModelError: the model is not DP-SGD compatible.
        TrainingError: bad data or hyper-parameters.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise TrainingError(f"steps must be a positive integer, got {steps!r}")
    if not (math.isfinite(sampling_rate) and 0 < sampling_rate <= 1):
        raise TrainingError(f"sampling_rate must lie in (0, 1], got {sampling_rate!r}")
    xt, yt = as_tensors(x, y)
    assert yt is not None
    trainer = DpSgdTrainer(
        model,
        clip=clip,
        learning_rate=learning_rate,
        noise_std=noise_std,
        noise_sampler=noise_sampler,
        grad_sample_mode=grad_sample_mode,
        device=device,
        noise_seed=noise_seed,
    )
    m = xt.shape[0]
    expected = sampling_rate * m
    seed = sampling_seed if sampling_seed is not None else secrets.randbits(63)
    sampler = torch.Generator().manual_seed(seed)
    sizes, loss_sum, clipped = [], 0.0, 0
    for _ in range(steps):
        chosen = torch.nonzero(torch.rand(m, generator=sampler) < sampling_rate).squeeze(1)
        stats = trainer.step(xt[chosen], yt[chosen], expected_batch_size=expected)
        sizes.append(stats.batch_size)
        loss_sum += stats.loss_sum
        clipped += stats.clipped
    before = flatten_parameters(model, dtype=np.float64)
    after = flatten_parameters(trainer.model, dtype=np.float64)
    seen = sum(sizes)
    return LocalUpdate(
        delta=(after - before).astype(np.float32),
        num_samples=m,
        steps=steps,
        mean_loss=loss_sum / seen if seen else float("nan"),
        batch_sizes=tuple(sizes),
        clipped_fraction=clipped / seen if seen else 0.0,
    )
