"""The model zoo: sizes from the data, Opacus compatibility, deterministic initialisation."""

from __future__ import annotations

import pytest
import torch
from opacus.validators import ModuleValidator

from dpfl.learning import models
from dpfl.learning.errors import ModelError
from dpfl.learning.models import MODEL_NAMES, build_model, parse_model_spec
from dpfl.learning.params import flatten_parameters

SHAPES = [(1, 8, 8), (1, 16, 16), (1, 28, 28), (3, 32, 32)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_models_fit_images_and_are_opacus_compatible(name: str, shape: tuple[int, ...]) -> None:
    model = build_model(name, input_shape=shape, num_classes=7, seed=0)
    assert model(torch.zeros(3, *shape)).shape == (3, 7)
    assert ModuleValidator.validate(model, strict=True) == []
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
    assert list(model.buffers()) == []


def test_tabular_data_gets_logreg_and_mlp_but_not_cnn() -> None:
    for name in ("logreg", "mlp?hidden=32,16&activation=relu"):
        model = build_model(name, input_shape=(13,), num_classes=3)
        assert model(torch.zeros(2, 13)).shape == (2, 3)
    with pytest.raises(ModelError, match="CNN needs image inputs"):
        build_model("cnn", input_shape=(13,), num_classes=3)


def test_cnn_layout_and_sizes() -> None:
    spec = parse_model_spec("cnn", input_shape=(1, 28, 28), num_classes=10)
    assert spec.hidden == (16, 32, 32)
    assert parse_model_spec("cnn", input_shape=(1, 8, 8), num_classes=10).hidden == (16, 32)
    model = build_model("cnn", input_shape=(1, 28, 28), num_classes=10)
    assert sum(p.numel() for p in model.parameters()) == 19178
    assert build_model("cnn?channels=4", input_shape=(1, 8, 8), num_classes=2) is not None
    with pytest.raises(ModelError, match="at least 8x8"):
        build_model("cnn?channels=4,4,4", input_shape=(1, 4, 4), num_classes=2)
    with pytest.raises(ModelError, match="too small"):
        build_model("cnn", input_shape=(1, 3, 3), num_classes=2)


def test_initialisation_is_a_function_of_the_seed_and_leaves_global_rng_alone() -> None:
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a = flatten_parameters(build_model("cnn", input_shape=(1, 8, 8), num_classes=10, seed=4))
    assert torch.equal(torch.rand(1), expected_next)
    b = flatten_parameters(build_model("cnn", input_shape=(1, 8, 8), num_classes=10, seed=4))
    c = flatten_parameters(build_model("cnn", input_shape=(1, 8, 8), num_classes=10, seed=5))
    assert (a == b).all()
    assert not (a == c).all()


@pytest.mark.parametrize("name", ["logreg", "mlp", "cnn"])
def test_a_seed_gives_the_parameters_of_torch_seeded_by_it(name: str) -> None:
    # the seed's models stay those of torch.manual_seed(seed) then the layers, as ever
    spec = parse_model_spec(name, input_shape=(1, 8, 8), num_classes=10)
    layers = {"logreg": models._logreg, "mlp": models._mlp, "cnn": models._cnn}[name]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(11)
        expected = flatten_parameters(layers(spec))
    assert (flatten_parameters(spec.build(seed=11)) == expected).all()


def test_building_leaves_the_cuda_generators_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    # fork_rng(devices=[]) restores the CPU generator only: reseeding CUDA's would last
    def refuse(seed: int) -> None:
        raise AssertionError(f"a model build reseeded the CUDA generators with {seed}")

    monkeypatch.setattr(torch.cuda, "manual_seed_all", refuse)
    build_model("cnn", input_shape=(1, 8, 8), num_classes=10, seed=3)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("resnet", "unknown model"),
        ("mlp?width=3", "unknown option"),
        ("mlp?hidden=0", "integers in"),
        ("mlp?hidden=a", "comma-separated integers"),
        ("logreg?activation=relu", "unknown option"),
        ("mlp?activation=gelu", "activation must be"),
        ("cnn:path", "unknown model"),
    ],
)
def test_bad_model_specs(spec: str, message: str) -> None:
    with pytest.raises(ModelError, match=message):
        build_model(spec, input_shape=(1, 8, 8), num_classes=10)


def test_bad_sizes() -> None:
    with pytest.raises(ModelError, match="at least 2 classes"):
        build_model("logreg", input_shape=(4,), num_classes=1)
    with pytest.raises(ModelError, match="bad input shape"):
        build_model("logreg", input_shape=(), num_classes=2)


def test_tanh_is_tanh_in_value_and_gradient() -> None:
    """The activation computes tanh as 2·σ(2x) − 1 (a faster CPU kernel): within 2e-7 of
    torch.tanh, with tanh's derivative, and under torch.func's vmap."""
    from dpfl.learning.models import Tanh

    x = torch.linspace(-30.0, 30.0, 200_001, requires_grad=True)
    y = Tanh()(x)
    ref = torch.tanh(x.detach())
    assert (y.detach() - ref).abs().max().item() <= 2e-7
    (g,) = torch.autograd.grad(y.sum(), x)
    assert (g - (1 - ref * ref)).abs().max().item() <= 1e-6
    batched = torch.func.vmap(torch.func.grad(lambda v: Tanh()(v).sum()))(x.detach()[:10, None])
    assert torch.allclose(batched[:, 0], 1 - ref[:10] ** 2, atol=1e-6)


def _conv_outputs(model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    outputs: list[torch.Tensor] = []
    hooks = [
        m.register_forward_hook(lambda _m, _i, out: outputs.append(out))
        for m in model.modules()
        if isinstance(m, torch.nn.Conv2d)
    ]
    model(x)
    for hook in hooks:
        hook.remove()
    return outputs


@pytest.mark.parametrize("channels", [1, 3])
def test_every_convolution_of_the_cnn_runs_in_the_layout_asked_for(channels: int) -> None:
    """Each convolution weight, the one-channel first one included, has the strides of the
    layout asked for, and so has each convolution's output: ``Tensor.contiguous`` leaves a
    one-channel weight as it was, and a convolution then picks the other layout."""
    from dpfl.learning.models import with_memory_format

    model = build_model("cnn", input_shape=(channels, 16, 16), num_classes=4, seed=1)
    x = torch.randn(3, channels, 16, 16)
    for layout in (torch.channels_last, torch.contiguous_format, torch.channels_last):
        with_memory_format(model, layout)
        for param in model.parameters():
            if param.dim() == 4:
                assert param.stride() == torch.empty(param.shape, memory_format=layout).stride()
        outputs = _conv_outputs(model, x)
        assert len(outputs) == 3
        for out in outputs:
            assert out.stride() == torch.empty(out.shape, memory_format=layout).stride()


def test_cnn_runs_channels_last_and_its_parameters_travel_unchanged() -> None:
    """The CNN's feature maps are channels-last (faster CPU kernels); its parameters still
    flatten, serialise and load in their logical order."""
    from dpfl.learning.params import assign_parameters, model_from_bytes, model_to_bytes

    model = build_model("cnn", input_shape=(1, 28, 28), num_classes=10, seed=3)
    assert model.conv2.weight.is_contiguous(memory_format=torch.channels_last)
    assert not model.conv2.weight.is_contiguous()
    flat = flatten_parameters(model)
    plain = [p.detach().contiguous().reshape(-1) for p in model.parameters()]
    assert (flat == torch.cat(plain).numpy()).all()
    other = build_model("cnn", input_shape=(1, 28, 28), num_classes=10, seed=4)
    model_from_bytes(model_to_bytes(model), model=other)
    assert (flatten_parameters(other) == flat).all()
    fresh = build_model("cnn", input_shape=(1, 28, 28), num_classes=10, seed=5)
    assign_parameters(fresh, flat)
    x = torch.randn(5, 1, 28, 28)
    assert torch.equal(fresh(x), model(x))
    assert fresh.conv2.weight.is_contiguous(memory_format=torch.channels_last)


def test_models_built_on_many_threads_at_once_are_those_of_their_seeds() -> None:
    """An agent host builds its agents' models on a pool of threads. Each build seeds torch's
    global generator, so two builds that interleave would draw from each other's stream (and
    torch's ``get_rng_state``, which allocates under the generator's mutex, can run a finalizer
    that hands the GIL to a thread that then waits on that mutex holding the GIL: a deadlock
    seen in the suite). Builds take turns; every model is the one its seed gives alone."""
    import sys
    import threading

    specs = [("cnn", (1, 12, 12)), ("mlp?hidden=64,32", (1, 12, 12))]
    expected = {
        (spec, seed): flatten_parameters(
            build_model(spec, input_shape=shape, num_classes=10, seed=seed)
        )
        for spec, shape in specs
        for seed in range(4)
    }
    got: dict[tuple[str, int], list[torch.Tensor]] = {key: [] for key in expected}
    start = threading.Barrier(8)

    def builder(index: int) -> None:
        start.wait()
        for round_ in range(20):
            spec, shape = specs[(index + round_) % 2]
            seed = (index * 7 + round_) % 4
            model = build_model(spec, input_shape=shape, num_classes=10, seed=seed)
            got[(spec, seed)].append(flatten_parameters(model))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    try:
        threads = [threading.Thread(target=builder, args=(i,), daemon=True) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    finally:
        sys.setswitchinterval(interval)
    assert not any(thread.is_alive() for thread in threads), "a build never finished"
    assert sum(len(v) for v in got.values()) == 160
    for key, built in got.items():
        assert all((b == expected[key]).all() for b in built), key
