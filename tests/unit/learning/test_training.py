"""Plain local training: SGD, the DP-FedAvg local update, evaluation, teachers and students."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpfl.learning.data import IidPartition, federate, load_dataset
from dpfl.learning.errors import TrainingError
from dpfl.learning.models import build_model
from dpfl.learning.params import flatten_parameters
from dpfl.learning.training import (
    SgdTrainer,
    evaluate,
    local_update,
    predict_labels,
    predict_probabilities,
    train,
    train_student,
    train_teacher,
)


@pytest.fixture(scope="module")
def digits():  # type: ignore[no-untyped-def]
    return load_dataset("digits")


def _logreg(seed: int = 0) -> torch.nn.Module:
    return build_model("logreg", input_shape=(1, 8, 8), num_classes=10, seed=seed)


def test_logreg_learns_digits_deterministically(digits) -> None:  # type: ignore[no-untyped-def]
    a, b = _logreg(), _logreg()
    report = train(a, digits.x_train, digits.y_train, epochs=5, batch_size=32, learning_rate=0.5)
    train(b, digits.x_train, digits.y_train, epochs=5, batch_size=32, learning_rate=0.5)
    assert report.steps == 5 * 43
    assert report.last_epoch_loss < report.mean_loss
    np.testing.assert_array_equal(flatten_parameters(a), flatten_parameters(b))
    result = evaluate(a, digits.x_test, digits.y_test)
    assert result.accuracy > 0.9
    assert result.num_samples == 450
    assert 0 < result.loss < 0.5


def test_local_update_leaves_the_global_model_alone(digits) -> None:  # type: ignore[no-untyped-def]
    model = _logreg()
    before = flatten_parameters(model)
    update = local_update(
        model, digits.x_train[:100], digits.y_train[:100], steps=7, batch_size=16, learning_rate=0.3
    )
    np.testing.assert_array_equal(flatten_parameters(model), before)
    assert update.delta.dtype == np.float32
    assert update.delta.shape == before.shape
    assert update.steps == 7
    assert update.num_samples == 100
    assert np.abs(update.delta).max() > 0
    trained = _logreg()
    train(
        trained,
        digits.x_train[:100],
        digits.y_train[:100],
        steps=7,
        batch_size=16,
        learning_rate=0.3,
    )
    np.testing.assert_allclose(before + update.delta, flatten_parameters(trained), atol=1e-6)


def test_predictions(digits) -> None:  # type: ignore[no-untyped-def]
    model = _logreg()
    train(model, digits.x_train, digits.y_train, epochs=2, learning_rate=0.5)
    probs = predict_probabilities(model, digits.x_test[:20])
    assert probs.shape == (20, 10)
    assert probs.dtype == np.float32
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(predict_labels(model, digits.x_test[:20]), probs.argmax(axis=1))
    assert model.training  # evaluation restores the mode


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"epochs": 1, "steps": 1}, "exactly one of epochs or steps"),
        ({}, "exactly one of epochs or steps"),
        ({"steps": 1, "batch_size": 0}, "batch_size"),
        ({"steps": 1, "learning_rate": 0.0}, "learning_rate must be a positive"),
        ({"steps": 1, "momentum": -1.0}, "momentum must be a non-negative"),
    ],
)
def test_bad_hyper_parameters(digits, kwargs, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TrainingError, match=message):
        train(_logreg(), digits.x_train[:10], digits.y_train[:10], **kwargs)


def test_bad_data(digits) -> None:  # type: ignore[no-untyped-def]
    model = _logreg()
    with pytest.raises(TrainingError, match="labels of shape"):
        train(model, digits.x_train[:10], digits.y_train[:9], steps=1)
    with pytest.raises(TrainingError, match="non-empty batch"):
        train(model, digits.x_train[:0], digits.y_train[:0], steps=1)
    with pytest.raises(TrainingError, match="labels must be integers"):
        train(model, digits.x_train[:4], np.zeros(4), steps=1)
    with pytest.raises(TrainingError, match="cannot take inputs of shape"):
        train(
            model, np.zeros((4, 1, 16, 16), dtype=np.float32), np.zeros(4, dtype=np.int64), steps=1
        )
    with pytest.raises(TrainingError, match="outside the model's 10 classes"):
        evaluate(model, digits.x_test[:4], np.array([0, 1, 2, 12]))


def test_teachers_and_a_student_from_their_votes(digits) -> None:  # type: ignore[no-untyped-def]
    fed = federate(digits, scheme=IidPartition(), num_agents=3, seed=0, public_fraction=0.3)
    teachers = [
        train_teacher(fed.agent_dataset(i), model="logreg", epochs=20, seed=i) for i in range(3)
    ]
    assert all(evaluate(t, digits.x_test, digits.y_test).accuracy > 0.85 for t in teachers)
    public = fed.public_features()
    votes = sum(np.eye(10)[predict_labels(t, public)] for t in teachers)
    pseudo = votes.argmax(axis=1)
    truth = fed.public_labels_for_evaluation()
    assert (pseudo == truth).mean() > 0.9
    queried = 150
    student = _logreg(seed=9)
    train_student(
        student,
        public[:queried],
        pseudo[:queried],
        epochs=20,
        unlabeled=public[queried:],
        self_training_rounds=1,
        learning_rate=0.1,
    )
    assert evaluate(student, digits.x_test, digits.y_test).accuracy > 0.85
    with pytest.raises(TrainingError, match="needs the unlabeled"):
        train_student(student, public[:10], pseudo[:10], epochs=1, self_training_rounds=1)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_direct_sgd_update_matches_torch_sgd(digits, momentum) -> None:  # type: ignore[no-untyped-def]
    """The direct update (taken without momentum or decay) and torch's SGD give the same
    weights, also when the rate in the optimizer's group changes between steps."""
    x = torch.tensor(digits.x_train[:64], dtype=torch.float32)
    y = torch.tensor(digits.y_train[:64], dtype=torch.int64)
    ours, reference = _logreg(3), _logreg(3)
    trainer = SgdTrainer(
        ours, learning_rate=0.2, momentum=momentum, device=torch.device("cpu"), direct=True
    )
    sgd = torch.optim.SGD(reference.parameters(), lr=0.2, momentum=momentum)
    for i in range(6):
        rate = 0.2 * 0.5 ** (i // 2)
        trainer.optimizer.param_groups[0]["lr"] = rate
        sgd.param_groups[0]["lr"] = rate
        xb, yb = x[i * 8 : (i + 1) * 8], y[i * 8 : (i + 1) * 8]
        trainer.step(xb, yb)
        sgd.zero_grad()
        torch.nn.functional.cross_entropy(reference(xb), yb).backward()
        sgd.step()
    np.testing.assert_allclose(
        flatten_parameters(ours), flatten_parameters(reference), rtol=1e-6, atol=1e-7
    )
    assert not np.allclose(flatten_parameters(ours), flatten_parameters(_logreg(3)))
