"""DANN teachers: gradient reversal, the λ schedule, a gain on a shifted domain, determinism."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpfl.learning.data.registry import load_dataset
from dpfl.learning.domain_adaptation import (
    dann_lambda,
    fit_teacher_dann,
    grad_reverse,
    split_model,
)
from dpfl.learning.errors import TrainingError
from dpfl.learning.models import build_model
from dpfl.learning.params import flatten_parameters
from dpfl.learning.training import evaluate, fit_teacher


def test_gradient_reversal_flips_and_scales_the_gradient() -> None:
    x = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    out = grad_reverse(x, 0.5)
    assert torch.equal(out, x)  # identity forward
    torch.autograd.backward((out * torch.tensor([2.0, 3.0, -4.0])).sum())
    assert x.grad is not None
    assert torch.equal(x.grad, torch.tensor([-1.0, -1.5, 2.0]))


def test_lambda_schedule_of_ganin_et_al() -> None:
    assert dann_lambda(0.0) == 0.0
    assert dann_lambda(1.0) == pytest.approx(2 / (1 + np.exp(-10)) - 1)
    assert dann_lambda(0.5) == pytest.approx(0.98661, abs=1e-5)
    values = [dann_lambda(p / 10) for p in range(11)]
    assert values == sorted(values)


def test_split_model_needs_hidden_layers() -> None:
    net = build_model("mlp", input_shape=(1, 8, 8), num_classes=10)
    features, head = split_model(net)
    assert head is net[-1]
    assert features(torch.zeros(2, 1, 8, 8)).shape == (2, head.in_features)
    with pytest.raises(TrainingError, match="hidden layers"):
        split_model(build_model("logreg", input_shape=(1, 8, 8), num_classes=10))


def _noisy(x: np.ndarray) -> np.ndarray:
    """The target domain: digits under fixed strong pixel noise (seeded)."""
    noise = np.random.default_rng(0).normal(0.0, 0.4, x.shape)
    return np.clip(x + noise, 0.0, 1.0).astype(np.float32)


@pytest.mark.slow
def test_dann_beats_plain_training_on_a_shifted_target_domain() -> None:
    torch.set_num_threads(1)
    ds = load_dataset("digits")
    xs, ys = ds.x_train[:300], ds.y_train[:300]
    target_pool = _noisy(ds.x_train[300:])  # unlabeled target images
    x_test, y_test = _noisy(ds.x_test), ds.y_test
    kwargs = {"epochs": 20, "learning_rate": 0.03, "device": "cpu"}
    plain, adapted = [], []
    for seed in (0, 1, 2):
        net = build_model("cnn", input_shape=ds.input_shape, num_classes=10, seed=seed)
        fit_teacher(net, xs, ys, seed=seed, **kwargs)  # type: ignore[arg-type]
        plain.append(evaluate(net, x_test, y_test, device="cpu").accuracy)
        net = build_model("cnn", input_shape=ds.input_shape, num_classes=10, seed=seed)
        fit_teacher_dann(net, xs, ys, target_pool, seed=seed, **kwargs)  # type: ignore[arg-type]
        adapted.append(evaluate(net, x_test, y_test, device="cpu").accuracy)
    # measured: plain 0.480/0.424/0.460, DANN 0.522/0.480/0.549
    assert np.mean(adapted) >= np.mean(plain) + 0.03, (plain, adapted)
    assert min(a - p for a, p in zip(adapted, plain, strict=True)) > 0, (plain, adapted)


def test_dann_is_deterministic_and_checks_its_inputs() -> None:
    ds = load_dataset("digits")
    xs, ys, target = ds.x_train[:120], ds.y_train[:120], ds.x_train[120:240]

    def run(seed: int) -> np.ndarray:
        net = build_model("mlp", input_shape=ds.input_shape, num_classes=10, seed=seed)
        fit_teacher_dann(net, xs, ys, target, epochs=2, seed=seed, device="cpu")
        return flatten_parameters(net)

    np.testing.assert_array_equal(run(3), run(3))
    assert not np.array_equal(run(3), run(4))
    net = build_model("mlp", input_shape=ds.input_shape, num_classes=10)
    with pytest.raises(TrainingError, match="target images have shape"):
        fit_teacher_dann(net, xs, ys, target.reshape(120, -1), epochs=1, device="cpu")
    with pytest.raises(TrainingError, match="domain weight"):
        fit_teacher_dann(net, xs, ys, target, epochs=1, weight=0.0, device="cpu")
    logreg = build_model("logreg", input_shape=ds.input_shape, num_classes=10)
    with pytest.raises(TrainingError, match="hidden layers"):
        fit_teacher_dann(logreg, xs, ys, target, epochs=1, device="cpu")
