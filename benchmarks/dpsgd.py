"""Time of one DP-SGD step against one plain SGD step for the CNN on 28x28 inputs.

Prints ONE JSON line: per batch size and device, the median wall time of a plain step and of a
DP-SGD step with each Opacus engine, interleaved so that load changes hit all alike, and their
ratio (target ≤ 2 on CPU for ``ew``). ``--accuracy`` also trains both on MNIST.
Usage: ``python benchmarks/dpsgd.py [--batch-sizes 64,128,256] [--repeats 30] [--threads N]``.
Method and results: docs/performance.md#learning-dp-sgd-step-cost-benchmarksdpsgdpy.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from typing import Any

import torch

from dpfl.learning.dpsgd import DEFAULT_GRAD_SAMPLE_MODE, GRAD_SAMPLE_MODES, DpSgdTrainer
from dpfl.learning.models import build_model
from dpfl.learning.training import SgdTrainer

HEADLINE_BATCH = 128
HEADLINE_MODE = DEFAULT_GRAD_SAMPLE_MODE
TARGET_RATIO = 2.0
INPUT_SHAPE = (1, 28, 28)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _measure(
    device: torch.device, batch: int, modes: list[str], repeats: int, warmup: int
) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(batch)
    x = torch.rand((batch, *INPUT_SHAPE), generator=generator).to(device)
    y = torch.randint(0, 10, (batch,), generator=generator).to(device)
    model = build_model("cnn", input_shape=INPUT_SHAPE, num_classes=10, seed=0)
    plain = SgdTrainer(build_model("cnn", input_shape=INPUT_SHAPE, num_classes=10, seed=0),
                       learning_rate=0.05, device=device)  # fmt: skip
    steps: dict[str, Any] = {"plain": lambda: plain.step(x, y)}
    for mode in modes:
        trainer = DpSgdTrainer(
            model, clip=1.0, learning_rate=0.05, noise_std=1.0, grad_sample_mode=mode,  # type: ignore[arg-type]
            device=device, noise_seed=0,
        )  # fmt: skip
        steps[mode] = lambda t=trainer: t.step(x, y, expected_batch_size=batch)
    times: dict[str, list[float]] = {name: [] for name in steps}
    for i in range(warmup + repeats):
        for name, step in steps.items():
            _sync(device)
            start = time.perf_counter()
            step()
            _sync(device)
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
    plain_ms = statistics.median(times["plain"]) * 1e3
    result: dict[str, Any] = {"plain_ms": round(plain_ms, 3)}
    for mode in modes:
        dp_ms = statistics.median(times[mode]) * 1e3
        result[mode] = {"dp_ms": round(dp_ms, 3), "ratio": round(dp_ms / plain_ms, 3)}
    return result


def _accuracy(plain_epochs: int, dp_epochs: int) -> dict[str, Any]:
    from dpfl.accounting import (
        GaussianEvent,
        PoissonSampledEvent,
        SelfComposedEvent,
        compute_epsilon,
    )
    from dpfl.learning.data import load_dataset
    from dpfl.learning.dpsgd import dp_sgd_update
    from dpfl.learning.params import assign_parameters, flatten_parameters
    from dpfl.learning.training import evaluate, train

    data = load_dataset("mnist")
    start = time.perf_counter()
    plain = build_model("cnn", input_shape=data.input_shape, num_classes=10, seed=0)
    train(plain, data.x_train, data.y_train, epochs=plain_epochs, batch_size=128,
          learning_rate=0.1, momentum=0.9, seed=0)  # fmt: skip
    plain_acc = evaluate(plain, data.x_test, data.y_test).accuracy
    plain_s = time.perf_counter() - start
    rate, sigma, clip = 512 / data.y_train.size, 1.0, 1.0
    steps = round(dp_epochs / rate)
    start = time.perf_counter()
    private = build_model("cnn", input_shape=data.input_shape, num_classes=10, seed=0)
    update = dp_sgd_update(private, data.x_train, data.y_train, steps=steps, sampling_rate=rate,
                           clip=clip, learning_rate=4.0, noise_std=clip * sigma)  # fmt: skip
    assign_parameters(private, flatten_parameters(private) + update.delta)
    dp_acc = evaluate(private, data.x_test, data.y_test).accuracy
    event = SelfComposedEvent(
        PoissonSampledEvent(rate, GaussianEvent.from_multiplier(sigma)), steps
    )
    return {
        "dataset": "mnist",
        "plain": {"epochs": plain_epochs, "test_accuracy": plain_acc, "wall_s": round(plain_s, 1)},
        "dp_sgd": {
            "epochs": dp_epochs,
            "steps": steps,
            "sampling_rate": round(rate, 6),
            "noise_multiplier": sigma,
            "clip": clip,
            "test_accuracy": dp_acc,
            "epsilon": round(compute_epsilon(event, delta=1e-5).epsilon, 3),
            "delta": 1e-5,
            "wall_s": round(time.perf_counter() - start, 1),
        },
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark and print its JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default="64,128,256")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--modes", default=",".join(GRAD_SAMPLE_MODES))
    parser.add_argument("--headline-batch", type=int, default=HEADLINE_BATCH)
    parser.add_argument("--accuracy", action="store_true", help="also train on MNIST")
    parser.add_argument("--plain-epochs", type=int, default=3)
    parser.add_argument("--dp-epochs", type=int, default=5)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batch_sizes.split(",")]
    modes = args.modes.split(",")
    devices = [torch.device("cpu")]
    if torch.cuda.is_available():
        devices.append(torch.device("cuda"))
    model = build_model("cnn", input_shape=INPUT_SHAPE, num_classes=10, seed=0)
    report: dict[str, Any] = {
        "benchmark": "dpsgd",
        "model": "cnn",
        "input_shape": list(INPUT_SHAPE),
        "parameters": sum(p.numel() for p in model.parameters()),
        "torch": torch.__version__,
        "cpu_threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "repeats": args.repeats,
        "target_ratio": TARGET_RATIO,
        "cuda": None,
    }
    for device in devices:
        per_batch = {str(b): _measure(device, b, modes, args.repeats, args.warmup) for b in batches}
        key = device.type
        report[key] = {"batches": per_batch}
        if device.type == "cuda":
            report[key]["name"] = torch.cuda.get_device_name(device)
    headline = report["cpu"]["batches"].get(str(args.headline_batch))
    if headline and HEADLINE_MODE in headline:
        report["headline"] = {
            "batch_size": args.headline_batch,
            "mode": HEADLINE_MODE,
            "plain_ms": headline["plain_ms"],
            "dp_ms": headline[HEADLINE_MODE]["dp_ms"],
            "ratio": headline[HEADLINE_MODE]["ratio"],
            "meets_target": headline[HEADLINE_MODE]["ratio"] <= TARGET_RATIO,
        }
    if args.accuracy:
        report["accuracy"] = _accuracy(args.plain_epochs, args.dp_epochs)
    print(json.dumps(report, separators=(",", ":")))
    return report


if __name__ == "__main__":
    main()
