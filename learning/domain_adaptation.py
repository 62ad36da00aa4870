"""Domain-adversarial training (DANN, Ganin et al., JMLR 2016) of PATE teachers.

A PATE-FL teacher learns on the agent's private records (the *source* domain) but votes on the
public pool, which may come from another domain (MNIST agents, a USPS pool). DANN splits the
model into a feature extractor (every layer before the last linear one) and the label head, adds
a small *domain classifier* on the features, and trains the extractor through a gradient-reversal
layer so that the domain classifier cannot tell source from target features. The target images
are the public records the agent already holds, so this costs no privacy; only the label path
(the unchanged model) is kept, and its noisy votes are charged as before
(docs/algorithms.md#teachers-adapted-to-the-public-domain).
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn
from torch.nn.functional import binary_cross_entropy_with_logits, cross_entropy

from dpfl.learning.device import select_device
from dpfl.learning.errors import TrainingError
from dpfl.learning.models import seeded_initialisation
from dpfl.learning.params import flatten_parameters
from dpfl.learning.training import (
    EpochLoop,
    LocalUpdate,
    TeacherReport,
    as_tensors,
    fit_epochs,
    run_sgd,
)

__all__ = [
    "GradientReversal",
    "dann_lambda",
    "fit_teacher_dann",
    "grad_reverse",
    "split_model",
]


class GradientReversal(torch.autograd.Function):
    """Identity forward; the backward pass multiplies the gradient by ``-λ``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, lam: float) -> torch.Tensor:
        ctx.lam = lam
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor, None]:
        return -ctx.lam * grads[0], None


def grad_reverse(x: torch.Tensor, lam: float) -> torch.Tensor:
    """``x`` unchanged, with gradients flowing back through it scaled by ``-lam``."""
    out: torch.Tensor = GradientReversal.apply(x, lam)  # type: ignore[no-untyped-call]
    return out


def dann_lambda(progress: float) -> float:
    """Ganin et al.'s adaptation factor ``2/(1+exp(-10p)) - 1``: 0 at the start (the domain
    classifier's early, noisy signal does not disturb the features), near 1 by mid-training."""
    return 2.0 / (1.0 + math.exp(-10.0 * progress)) - 1.0


def split_model(model: nn.Module) -> tuple[nn.Module, nn.Linear]:
    """``(features, head)`` of a zoo model: everything before its last linear layer, and it.

    Raises:
        TrainingError: not a sequential model ending in a linear layer, or one without hidden
            layers (logreg: its "features" are the raw inputs, which no training can align).
    """
    if not isinstance(model, nn.Sequential) or not isinstance(model[-1], nn.Linear):
        raise TrainingError("domain adaptation needs a sequential model ending in a linear head")
    features = model[:-1]
    if not any(p.requires_grad for p in features.parameters()):
        raise TrainingError(
            "domain adaptation needs hidden layers to align (model mlp or cnn, not logreg)"
        )
    head: nn.Linear = model[-1]
    return features, head


def _domain_classifier(width: int, hidden: int, seed: int) -> nn.Module:
    with seeded_initialisation(seed + 7919):  # its own stream: the model's stays the plain one
        return nn.Sequential(
            nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, 1),
        )  # fmt: skip


def _dann_loss(
    model: nn.Module,
    domain: nn.Module,
    xs: torch.Tensor,
    ys: torch.Tensor,
    xd: torch.Tensor,
    *,
    lam: float,
    weight: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(label loss, label loss + weight · domain loss)`` of one source batch ``(xs, ys)`` and
    one target batch ``xd``, the domain loss reversed into the features with factor ``lam``;
    both modules in training mode, the batches moved to the model's device."""
    features, head = split_model(model)
    device = next(model.parameters()).device
    model.train()
    domain.train()
    feats = features(torch.cat([xs, xd]).to(device))
    n = xs.shape[0]
    label_loss = cross_entropy(head(feats[:n]), ys.to(device))
    is_target = torch.cat([torch.zeros(n), torch.ones(xd.shape[0])]).to(device)
    domain_logits = domain(grad_reverse(feats, lam)).squeeze(1)
    domain_loss = binary_cross_entropy_with_logits(domain_logits, is_target)
    return label_loss, label_loss + weight * domain_loss


class DannTrainer:
    """Plain SGD on the DANN loss, one source batch at a time (the step DP-FedAvg+DA's local
    training takes): each step draws an equally large target batch from ``target_x`` with its
    own generator, and λ follows :func:`dann_lambda` over ``total_steps``. The domain classifier
    lives and dies with the trainer: it never leaves the agent."""

    def __init__(
        self,
        model: nn.Module,
        target_x: torch.Tensor,
        *,
        learning_rate: float,
        weight: float,
        hidden: int,
        total_steps: int,
        seed: int,
        device: torch.device,
    ) -> None:
        _, head = split_model(model)
        self.model = model.to(device)
        self.domain = _domain_classifier(head.in_features, hidden, seed).to(device)
        self.optimizer = torch.optim.SGD(
            [*model.parameters(), *self.domain.parameters()], lr=learning_rate
        )
        self.target_x = target_x
        self.weight = weight
        self.total_steps = max(1, total_steps)
        self.done = 0
        self.generator = torch.Generator().manual_seed(seed + 104_729)

    def step(self, xb: torch.Tensor, yb: torch.Tensor) -> float:
        """One step; returns the batch's label loss."""
        pick = torch.randint(self.target_x.shape[0], (xb.shape[0],), generator=self.generator)
        self.optimizer.zero_grad(set_to_none=True)
        label_loss, total = _dann_loss(
            self.model,
            self.domain,
            xb,
            yb,
            self.target_x[pick],
            lam=dann_lambda(self.done / self.total_steps),
            weight=self.weight,
        )
        torch.autograd.backward(total)
        self.optimizer.step()
        self.done += 1
        return float(label_loss.detach())


def dann_local_update(
    model: nn.Module,
    x: NDArray[Any],
    y: NDArray[Any],
    target_x: NDArray[Any],
    *,
    epochs: int | None = None,
    steps: int | None = None,
    batch_size: int = 32,
    learning_rate: float = 0.1,
    weight: float = 1.0,
    hidden: int = 100,
    seed: int = 0,
    device: str | torch.device | None = None,
) -> LocalUpdate:
    """DP-FedAvg+DA's local work: the steps (or epochs) of :func:`~dpfl.learning.training.
    local_update`, each on the DANN loss against the public target images ``target_x``; the
    global ``model`` is left untouched and the delta covers the model's parameters only.

    Raises:
        TrainingError: bad data or hyper-parameters, target images of another shape, or a model
            without hidden layers.
    """
    if not (math.isfinite(weight) and weight > 0) or hidden < 1:
        raise TrainingError("the domain weight must be > 0 and hidden >= 1")
    xt, yt = as_tensors(x, y)
    assert yt is not None
    tx, _ = as_tensors(target_x)
    if tx.shape[0] == 0 or tuple(tx.shape[1:]) != tuple(xt.shape[1:]):
        raise TrainingError(
            f"target images have shape {tuple(tx.shape)}, the agent's records "
            f"{tuple(xt.shape[1:])} each"
        )
    local = copy.deepcopy(model)
    before = flatten_parameters(model, dtype=np.float64)
    per_epoch = math.ceil(xt.shape[0] / batch_size) if batch_size > 0 else 0
    trainer = DannTrainer(
        local,
        tx,
        learning_rate=learning_rate,
        weight=weight,
        hidden=hidden,
        total_steps=per_epoch * epochs if epochs is not None else (steps or 0),
        seed=seed,
        device=select_device(device),
    )
    report = run_sgd(trainer, xt, yt, epochs=epochs, steps=steps, batch_size=batch_size, seed=seed)
    local.to("cpu")
    delta = (flatten_parameters(local, dtype=np.float64) - before).astype(np.float32)
    return LocalUpdate(
        delta=delta,
        num_samples=int(yt.shape[0]),
        steps=report.steps,
        mean_loss=report.mean_loss,
    )


def fit_teacher_dann(
    model: nn.Module,
    x: NDArray[Any],
    y: NDArray[Any],
    target_x: NDArray[Any],
    *,
    epochs: int,
    weight: float = 1.0,
    domain_hidden: int = 100,
    batch_size: int = 32,
    learning_rate: float = 0.1,
    momentum: float = 0.9,
    augment_shift: float = 0.0,
    schedule: str = "constant",
    validation_fraction: float = 0.0,
    patience: int = 0,
    max_grad_norm: float | None = None,
    seed: int = 0,
    device: str | torch.device | None = None,
) -> TeacherReport:
    """Train a teacher in place on labelled ``(x, y)`` and unlabelled target images ``target_x``.

    Every step takes a source batch and an equally large target batch (drawn with replacement
    from ``target_x``); the loss is the label cross-entropy on the source batch plus ``weight``
    times the domain classifier's logistic loss on both, reversed into the features with
    λ = :func:`dann_lambda` of the training progress. Augmentation, schedule, the gradient norm
    bound (over the model and the domain classifier) and the validation split on the agent's own
    records are those of :func:`~dpfl.learning.training.fit_teacher`.
    Deterministic by ``seed`` on a given device.

    Raises:
        TrainingError: bad data or hyper-parameters, or a model without hidden layers.
    """
    from dpfl.learning.semisupervised import Augmenter

    loop = EpochLoop(epochs, batch_size, schedule, validation_fraction, patience, seed)
    if not (math.isfinite(weight) and weight > 0) or domain_hidden < 1:
        raise TrainingError("the domain weight must be > 0 and domain_hidden >= 1")
    xt, yt = as_tensors(x, y)
    assert yt is not None
    tx, _ = as_tensors(target_x)
    if tuple(tx.shape[1:]) != tuple(xt.shape[1:]):
        raise TrainingError(
            f"target images have shape {tuple(tx.shape[1:])}, the agent's records "
            f"{tuple(xt.shape[1:])}"
        )
    _, head = split_model(model)
    home = next(model.parameters()).device
    target = select_device(device)
    domain = _domain_classifier(head.in_features, domain_hidden, seed).to(target)
    model.to(target)
    optimizer = torch.optim.SGD(
        [*model.parameters(), *domain.parameters()], lr=learning_rate, momentum=momentum
    )
    augment = Augmenter(shift=augment_shift)

    def step(xs: torch.Tensor, ys: torch.Tensor, progress: float, g: torch.Generator) -> None:
        xd = tx[torch.randint(tx.shape[0], (xs.shape[0],), generator=g)]
        if augment_shift:
            xs, xd = augment(xs, g), augment(xd, g)
        optimizer.zero_grad(set_to_none=True)
        total = _dann_loss(model, domain, xs, ys, xd, lam=dann_lambda(progress), weight=weight)
        torch.autograd.backward(total[1])
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(optimizer.param_groups[0]["params"], max_grad_norm)
        optimizer.step()

    return fit_epochs(
        model, xt, yt, optimizer=optimizer, step=step, loop=loop, device=device, home=home
    )
