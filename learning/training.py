"""Non-private local training: SGD, the DP-FedAvg agent update, evaluation, teachers, students.

DP-FedAvg protects whole agents, so the agent's local training is ordinary SGD and privacy comes
from clipping and noising the *delta* afterwards (the algorithm module does that). PATE-FL teachers
are trained once without DP on local data (the votes are noised); students are trained by the
coordinator on public records and noisy pseudo-labels, which is post-processing.

Invariants: :func:`local_update` never changes the model it is given (the global model stays the
reference the delta is measured from); :func:`train` changes it in place and returns it to the
device it came from; every run is a pure function of its seed on a given device.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn
from torch.nn.functional import cross_entropy

from dpfl.learning.data.dataset import Dataset
from dpfl.learning.device import select_device
from dpfl.learning.errors import TrainingError
from dpfl.learning.models import build_model
from dpfl.learning.params import flatten_parameters

__all__ = [
    "BatchTrainer",
    "EpochLoop",
    "Evaluation",
    "LocalUpdate",
    "SgdTrainer",
    "TeacherReport",
    "TrainReport",
    "as_tensors",
    "evaluate",
    "fit_epochs",
    "fit_teacher",
    "local_update",
    "predict_labels",
    "predict_probabilities",
    "run_sgd",
    "train",
    "train_student",
    "train_teacher",
]


@dataclass(frozen=True, slots=True)
class TrainReport:
    """What a training run did (local diagnostics)."""

    steps: int
    samples_seen: int
    mean_loss: float
    last_epoch_loss: float


@dataclass(frozen=True, slots=True)
class LocalUpdate:
    """An agent's contribution before clipping/noising/encoding: ``delta = θ_local − θ_global``.

    Attributes:
        delta: float32 vector in :func:`~dpfl.learning.params.flatten_parameters` order.
        num_samples: records the agent trained on.
        steps: optimisation steps taken.
        mean_loss: mean training loss over the steps (local diagnostic, NOT private: never send).
        batch_sizes: realised batch sizes (Poisson sampling under DP-SGD; local diagnostic).
        clipped_fraction: share of per-sample gradients that were clipped (DP-SGD only; local
            diagnostic, NOT private: never send).
    """

    delta: NDArray[np.float32]
    num_samples: int
    steps: int
    mean_loss: float
    batch_sizes: tuple[int, ...] = field(default=())
    clipped_fraction: float | None = None


@dataclass(frozen=True, slots=True)
class Evaluation:
    """Accuracy and mean cross-entropy of a model on labelled data."""

    accuracy: float
    loss: float
    num_samples: int


def as_tensors(
    x: NDArray[Any], y: NDArray[Any] | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Check and convert features (float32) and labels (int64) to CPU tensors (copies).

    Raises:
        TrainingError: empty data, mismatched lengths, non-integer or negative labels.
    """
    xa = np.asarray(x)
    if xa.ndim < 2 or xa.shape[0] == 0:
        raise TrainingError(f"features must be a non-empty batch (n, ...), got shape {xa.shape}")
    if not np.issubdtype(xa.dtype, np.number):
        raise TrainingError(f"features must be numeric, got dtype {xa.dtype}")
    xt = torch.tensor(xa, dtype=torch.float32)
    if y is None:
        return xt, None
    ya = np.asarray(y)
    if ya.shape != (xa.shape[0],):
        raise TrainingError(f"{xa.shape[0]} feature rows but labels of shape {ya.shape}")
    if not np.issubdtype(ya.dtype, np.integer):
        raise TrainingError(f"labels must be integers, got dtype {ya.dtype}")
    if ya.min() < 0:
        raise TrainingError(f"labels must be >= 0, got {int(ya.min())}")
    return xt, torch.tensor(ya, dtype=torch.int64)


def _check_rate(name: str, value: float, *, allow_zero: bool = False) -> float:
    v = float(value)
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        raise TrainingError(
            f"{name} must be a {'non-negative' if allow_zero else 'positive'} number"
        )
    return v


def _forward(model: nn.Module, xb: torch.Tensor) -> torch.Tensor:
    try:
        logits: torch.Tensor = model(xb)  # nn.Module.__call__ is typed as returning Any
        return logits
    except RuntimeError as exc:
        raise TrainingError(
            f"model cannot take inputs of shape {tuple(xb.shape[1:])}: {exc}"
        ) from None


class SgdTrainer:
    """Plain minibatch SGD on one model (the non-private baseline step and the FedAvg inner loop).

    Args:
        model: trained in place, on ``device``.
        learning_rate: step size.
        momentum: SGD momentum (0 = plain SGD).
        weight_decay: L2 penalty.
        device: where the model lives; see :func:`~dpfl.learning.device.select_device`.
        direct: without momentum or decay, update the weights directly rather than through
            ``optimizer.step()``; only for a trainer whose optimizer no LR scheduler wraps
            (torch's schedulers count ``optimizer.step()`` calls).
        max_grad_norm: rescale each step's gradient to at most this L2 norm (None: never).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        learning_rate: float,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        device: torch.device,
        direct: bool = False,
        max_grad_norm: float | None = None,
    ) -> None:
        self.model = model.to(device)
        self.device = device
        self.direct = direct
        self.max_grad_norm = max_grad_norm
        self.optimizer = torch.optim.SGD(
            model.parameters(),
            lr=_check_rate("learning_rate", learning_rate),
            momentum=_check_rate("momentum", momentum, allow_zero=True),
            weight_decay=_check_rate("weight_decay", weight_decay, allow_zero=True),
        )

    def step(self, xb: torch.Tensor, yb: torch.Tensor) -> float:
        """One SGD step on a batch (moved to the device); returns the batch's mean loss."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        logits = _forward(self.model, xb.to(self.device, non_blocking=True))
        loss = cross_entropy(logits, yb.to(self.device, non_blocking=True))
        torch.autograd.backward(loss)  # Tensor.backward itself is unannotated
        if self.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        group = self.optimizer.param_groups[0]
        if self.direct and not group["momentum"] and not group["weight_decay"]:
            self._plain_update(group["params"], float(group["lr"]))
        else:
            self.optimizer.step()
        return float(loss.detach())

    @staticmethod
    @torch.no_grad()
    def _plain_update(params: list[torch.Tensor], lr: float) -> None:
        """``p -= lr·grad``: what ``torch.optim.SGD`` does without momentum or decay, minus its
        per-call wrappers, which cost a quarter of a small model's step (DP-FedAvg agents take
        thousands of such steps per round). The rate is read from the optimizer's group."""
        for p in params:
            if p.grad is not None:
                p.add_(p.grad, alpha=-lr)


class BatchTrainer(Protocol):
    """Anything that takes one step on a batch and returns its loss (:class:`SgdTrainer`, or
    DANN's trainer in :mod:`~dpfl.learning.domain_adaptation`)."""

    def step(self, xb: torch.Tensor, yb: torch.Tensor) -> float:
        """One step on ``(xb, yb)``; the batch's mean loss."""
        ...


def run_sgd(
    trainer: BatchTrainer,
    xt: torch.Tensor,
    yt: torch.Tensor,
    *,
    epochs: int | None,
    steps: int | None,
    batch_size: int,
    seed: int,
) -> TrainReport:
    if (epochs is None) == (steps is None):
        raise TrainingError("give exactly one of epochs or steps")
    if batch_size < 1:
        raise TrainingError(f"batch_size must be >= 1, got {batch_size}")
    n = xt.shape[0]
    per_epoch = math.ceil(n / batch_size)
    total = per_epoch * epochs if epochs is not None else (steps or 0)
    if total < 0 or (epochs is not None and epochs < 0):
        raise TrainingError("epochs and steps must be >= 0")
    generator = torch.Generator().manual_seed(seed)
    losses: list[float] = []
    order = torch.randperm(n, generator=generator)
    position = 0
    for _ in range(total):
        if position >= n:
            order, position = torch.randperm(n, generator=generator), 0
        idx = order[position : position + batch_size]
        position += batch_size
        losses.append(trainer.step(xt[idx], yt[idx]))
    tail = losses[-per_epoch:]
    return TrainReport(
        steps=total,
        samples_seen=sum(min(batch_size, n) for _ in range(total)),
        mean_loss=float(np.mean(losses)) if losses else float("nan"),
        last_epoch_loss=float(np.mean(tail)) if tail else float("nan"),
    )


def train(
    model: nn.Module,
    x: NDArray[Any],
    y: NDArray[Any],
    *,
    epochs: int | None = None,
    steps: int | None = None,
    batch_size: int = 64,
    learning_rate: float = 0.1,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    seed: int = 0,
    device: str | torch.device | None = None,
) -> TrainReport:
    """Train ``model`` in place with minibatch SGD on cross-entropy (reshuffled every epoch).

    Args:
        model: the model; it is returned to its original device afterwards.
        x: features ``(n, *input_shape)``.
        y: labels ``(n,)``.
        epochs: full passes over the data (exclusive with ``steps``).
        steps: number of minibatch steps (exclusive with ``epochs``).
        batch_size: records per step.
        learning_rate: SGD step size.
        momentum: SGD momentum.
        weight_decay: L2 penalty.
        seed: seed of the batch order.
        device: training device (default: ``cuda`` when available).

    Raises:
        TrainingError: bad data or hyper-parameters, or inputs the model cannot take.
    """
    xt, yt = as_tensors(x, y)
    assert yt is not None
    home = next(model.parameters()).device
    trainer = SgdTrainer(
        model,
        learning_rate=learning_rate,
        momentum=momentum,
        weight_decay=weight_decay,
        device=select_device(device),
        direct=True,  # no scheduler: the trainer never leaves this function
    )
    try:
        return run_sgd(
            trainer, xt, yt, epochs=epochs, steps=steps, batch_size=batch_size, seed=seed
        )
    finally:
        model.to(home)


def local_update(
    model: nn.Module,
    x: NDArray[Any],
    y: NDArray[Any],
    *,
    epochs: int | None = None,
    steps: int | None = None,
    batch_size: int = 32,
    learning_rate: float = 0.1,
    momentum: float = 0.0,
    seed: int = 0,
    device: str | torch.device | None = None,
) -> LocalUpdate:
    """The DP-FedAvg agent's local work: E steps (or epochs) of plain SGD from the global model.

    The global ``model`` is left untouched; the returned delta is what the algorithm then clips
    to ``S`` and noises (docs/algorithms.md#dp-fedavg). See :func:`train` for the arguments.

    Raises:
        TrainingError: bad data or hyper-parameters.
    """
    local = copy.deepcopy(model)
    before = flatten_parameters(model, dtype=np.float64)
    report = train(
        local,
        x,
        y,
        epochs=epochs,
        steps=steps,
        batch_size=batch_size,
        learning_rate=learning_rate,
        momentum=momentum,
        seed=seed,
        device=device,
    )
    delta = (flatten_parameters(local, dtype=np.float64) - before).astype(np.float32)
    return LocalUpdate(
        delta=delta,
        num_samples=int(np.asarray(y).shape[0]),
        steps=report.steps,
        mean_loss=report.mean_loss,
    )


@torch.no_grad()
def predict_probabilities(
    model: nn.Module,
    x: NDArray[Any],
    *,
    batch_size: int = 1024,
    device: str | torch.device | None = None,
) -> NDArray[np.float32]:
    """Softmax outputs ``(n, C)`` (e.g. PATE soft votes); the model is left on its device."""
    xt, _ = as_tensors(x)
    target = select_device(device)
    home = next(model.parameters()).device
    was_training = model.training
    model.eval().to(target)
    try:
        outs = [
            torch.softmax(_forward(model, xt[i : i + batch_size].to(target)), dim=1).cpu()
            for i in range(0, xt.shape[0], batch_size)
        ]
    finally:
        model.to(home).train(was_training)
    return torch.cat(outs).numpy().astype(np.float32)


def predict_labels(
    model: nn.Module,
    x: NDArray[Any],
    *,
    batch_size: int = 1024,
    device: str | torch.device | None = None,
) -> NDArray[np.int64]:
    """Arg-max class per record (e.g. PATE one-hot votes)."""
    probs = predict_probabilities(model, x, batch_size=batch_size, device=device)
    return np.asarray(probs.argmax(axis=1), dtype=np.int64)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    x: NDArray[Any],
    y: NDArray[Any],
    *,
    batch_size: int = 1024,
    device: str | torch.device | None = None,
) -> Evaluation:
    """Accuracy and mean cross-entropy on ``(x, y)`` (e.g. the data set's test split).

    Raises:
        TrainingError: empty or malformed data, labels outside the model's outputs.
    """
    xt, yt = as_tensors(x, y)
    assert yt is not None
    target = select_device(device)
    home = next(model.parameters()).device
    was_training = model.training
    model.eval().to(target)
    correct, loss_sum = 0, 0.0
    try:
        for i in range(0, xt.shape[0], batch_size):
            logits = _forward(model, xt[i : i + batch_size].to(target))
            yb = yt[i : i + batch_size].to(target)
            if int(yb.max()) >= logits.shape[1]:
                raise TrainingError(
                    f"label {int(yb.max())} outside the model's {logits.shape[1]} classes"
                )
            loss_sum += float(cross_entropy(logits, yb, reduction="sum"))
            correct += int((logits.argmax(dim=1) == yb).sum())
    finally:
        model.to(home).train(was_training)
    n = xt.shape[0]
    return Evaluation(accuracy=correct / n, loss=loss_sum / n, num_samples=n)


def train_teacher(
    dataset: Dataset,
    *,
    model: str,
    epochs: int,
    batch_size: int = 64,
    learning_rate: float = 0.1,
    momentum: float = 0.9,
    seed: int = 0,
    device: str | torch.device | None = None,
) -> nn.Module:
    """Train a PATE teacher on an agent's own (training) data, without DP.

    Privacy comes from the noise on the votes, not from the teacher, so the teacher can use
    momentum and many epochs. Returns the trained model on the CPU.

    Raises:
        ModelError: the model spec does not fit the data.
        TrainingError: bad hyper-parameters.
    """
    net = build_model(
        model, input_shape=dataset.input_shape, num_classes=dataset.num_classes, seed=seed
    )
    train(
        net,
        dataset.x_train,
        dataset.y_train,
        epochs=epochs,
        batch_size=batch_size,
        learning_rate=learning_rate,
        momentum=momentum,
        seed=seed,
        device=device,
    )
    return net


def train_student(
    model: nn.Module,
    x: NDArray[Any],
    pseudo_labels: NDArray[Any],
    *,
    epochs: int,
    unlabeled: NDArray[Any] | None = None,
    self_training_rounds: int = 0,
    confidence: float = 0.9,
    batch_size: int = 64,
    learning_rate: float = 0.1,
    momentum: float = 0.9,
    seed: int = 0,
    device: str | torch.device | None = None,
) -> TrainReport:
    """Train the global (student) model on public records and their noisy pseudo-labels.

    Optionally semi-supervised by self-training: after each round, the student labels the
    ``unlabeled`` public records, those it predicts with probability >= ``confidence`` join the
    training set, and training continues. All of it only touches public data and already-released
    labels, so it is post-processing and costs no privacy.

    Args:
        model: the student, trained in place.
        x: the answered public queries.
        pseudo_labels: the arg-max labels the coordinator derived from the noisy votes.
        epochs: epochs per round.
        unlabeled: the other public records (optional).
        self_training_rounds: extra rounds with confident self-labels (0 = supervised only).
        confidence: probability threshold of a self-label.
        batch_size, learning_rate, momentum, seed, device: as :func:`train` takes them.

    Raises:
        TrainingError: bad data or hyper-parameters.
    """
    if self_training_rounds < 0 or not 0.0 < confidence <= 1.0:
        raise TrainingError("self_training_rounds must be >= 0 and confidence in (0, 1]")
    if self_training_rounds and unlabeled is None:
        raise TrainingError("self-training needs the unlabeled public records")
    xs, ys = np.asarray(x), np.asarray(pseudo_labels)
    fit = partial(
        train,
        model,
        epochs=epochs,
        batch_size=batch_size,
        learning_rate=learning_rate,
        momentum=momentum,
        device=device,
    )
    report = fit(xs, ys, seed=seed)
    for round_ in range(1, self_training_rounds + 1):
        assert unlabeled is not None
        probs = predict_probabilities(model, unlabeled, device=device)
        keep = probs.max(axis=1) >= confidence
        if not keep.any():
            break
        xs_round = np.concatenate([np.asarray(x), np.asarray(unlabeled)[keep]])
        ys_round = np.concatenate([ys, probs[keep].argmax(axis=1).astype(np.int64)])
        report = fit(xs_round, ys_round, seed=seed + round_)
    return report


@dataclass(frozen=True, slots=True)
class TeacherReport:
    """What :func:`fit_teacher` did (local diagnostics of the agent; never sent)."""

    epochs_run: int
    best_epoch: int
    validation_accuracy: float | None


def fit_teacher(
    model: nn.Module,
    x: NDArray[Any],
    y: NDArray[Any],
    *,
    epochs: int,
    batch_size: int = 32,
    learning_rate: float = 0.1,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    augment_shift: float = 0.0,
    schedule: str = "constant",
    validation_fraction: float = 0.0,
    patience: int = 0,
    max_grad_norm: float | None = None,
    seed: int = 0,
    device: str | torch.device | None = None,
) -> TeacherReport:
    """Train a PATE teacher in place on an agent's own small shard, without DP.

    Small non-IID shards overfit fast: random shifts of up to ``augment_shift`` pixels enlarge
    them, a ``cosine`` schedule anneals the step, and with ``validation_fraction > 0`` a
    stratified split of the agent's OWN records picks the best epoch (stopping after
    ``patience`` epochs without improvement; 0 = run every epoch, keep the best). The split stays
    inside the agent: only the noisy votes leave it, so this costs no privacy beyond the votes.
    ``max_grad_norm`` bounds each step: at a step size that suits most shards, a shard of few
    classes can otherwise diverge in its first epoch and vote one class for every query.

    Raises:
        TrainingError: bad data or hyper-parameters.
    """
    from dpfl.learning.semisupervised import Augmenter

    loop = EpochLoop(epochs, batch_size, schedule, validation_fraction, patience, seed)
    xt, yt = as_tensors(x, y)
    assert yt is not None
    home = next(model.parameters()).device
    trainer = SgdTrainer(
        model,
        learning_rate=learning_rate,
        momentum=momentum,
        weight_decay=weight_decay,
        device=select_device(device),
        max_grad_norm=max_grad_norm,
    )
    augment = Augmenter(shift=augment_shift)

    def step(xb: torch.Tensor, yb: torch.Tensor, progress: float, g: torch.Generator) -> None:
        del progress
        trainer.step(xb if augment_shift == 0 else augment(xb, g), yb)

    return fit_epochs(
        model, xt, yt, optimizer=trainer.optimizer, step=step, loop=loop, device=device, home=home
    )


@dataclass(frozen=True, slots=True)
class EpochLoop:
    """The epoch loop of a teacher recipe (:func:`fit_epochs`): ``epochs`` passes of
    ``batch_size`` batches under a ``constant`` or ``cosine`` schedule, the best epoch on a
    ``validation_fraction`` split of the agent's own records (early stop after ``patience``
    epochs without gain), every random draw from ``seed``.

    Raises:
        TrainingError: a loop that cannot run, naming the bad values.
    """

    epochs: int
    batch_size: int
    schedule: str
    validation_fraction: float
    patience: int
    seed: int

    def __post_init__(self) -> None:
        counts = self.epochs < 1 or self.batch_size < 1 or self.patience < 0
        if counts or not 0.0 <= self.validation_fraction < 1.0:
            raise TrainingError(
                "epochs, batch_size >= 1, patience >= 0 and validation_fraction in [0, 1)"
            )
        if self.schedule not in ("constant", "cosine"):
            raise TrainingError(f"schedule must be constant or cosine, got {self.schedule!r}")

    def split(self, labels: NDArray[Any]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """The training and validation indices of records with ``labels``: a stratified split,
        or every record for training when there is no fraction or a side would be empty."""
        from dpfl.learning.data.split import stratified_split

        everything, none = np.arange(labels.shape[0]), np.empty(0, dtype=np.int64)
        if self.validation_fraction == 0:
            return everything, none
        train, val = stratified_split(
            labels, test_fraction=self.validation_fraction, seed=self.seed
        )
        return (everything, none) if val.size == 0 or train.size == 0 else (train, val)

    def scheduler(
        self, optimizer: torch.optim.Optimizer, total: int
    ) -> torch.optim.lr_scheduler.LambdaLR | None:
        """The cosine annealing of ``optimizer`` over ``total`` steps, or None (constant)."""
        if self.schedule != "cosine":
            return None
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: 0.5 * (1.0 + math.cos(math.pi * s / total))
        )


def fit_epochs(
    model: nn.Module,
    xt: torch.Tensor,
    yt: torch.Tensor,
    *,
    optimizer: torch.optim.Optimizer,
    step: Callable[[torch.Tensor, torch.Tensor, float, torch.Generator], None],
    loop: EpochLoop,
    device: str | torch.device | None,
    home: torch.device,
) -> TeacherReport:
    """The epoch loop of the teacher recipes (:func:`fit_teacher`, and DANN's in
    :mod:`~dpfl.learning.domain_adaptation`): a stratified validation split of the agent's own
    records, shuffled batches of the rest handed to ``step(xb, yb, progress, generator)``
    (``progress`` = steps done / all steps), the cosine schedule on ``optimizer``, the best epoch
    on the validation split kept (early stop after ``patience`` epochs without gain), and the
    model moved back to ``home``. Every random draw comes from one generator seeded by the
    loop's seed.
    """
    epochs, batch_size, patience, seed = loop.epochs, loop.batch_size, loop.patience, loop.seed
    train_idx, val_idx = loop.split(yt.numpy())
    xtr, ytr = xt[train_idx], yt[train_idx]
    total = math.ceil(xtr.shape[0] / batch_size) * epochs
    scheduler = loop.scheduler(optimizer, total)
    generator = torch.Generator().manual_seed(seed)
    best: tuple[float, int, dict[str, torch.Tensor]] | None = None
    since, run, done = 0, 0, 0
    try:
        for epoch in range(1, epochs + 1):
            run = epoch
            order = torch.randperm(xtr.shape[0], generator=generator)
            for i in range(0, xtr.shape[0], batch_size):
                idx = order[i : i + batch_size]
                step(xtr[idx], ytr[idx], done / total, generator)
                done += 1
                if scheduler is not None:
                    scheduler.step()
            if val_idx.size:
                acc = evaluate(
                    model, xt[val_idx].numpy(), yt[val_idx].numpy(), device=device
                ).accuracy
                if best is None or acc > best[0]:
                    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
                    best, since = (acc, epoch, state), 0
                else:
                    since += 1
                    if patience and since >= patience:
                        break
        if best is not None:
            model.load_state_dict(best[2])
    finally:
        model.to(home)
    return TeacherReport(
        epochs_run=run,
        best_epoch=best[1] if best is not None else run,
        validation_accuracy=best[0] if best is not None else None,
    )
