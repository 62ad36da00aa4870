"""The model zoo: ``logreg``, ``mlp`` and ``cnn``, sized from a data set's input shape and classes.

Every model is DP-SGD ready: no BatchNorm and no buffers, only layers Opacus's per-sample
samplers support, with ``tanh`` by default (bounded activations keep the clipping bias small:
Papernot et al., AAAI 2021). The CNN's shape keeps a DP-SGD step cheap on CPU
(docs/performance.md#learning-dp-sgd-step-cost-benchmarksdpsgdpy). Models are specified like data
sets (``mlp?hidden=256,128``); initialisation is a pure function of the seed.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from dpfl.learning.errors import ModelError
from dpfl.learning.specs import Spec, parse_spec

__all__ = [
    "MODEL_NAMES",
    "ModelSpec",
    "Tanh",
    "build_model",
    "parse_model_spec",
    "seeded_initialisation",
    "with_memory_format",
]

_GLOBAL_GENERATOR = threading.Lock()


@contextmanager
def seeded_initialisation(seed: int) -> Iterator[None]:
    """Layers built in the block draw from torch's global CPU generator seeded by ``seed``,
    restored afterwards, one thread at a time: interleaved builds on an agent host's threads
    would draw from each other's stream, and torch's ``get_rng_state`` can deadlock against
    another thread's (docs/performance.md#building-models-on-several-threads)."""
    with _GLOBAL_GENERATOR, torch.random.fork_rng(devices=[]):
        # the CPU generator alone, the one fork_rng restores: torch.manual_seed would also
        # reseed every CUDA generator for good, and without CUDA it records a stack trace for
        # later (73 µs a call, against 1 µs)
        torch.default_generator.manual_seed(seed)
        yield


MODEL_NAMES = ("logreg", "mlp", "cnn")
_OPTIONS = {"logreg": (), "mlp": ("hidden", "activation"), "cnn": ("channels", "activation")}


class _TanhFunction(torch.autograd.Function):
    """``tanh(x) = 2·σ(2x) − 1`` (within 2e-7 of ``torch.tanh`` everywhere), with tanh's own
    backward ``g·(1 − y²)``. On CPU torch's sigmoid kernel is about ten times faster than its tanh
    kernel, which was a third of a CNN step (docs/performance.md#the-cnns-elementwise-layers)."""

    generate_vmap_rule = True  # torch.func's per-sample gradients batch it like any op

    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.sigmoid(x * 2.0).mul_(2.0).sub_(1.0)
        return out

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (out,) = ctx.saved_tensors
        result: torch.Tensor = torch.ops.aten.tanh_backward(grad, out)
        return result


class Tanh(nn.Module):
    """The hyperbolic tangent, computed by :class:`_TanhFunction`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _tanh(x)


_tanh = cast(Callable[[torch.Tensor], torch.Tensor], _TanhFunction.apply)


_ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": Tanh, "relu": nn.ReLU}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A model architecture, fully determined (options resolved against the input shape).

    Attributes:
        name: ``logreg``, ``mlp`` or ``cnn``.
        input_shape: per-sample input shape, ``(C, H, W)`` or ``(d,)``.
        num_classes: number of output logits.
        hidden: hidden layer widths (``mlp``) or channels per block (``cnn``); empty for logreg.
        activation: ``tanh`` or ``relu``.
    """

    name: str
    input_shape: tuple[int, ...]
    num_classes: int
    hidden: tuple[int, ...] = ()
    activation: str = "tanh"

    def build(self, *, seed: int) -> nn.Module:
        """Instantiate the model with parameters drawn from a generator seeded by ``seed``."""
        with seeded_initialisation(seed):
            if self.name == "logreg":
                return _logreg(self)
            if self.name == "mlp":
                return _mlp(self)
            return _cnn(self)


def _pairs(text: str, spec: Spec, key: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise ModelError(f"{spec}: {key}={text!r} must be comma-separated integers") from None
    if not values or any(v < 1 or v > 4096 for v in values):
        raise ModelError(f"{spec}: {key}={text!r} must be integers in [1, 4096]")
    return values


def parse_model_spec(spec: str, *, input_shape: tuple[int, ...], num_classes: int) -> ModelSpec:
    """Resolve a model spec string against the data it will see.

    Raises:
        ModelError: unknown model or option, or a model that does not fit the input (``cnn`` on
            tabular data, or images smaller than 4x4).
    """
    parsed = parse_spec(spec, what="model", error=ModelError)
    if parsed.name not in _OPTIONS or parsed.path is not None:
        raise ModelError(f"unknown model {spec!r} (known: {', '.join(MODEL_NAMES)})")
    parsed.check_options(_OPTIONS[parsed.name], error=ModelError)
    shape = tuple(int(s) for s in input_shape)
    if not shape or any(s < 1 for s in shape):
        raise ModelError(f"{spec}: bad input shape {input_shape}")
    if num_classes < 2:
        raise ModelError(f"{spec}: needs at least 2 classes, got {num_classes}")
    activation = parsed.option("activation") or "tanh"
    if activation not in _ACTIVATIONS:
        raise ModelError(f"{spec}: activation must be one of {sorted(_ACTIVATIONS)}")
    hidden: tuple[int, ...] = ()
    if parsed.name == "mlp":
        hidden = _pairs(parsed.option("hidden") or "128", parsed, "hidden")
    elif parsed.name == "cnn":
        if len(shape) != 3:
            raise ModelError(
                f"{spec}: a CNN needs image inputs (channels, height, width), but the data has "
                f"shape {shape}; use logreg or mlp for tabular data"
            )
        if min(shape[1:]) < 4:
            raise ModelError(f"{spec}: images of {shape[1]}x{shape[2]} are too small for a CNN")
        default = "16,32,32" if min(shape[1:]) >= 16 else "16,32"
        hidden = _pairs(parsed.option("channels") or default, parsed, "channels")
        if min(shape[1:]) < 2 ** len(hidden):
            raise ModelError(
                f"{spec}: {len(hidden)} pooling blocks need images of at least "
                f"{2 ** len(hidden)}x{2 ** len(hidden)} pixels, got {shape[1]}x{shape[2]}"
            )
    return ModelSpec(
        name=parsed.name,
        input_shape=shape,
        num_classes=int(num_classes),
        hidden=hidden,
        activation=activation,
    )


def build_model(
    spec: str, *, input_shape: tuple[int, ...], num_classes: int, seed: int = 0
) -> nn.Module:
    """Build ``logreg``, ``mlp`` or ``cnn`` for the given input shape and number of classes.

    Args:
        spec: model spec, e.g. ``"cnn"`` or ``"mlp?hidden=256"``.
        input_shape: per-sample shape, e.g. ``dataset.input_shape``.
        num_classes: number of classes, e.g. ``dataset.num_classes``.
        seed: initialisation seed; equal seeds give bit-identical parameters.

    Raises:
        ModelError: see :func:`parse_model_spec`.
    """
    return parse_model_spec(spec, input_shape=input_shape, num_classes=num_classes).build(seed=seed)


def _logreg(spec: ModelSpec) -> nn.Module:
    d = math.prod(spec.input_shape)
    return nn.Sequential(
        OrderedDict([("flatten", nn.Flatten()), ("linear", nn.Linear(d, spec.num_classes))])
    )


def _mlp(spec: ModelSpec) -> nn.Module:
    layers: OrderedDict[str, nn.Module] = OrderedDict(flatten=nn.Flatten())
    width = math.prod(spec.input_shape)
    for i, h in enumerate(spec.hidden, start=1):
        layers[f"fc{i}"] = nn.Linear(width, h)
        layers[f"act{i}"] = _ACTIVATIONS[spec.activation]()
        width = h
    layers["head"] = nn.Linear(width, spec.num_classes)
    return nn.Sequential(layers)


def _cnn(spec: ModelSpec) -> nn.Module:
    channels, height, width = spec.input_shape
    layers: OrderedDict[str, nn.Module] = OrderedDict()
    for i, out in enumerate(spec.hidden, start=1):
        layers[f"conv{i}"] = nn.Conv2d(channels, out, kernel_size=3, padding=1)
        layers[f"act{i}"] = _ACTIVATIONS[spec.activation]()
        # ceil_mode keeps the border row/column of odd sizes (7 -> 4, not 3).
        layers[f"pool{i}"] = nn.AvgPool2d(kernel_size=2, ceil_mode=True)
        channels, height, width = out, math.ceil(height / 2), math.ceil(width / 2)
    layers["flatten"] = nn.Flatten()
    layers["head"] = nn.Linear(channels * height * width, spec.num_classes)
    # channels-last feature maps: torch's CPU pooling and convolutions run several times faster
    # on them; the weights keep their logical shape (every reader reshapes or copies them)
    return with_memory_format(nn.Sequential(layers), torch.channels_last)


def with_memory_format(model: nn.Module, layout: torch.memory_format) -> nn.Module:
    """``model`` with its 4-d parameters (convolution weights) laid out as ``layout``, in place;
    the values and logical shapes are unchanged.

    Every weight is copied into fresh storage of that layout: ``Tensor.contiguous`` would keep a
    one-channel weight as it is (both layouts "contiguous" when C = 1), and a convolution picks
    its output's layout from its weight's strides, so one such weight would send the whole network
    back to the other layout."""
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 4:
                param.data = torch.empty_like(param.data, memory_format=layout).copy_(param.data)
    return model
