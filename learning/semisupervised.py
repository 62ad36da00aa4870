"""Semi-supervised training of the voting algorithms' student, and image augmentation.

The student of PATE-FL and Private-kNN-FL sees a few hundred noisy pseudo-labels and a few
thousand unlabeled public records. Training on the labels alone wastes the pool; these routines
use it (consistency training, VAT, self-training). Everything here reads only public records and
already-released labels, so it is post-processing and costs no privacy
(docs/algorithms.md#semi-supervised-student). Every run is a pure function of its seed on a given
device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn
from torch.nn import functional

from dpfl.learning.device import select_device
from dpfl.learning.errors import TrainingError

__all__ = [
    "Augmenter",
    "SemiSupervisedReport",
    "StudentMethod",
    "train_semi_supervised",
    "views",
]

StudentMethod = Literal["supervised", "consistency", "vat", "self-training"]


@dataclass(frozen=True, slots=True)
class Augmenter:
    """Random affine jitter of image batches ``(n, C, H, W)``: shifts of up to ``shift`` pixels,
    rotations of up to ``rotate`` degrees, scaling by up to ``1 ± scale``. Flat records
    ``(n, d)`` get Gaussian jitter of std ``0.05·shift`` instead (no geometry to use)."""

    shift: float = 2.0
    rotate: float = 0.0
    scale: float = 0.0

    def __call__(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        if self.shift == 0 and self.rotate == 0 and self.scale == 0:
            return x
        n = x.shape[0]
        if x.ndim != 4:
            noise = torch.randn(x.shape, generator=generator, device="cpu").to(x.device)
            return x + 0.05 * self.shift * noise
        h, w = x.shape[2], x.shape[3]

        def uniform(bound: float) -> torch.Tensor:
            return (torch.rand(n, generator=generator) * 2.0 - 1.0) * bound

        angle = uniform(math.radians(self.rotate))
        zoom = 1.0 + uniform(self.scale)
        # affine_grid works in [-1, 1] coordinates: a shift of s pixels is 2s/size there
        tx, ty = uniform(2.0 * self.shift / w), uniform(2.0 * self.shift / h)
        cos, sin = torch.cos(angle) / zoom, torch.sin(angle) / zoom
        theta = torch.stack(
            [torch.stack([cos, -sin, tx], dim=1), torch.stack([sin, cos, ty], dim=1)], dim=1
        ).to(x.device, x.dtype)
        grid = functional.affine_grid(theta, list(x.shape), align_corners=False)
        return functional.grid_sample(x, grid, padding_mode="zeros", align_corners=False)


def views(shape: tuple[int, ...]) -> tuple[Augmenter, Augmenter]:
    """The weak view (labelled batches, pseudo-labelling) and the strong view (the consistency
    target) for records of ``shape``: shifts of 1/14 and 3/28 of the side (2 and 3 pixels on
    28×28 images), the strong one also rotated by up to 15° and scaled by up to ±10 %."""
    side = min(shape[-2:]) if len(shape) == 3 else 28
    return (
        Augmenter(shift=side / 14.0),
        Augmenter(shift=3.0 * side / 28.0, rotate=15.0, scale=0.1),
    )


@dataclass(frozen=True, slots=True)
class SemiSupervisedReport:
    """What a student run did (diagnostics; the pool is public, so they may be logged)."""

    steps: int
    mean_loss: float
    confident_fraction: float
    #: the trained model's accuracy on its own labelled records (no augmentation)
    labelled_fit: float = 1.0
    #: how many times training collapsed and started again (:func:`train_semi_supervised`)
    restarts: int = 0


def _forward(model: nn.Module, xb: torch.Tensor) -> torch.Tensor:
    logits: torch.Tensor = model(xb)
    return logits


def _kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    p = functional.softmax(p_logits, dim=1)
    return (
        (p * (functional.log_softmax(p_logits, dim=1) - functional.log_softmax(q_logits, dim=1)))
        .sum(1)
        .mean()
    )


def _vat_loss(
    model: nn.Module, xb: torch.Tensor, epsilon: float, generator: torch.Generator
) -> torch.Tensor:
    """Virtual adversarial loss (Miyato et al. 2018): one power iteration, radius ``epsilon``."""
    with torch.no_grad():
        clean = _forward(model, xb)
    d = torch.randn(xb.shape, generator=generator).to(xb.device)
    dims = tuple(range(1, xb.ndim))

    def unit(v: torch.Tensor) -> torch.Tensor:
        return v / (v.pow(2).sum(dim=dims, keepdim=True).sqrt() + 1e-12)

    d = (1e-6 * unit(d)).requires_grad_(True)
    (grad,) = torch.autograd.grad(_kl(clean, _forward(model, xb + d)), [d])
    r_adv = epsilon * unit(grad.detach())
    return _kl(clean, _forward(model, xb + r_adv))


def _check(x: NDArray[Any], y: NDArray[Any], pool: NDArray[Any]) -> None:
    if x.shape[0] == 0 or x.shape[0] != y.shape[0]:
        raise TrainingError(f"{x.shape[0]} labelled records but {y.shape[0]} labels")
    if pool.shape[1:] != x.shape[1:]:
        raise TrainingError(
            f"unlabeled records of shape {pool.shape[1:]} do not match the labelled {x.shape[1:]}"
        )
    if not np.issubdtype(y.dtype, np.integer) or y.min() < 0:
        raise TrainingError("labels must be non-negative integers")


#: Restart k draws its batches and augmentations from seed + k·stride.
_RESTART_SEED_STRIDE = 1_000_003


def train_semi_supervised(
    model: nn.Module,
    x: NDArray[Any],
    y: NDArray[Any],
    unlabeled: NDArray[Any],
    *,
    method: StudentMethod,
    steps: int,
    batch_size: int = 32,
    unlabeled_ratio: int = 3,
    learning_rate: float = 0.1,
    momentum: float = 0.9,
    weight_decay: float = 5e-4,
    threshold: float = 0.9,
    unlabeled_weight: float = 1.0,
    vat_epsilon: float = 2.0,
    self_training_rounds: int = 2,
    augment: bool = True,
    seed: int = 0,
    device: str | torch.device | None = None,
    max_restarts: int = 2,
    collapse_fit: float = 0.5,
) -> SemiSupervisedReport:
    """Train ``model`` in place on labelled ``(x, y)`` and the ``unlabeled`` pool.

    ``supervised``: cross-entropy on (weakly augmented) labelled batches only. ``consistency``:
    plus, on every unlabeled batch, the model's confident (≥ ``threshold``) prediction on a weak
    view is the target of a strong view (FixMatch, Sohn et al. 2020). ``vat``: plus the virtual
    adversarial loss on unlabeled batches. ``self-training``: ``self_training_rounds`` times,
    label the pool with the model, keep the confident ones and retrain from the current weights.
    The learning rate follows a cosine schedule over ``steps`` (per round for self-training).

    A run can collapse: saturated units leave a near-constant network that fits its own
    labelled records no better than chance. When the trained model fits fewer than
    ``collapse_fit`` of them, training starts again from the same initial weights with other
    batches and augmentations, at most ``max_restarts`` times, and the best fit is kept. The
    check reads only the inputs, so it is post-processing (docs/algorithms.md#student-restarts).

    Raises:
        TrainingError: bad data or hyper-parameters.
    """
    xa, ya, pool = np.asarray(x, np.float32), np.asarray(y), np.asarray(unlabeled, np.float32)
    _check(xa, ya, pool)
    if steps < 1 or batch_size < 1 or unlabeled_ratio < 1 or not 0 < threshold <= 1:
        raise TrainingError("steps, batch_size, unlabeled_ratio >= 1 and threshold in (0, 1]")
    if max_restarts < 0 or not 0 <= collapse_fit <= 1:
        raise TrainingError("max_restarts >= 0 and collapse_fit in [0, 1]")
    recipe = _Recipe(
        method=method,
        steps=steps,
        batch_size=batch_size,
        unlabeled_ratio=unlabeled_ratio,
        unlabeled_weight=unlabeled_weight,
        learning_rate=learning_rate,
        momentum=momentum,
        weight_decay=weight_decay,
        threshold=threshold,
        vat_epsilon=vat_epsilon,
        self_training_rounds=self_training_rounds,
        views=views(xa.shape[1:]) if augment else (Augmenter(shift=0.0),) * 2,
    )
    target = select_device(device)
    home = next(model.parameters()).device
    model.to(target)
    xt, yt = torch.tensor(xa), torch.tensor(ya.astype(np.int64))
    try:
        return _best_of_restarts(
            model, recipe, xt, yt, torch.tensor(pool), seed, max_restarts, collapse_fit, target
        )
    finally:
        model.to(home)


@dataclass(frozen=True, slots=True)
class _Recipe:
    """How :func:`train_semi_supervised` trains, its arguments checked; ``views`` are the weak
    and the strong augmentation."""

    method: StudentMethod
    steps: int
    batch_size: int
    unlabeled_ratio: int
    unlabeled_weight: float
    learning_rate: float
    momentum: float
    weight_decay: float
    threshold: float
    vat_epsilon: float
    self_training_rounds: int
    views: tuple[Augmenter, Augmenter]


def _best_of_restarts(
    model: nn.Module,
    recipe: _Recipe,
    xt: torch.Tensor,
    yt: torch.Tensor,
    pt: torch.Tensor,
    seed: int,
    max_restarts: int,
    collapse_fit: float,
    device: torch.device,
) -> SemiSupervisedReport:
    """Train until the model fits ``collapse_fit`` of its labelled records, starting again from
    the initial weights at most ``max_restarts`` times; the best fit is loaded and reported."""
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    best: tuple[float, dict[str, torch.Tensor], SemiSupervisedReport] | None = None
    for attempt in range(max_restarts + 1):
        if attempt:
            model.load_state_dict(initial)
        generator = torch.Generator().manual_seed(seed + _RESTART_SEED_STRIDE * attempt)
        report = _train_once(model, recipe, xt, yt, pt, generator, device)
        fit = float((_probabilities(model, xt, device).argmax(dim=1) == yt).float().mean())
        if best is None or fit > best[0]:
            state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            best = (fit, state, report)
        if fit >= collapse_fit:
            break
    assert best is not None
    fit, state, report = best
    model.load_state_dict(state)
    return replace(report, labelled_fit=fit, restarts=attempt)


def _train_once(
    model: nn.Module,
    recipe: _Recipe,
    xt: torch.Tensor,
    yt: torch.Tensor,
    pt: torch.Tensor,
    generator: torch.Generator,
    device: torch.device,
) -> SemiSupervisedReport:
    """One training of :func:`train_semi_supervised` from the model's current weights, drawing
    from ``generator``."""
    if recipe.method != "self-training":
        return _run(model, recipe, xt, yt, pt, generator, device)
    supervised = replace(recipe, method="supervised", unlabeled_ratio=1, unlabeled_weight=0.0)
    report = _run(model, supervised, xt, yt, pt, generator, device)
    for _ in range(recipe.self_training_rounds):
        probs = _probabilities(model, pt, device)
        confident, labels = probs.max(dim=1)
        keep = confident >= recipe.threshold
        xr, yr = torch.cat([xt, pt[keep]]), torch.cat([yt, labels[keep]])
        report = _run(model, supervised, xr, yr, pt, generator, device)
        report = replace(report, confident_fraction=float(keep.float().mean()))
    return report


@torch.no_grad()
def _probabilities(model: nn.Module, x: torch.Tensor, device: torch.device) -> torch.Tensor:
    was = model.training
    model.eval()
    try:
        out = [
            functional.softmax(_forward(model, x[i : i + 1024].to(device)), dim=1).cpu()
            for i in range(0, x.shape[0], 1024)
        ]
    finally:
        model.train(was)
    return torch.cat(out)


def _run(
    model: nn.Module,
    recipe: _Recipe,
    xt: torch.Tensor,
    yt: torch.Tensor,
    pool: torch.Tensor,
    generator: torch.Generator,
    device: torch.device,
) -> SemiSupervisedReport:
    r, (weak, strong) = recipe, recipe.views
    optimizer = torch.optim.SGD(
        model.parameters(),
        lr=r.learning_rate,
        momentum=r.momentum,
        weight_decay=r.weight_decay,
        nesterov=r.momentum > 0,
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 0.5 * (1.0 + math.cos(math.pi * step / r.steps))
    )
    method, steps, batch_size, weight = r.method, r.steps, r.batch_size, r.unlabeled_weight
    n, m = xt.shape[0], pool.shape[0]
    ub = batch_size * r.unlabeled_ratio
    losses: list[float] = []
    confident: list[float] = []
    model.train()
    for _ in range(steps):
        idx = torch.randint(n, (min(batch_size, n),), generator=generator)
        xb = weak(xt[idx], generator).to(device)
        loss = functional.cross_entropy(_forward(model, xb), yt[idx].to(device))
        if method in ("consistency", "vat") and weight > 0:
            ux = pool[torch.randint(m, (ub,), generator=generator)]
            if method == "consistency":
                with torch.no_grad():
                    probs = functional.softmax(
                        _forward(model, weak(ux, generator).to(device)), dim=1
                    )
                    conf, pseudo = probs.max(dim=1)
                    mask = (conf >= r.threshold).float()
                xs = strong(ux, generator).to(device)
                per = functional.cross_entropy(_forward(model, xs), pseudo, reduction="none")
                loss = loss + weight * (per * mask).mean()
                confident.append(float(mask.mean()))
            else:
                loss = loss + weight * _vat_loss(
                    model, weak(ux, generator).to(device), r.vat_epsilon, generator
                )
        optimizer.zero_grad(set_to_none=True)
        torch.autograd.backward(loss)
        optimizer.step()
        schedule.step()
        losses.append(float(loss.detach()))
    return SemiSupervisedReport(
        steps=steps,
        mean_loss=float(np.mean(losses)),
        confident_fraction=float(np.mean(confident)) if confident else 0.0,
    )
