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

import math
from typing import Any

import torch
from numpy.typing import NDArray
from torch import nn
from torch.nn.functional import binary_cross_entropy_with_logits, cross_entropy

from dpfl.learning.device import select_device
from dpfl.learning.errors import TrainingError
from dpfl.learning.training import TeacherReport, as_tensors, check_teacher_recipe, fit_epochs

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
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 7919)  # its own stream: the model's init stays the plain one
        return nn.Sequential(
            nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, 1),
        )  # fmt: skip


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
    seed: int = 0,
    device: str | torch.device | None = None,
) -> TeacherReport:
    """Train a teacher in place on labelled ``(x, y)`` and unlabelled target images ``target_x``.

    Every step takes a source batch and an equally large target batch (drawn with replacement
    from ``target_x``); the loss is the label cross-entropy on the source batch plus ``weight``
    times the domain classifier's logistic loss on both, reversed into the features with
    λ = :func:`dann_lambda` of the training progress. Augmentation, schedule and the validation
    split on the agent's own records are those of :func:`~dpfl.learning.training.fit_teacher`.
    Deterministic by ``seed`` on a given device.

    Raises:
        TrainingError: bad data or hyper-parameters, or a model without hidden layers.
    """
    from dpfl.learning.semisupervised import Augmenter

    check_teacher_recipe(epochs, batch_size, patience, validation_fraction, schedule)
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
    features, head = split_model(model)
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
        model.train()
        domain.train()
        optimizer.zero_grad(set_to_none=True)
        feats = features(torch.cat([xs, xd]).to(target))
        n = xs.shape[0]
        label_loss = cross_entropy(head(feats[:n]), ys.to(target))
        is_target = torch.cat([torch.zeros(n), torch.ones(xd.shape[0])]).to(target)
        domain_logits = domain(grad_reverse(feats, dann_lambda(progress))).squeeze(1)
        domain_loss = binary_cross_entropy_with_logits(domain_logits, is_target)
        torch.autograd.backward(label_loss + weight * domain_loss)
        optimizer.step()

    return fit_epochs(
        model,
        xt,
        yt,
        optimizer=optimizer,
        step=step,
        epochs=epochs,
        batch_size=batch_size,
        schedule=schedule,
        validation_fraction=validation_fraction,
        patience=patience,
        seed=seed,
        device=device,
        home=home,
    )
