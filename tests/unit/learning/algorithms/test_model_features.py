"""DP-FedAvg, DP-Fed-LS and DP-FedSGD behind a frozen feature map (``params.features``): the
coordinator fits a learned map on the public pool only, bundles it with every model version, the
plan and charge are those of the model on φ's output, and an agent refuses a map the task does
not name."""

from __future__ import annotations

import struct
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from dpfl.learning.algorithms.base import AgentData, AlgorithmError, CoordinatorData
from dpfl.learning.algorithms.dp_fed_ls import ALGORITHM as FEDLS
from dpfl.learning.algorithms.dp_fedavg import ALGORITHM as FEDAVG
from dpfl.learning.algorithms.dp_fedsgd import ALGORITHM as FEDSGD
from dpfl.learning.algorithms.model_update import load_front, load_model
from dpfl.learning.algorithms.parts import frozen_features
from dpfl.learning.algorithms.parts.feature_cache import FEATURES
from dpfl.learning.algorithms.parts.frozen_features import MAGIC, FeatureFront, front_for, unpack
from dpfl.learning.jobs import parse_job
from dpfl.learning.params import flatten_parameters
from dpfl.simulation import simulate_job

KMEANS = {"centroids": 16, "patch": 3, "stride": 1, "dim": 16}


def _job(features: str = "public-kmeans", **params: object) -> dict[str, object]:
    return {
        "name": "fedavg-features",
        "algorithm": "dp-fedavg",
        "data": {
            "dataset": "digits",
            "partition": {"scheme": "shards", "classes_per_agent": 3},
            "public": {"source": "train", "fraction": 0.2},
        },
        "model": "logreg",
        "rounds": 3,
        "privacy": {"unit": "agent", "delta": 1e-5, "target_epsilon": 8.0, "noise": "skellam"},
        "params": {
            "clip": 1.0,
            "sampling_rate": 1.0,
            "local_epochs": 2,
            "learning_rate": 0.5,
            "features": features,
            "public_kmeans": KMEANS,
            "public_pca": {"dim": 12},
            "public_gabor": {"dim": 10, "norm": 8.0},
            "projection_dim": 24,
            "gabor": {"orientations": 4, "pool": 2},
            **params,
        },
    }


Split = tuple[CoordinatorData, AgentData]


@pytest.mark.parametrize(
    ("features", "width"),
    [
        ("public-kmeans", 16),
        ("public-pca", 12),
        ("public-gabor", 10),
        ("random-projection", 24),
        ("gabor", (2 * 4 + 1) * 4),
        ("identity", None),
    ],
)
def test_the_plan_sizes_the_model_for_the_maps_output(
    features: str, width: int | None, digits_public_split: Split
) -> None:
    coordinator, _ = digits_public_split
    plan = FEDAVG.plan(parse_job(_job(features)), population=5, data=coordinator)
    inputs = 64 if width is None else width
    assert plan.details.feature_dim == width
    assert plan.details.dimension == (inputs + 1) * 10
    assert plan.details.features.split("?")[0] == features


@pytest.mark.parametrize(("features", "width"), [("public-kmeans", 16), ("public-gabor", 10)])
def test_a_learned_map_is_bundled_and_agents_check_its_hash(
    features: str, width: int, digits_public_split: Split
) -> None:
    job = parse_job(_job(features))
    coordinator, agent = digits_public_split
    plan = FEDAVG.plan(job, population=5, data=coordinator)
    state = FEDAVG.bind(job, plan).initial_state(coordinator)
    assert state.model is not None
    assert state.model.startswith(MAGIC)
    front = load_front(state)
    assert front is not None
    assert front.dim == width
    assert front.spec.startswith(features)
    assert front.artifact is not None
    task = FEDAVG.bind(job, plan).round_task(state, round_number=1)
    params = FEDAVG.parse_task(task.params.to_json())  # what the agent parses
    assert params.features_sha256 == front.sha256
    delta = FEDAVG.agent(params).compute(agent, model=state.model, public_x=None, device="cpu")
    assert delta.shape == (plan.details.dimension,)
    assert 0 < np.linalg.norm(delta) <= 1.0 + 1e-9

    tampered = FeatureFront(
        spec=front.spec, dim=front.dim, sha256=front.sha256, artifact=front.artifact[:-1] + b"\0"
    ).pack(unpack(state.model)[1])
    with pytest.raises(AlgorithmError, match="SHA-256"):
        FEDAVG.agent(params).compute(agent, model=tampered, public_x=None, device="cpu")
    unnamed = FEDAVG.parse_task({**task.params.to_json(), "features_sha256": None})
    with pytest.raises(AlgorithmError, match="without its SHA-256"):
        FEDAVG.agent(unnamed).compute(agent, model=state.model, public_x=None, device="cpu")
    plain = unpack(state.model)[1]
    with pytest.raises(AlgorithmError, match="carries none"):
        FEDAVG.agent(params).compute(agent, model=plain, public_x=None, device="cpu")
    pixels = FEDAVG.parse_task(
        {**task.params.to_json(), "features": "identity", "features_sha256": None}
    )
    with pytest.raises(AlgorithmError, match="names none"):
        FEDAVG.agent(pixels).compute(agent, model=state.model, public_x=None, device="cpu")
    with pytest.raises(AlgorithmError, match="only a learned feature map"):
        FEDAVG.parse_task({**task.params.to_json(), "features": "random-projection?dim=24&seed=0"})
    with pytest.raises(AlgorithmError, match=r"data\.public"):
        FEDAVG.bind(job, plan).initial_state(replace(coordinator, public_x=None))


def test_a_round_steps_the_model_behind_the_same_map(digits_public_split: Split) -> None:
    job = parse_job(_job("public-pca"))
    coordinator, _ = digits_public_split
    plan = FEDAVG.plan(job, population=1, data=coordinator)
    state = FEDAVG.bind(job, plan).initial_state(coordinator)
    before = flatten_parameters(load_model(job, state, coordinator), dtype=np.float64)
    step = np.full(plan.details.dimension, 0.01)
    outcome = FEDAVG.bind(job, plan).finish_round(
        state, coordinator, round_number=1, aggregate=step, survivors=1
    )
    after = load_model(job, outcome.state, coordinator)
    assert load_front(outcome.state) == load_front(state)  # the map never changes
    assert not np.allclose(flatten_parameters(after, dtype=np.float64), before)
    assert 0.0 <= outcome.metrics["accuracy"] <= 1.0


def test_a_cnn_behind_a_map_is_refused(digits_public_split: Split) -> None:
    coordinator, _ = digits_public_split
    job = parse_job({**_job("public-pca"), "model": "cnn"})
    with pytest.raises(AlgorithmError, match=r"params\.features.*use logreg or mlp"):
        FEDAVG.plan(job, population=5, data=coordinator)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: b[: len(MAGIC) + 2], "truncated"),
        (lambda b: b[: len(MAGIC)] + struct.pack("<I", 1 << 20) + b[len(MAGIC) + 4 :], "header"),
        (lambda b: b[: len(MAGIC) + 4] + b"[" + b[len(MAGIC) + 5 :], "not JSON"),
    ],
)
def test_malformed_bundles_are_refused(
    mutate: object, message: str, digits_public_split: Split
) -> None:
    coordinator, _ = digits_public_split
    front = front_for("public-pca?dim=12", coordinator)
    assert front is not None
    blob = front.pack(b"model")
    assert unpack(blob) == (front, b"model")
    assert unpack(b"DPFLMDL1plain") == (None, b"DPFLMDL1plain")
    with pytest.raises(AlgorithmError, match=message):
        unpack(mutate(blob))  # type: ignore[operator]


def test_a_bundle_header_that_lies_about_its_map_is_refused() -> None:
    lying = FeatureFront(spec="public-pca?dim=12", dim=12).pack(b"model")  # learned, no hash
    with pytest.raises(AlgorithmError, match="exactly when it is learned"):
        unpack(lying)


def test_dp_fed_ls_trains_behind_a_map_end_to_end() -> None:
    """DP-Fed-LS (the smoothing post-processes the model's parameters only) completes with a
    learned map; the ledger's ε stays within the target: φ costs nothing."""
    doc = _job("public-pca", client_sampling="uniform", sampling_rate=0.6, sigma_ls=1.0)
    result = simulate_job(parse_job({**doc, "algorithm": "dp-fed-ls"}), agents=5)
    assert result.status == "completed", result.error
    assert max(result.epsilon.values()) <= 8.0 + 1e-9
    assert FEDLS.name == "dp-fed-ls"


def test_dp_fedavg_behind_a_learned_map_end_to_end() -> None:
    """Ten IID agents in process, through the whole system: the job completes behind the
    public-pca map, the ledger's ε stays within the target, and the model learns (measured 0.78
    to 0.80 over three runs with system CSPRNG noise; pixels 0.65 to 0.76)."""
    doc = _job("public-pca")
    doc["rounds"] = 5
    doc["data"] = {**doc["data"], "partition": {"scheme": "iid"}}  # type: ignore[dict-item]
    result = simulate_job(parse_job(doc), agents=10)
    assert result.status == "completed", result.error
    assert result.rounds_completed == 5
    assert max(result.epsilon.values()) <= 8.0 + 1e-9
    assert result.accuracy is not None
    assert result.accuracy >= 0.6


def test_dp_fedsgd_trains_behind_a_learned_map_end_to_end(digits_public_split: Split) -> None:
    """Record-level DP-FedSGD: each clipped per-record gradient is one of the small model on
    φ(x), so the plan's dimension is that model's; the job completes and the ledger's ε stays
    within the target. A cnn behind the map is refused by name."""
    doc: dict[str, object] = {
        "name": "fedsgd-features",
        "algorithm": "dp-fedsgd",
        "data": {
            "dataset": "digits",
            "partition": {"scheme": "iid"},
            "public": {"source": "train", "fraction": 0.2},
        },
        "model": "logreg",
        "rounds": 2,
        "privacy": {"unit": "record", "delta": 1e-5, "target_epsilon": 8.0, "noise": "skellam"},
        "params": {
            "clip": 1.0,
            "local_steps": 2,
            "batch_sampling_rate": 0.2,
            "learning_rate": 0.5,
            "features": "public-kmeans",
            "public_kmeans": KMEANS,
        },
    }
    coordinator, _ = digits_public_split
    plan = FEDSGD.plan(parse_job(doc), population=4, data=coordinator)
    assert plan.details.feature_dim == 16
    assert plan.details.dimension == 17 * 10
    result = simulate_job(parse_job(doc), agents=4)
    assert result.status == "completed", result.error
    assert max(result.epsilon.values()) <= 8.0 + 1e-9
    with pytest.raises(AlgorithmError, match="use logreg or mlp"):
        FEDSGD.plan(parse_job({**doc, "model": "cnn"}), population=4, data=coordinator)


def test_dp_fedavg_behind_the_gabor_map_end_to_end() -> None:
    """The fixed Gabor map needs no pool and ships nothing: the job completes through the whole
    system, within its ε, and learns on digits' 8 × 8 images. Thirty agents: with ten, the
    agent-level noise at ε = 8 spreads five rounds' accuracy over 0.55-0.72 (the noise is drawn
    from the OS, not a seed); with thirty, ten runs gave 0.83-0.89."""
    doc = _job("gabor")
    doc["rounds"] = 5
    doc["data"] = {"dataset": "digits", "partition": {"scheme": "iid"}}
    result = simulate_job(parse_job(doc), agents=30)
    assert result.status == "completed", result.error
    assert max(result.epsilon.values()) <= 8.0 + 1e-9
    assert result.accuracy is not None
    assert result.accuracy >= 0.6


def test_an_agent_maps_its_records_once_and_still_checks_every_download(
    digits_public_split: tuple[CoordinatorData, AgentData], monkeypatch: pytest.MonkeyPatch
) -> None:
    FEATURES.clear()
    coordinator, agent = digits_public_split
    job = parse_job(_job("public-kmeans"))
    plan = FEDAVG.plan(job, population=5, data=coordinator)
    side = FEDAVG.bind(job, plan)
    state = side.initial_state(coordinator)
    assert state.model is not None
    params = FEDAVG.parse_task(side.round_task(state, round_number=1).params.to_json())
    calls: list[int] = []
    built = FeatureFront.extractor

    def counting(self: FeatureFront, shape: tuple[int, ...], **kw: Any) -> Any:
        phi = built(self, shape, **kw)

        def run(x: np.ndarray) -> Any:
            calls.append(len(x))
            return phi(x)

        return run

    monkeypatch.setattr(FeatureFront, "extractor", counting)
    x, _, _ = frozen_features.agent_inputs(params, agent, state.model)
    again, _, _ = frozen_features.agent_inputs(params, agent, state.model)
    assert calls == [len(agent.x)]  # the second round reads the kept features
    assert again is x
    front = load_front(state)
    assert front is not None
    direct = np.asarray(built(front, tuple(agent.input_shape))(agent.x), np.float32)
    np.testing.assert_array_equal(x, direct)
    first = FEDAVG.agent(params).compute(agent, model=state.model, public_x=None, device="cpu")
    second = FEDAVG.agent(params).compute(agent, model=state.model, public_x=None, device="cpu")
    np.testing.assert_array_equal(first, second)  # same training on the same features
    assert calls == [len(agent.x)]

    assert front.artifact is not None
    tampered = FeatureFront(
        spec=front.spec, dim=front.dim, sha256=front.sha256, artifact=front.artifact[:-1] + b"\0"
    ).pack(unpack(state.model)[1])
    with pytest.raises(AlgorithmError, match="SHA-256"):
        frozen_features.agent_inputs(params, agent, tampered)


def test_a_header_that_names_a_kept_map_does_not_get_its_features(
    digits_public_split: tuple[CoordinatorData, AgentData],
) -> None:
    """A coordinator whose bundle carries map B's artifact (the one the task names) under map
    A's hash in its header: the agent keys its kept features on the hash it checked, so it
    trains on φ_B, never on the φ_A it kept from an earlier round."""
    FEATURES.clear()
    coordinator, agent = digits_public_split
    job = parse_job(_job("public-kmeans"))
    other = replace(coordinator, public_x=np.ascontiguousarray(coordinator.public_x[::-1][:200]))
    states, tasks = [], []
    for data in (coordinator, other):
        side = FEDAVG.bind(job, FEDAVG.plan(job, population=5, data=data))
        state = side.initial_state(data)
        states.append(state)
        tasks.append(FEDAVG.parse_task(side.round_task(state, round_number=1).params.to_json()))
    front_a, front_b = (load_front(s) for s in states)
    assert front_a is not None
    assert front_b is not None
    assert front_a.spec == front_b.spec
    assert front_a.sha256 != front_b.sha256
    assert states[0].model is not None
    assert states[1].model is not None
    kept, _, _ = frozen_features.agent_inputs(tasks[0], agent, states[0].model)
    lying = FeatureFront(
        spec=front_b.spec, dim=front_b.dim, sha256=front_a.sha256, artifact=front_b.artifact
    ).pack(unpack(states[1].model)[1])
    x, _, _ = frozen_features.agent_inputs(tasks[1], agent, lying)
    direct = np.asarray(front_b.extractor(tuple(agent.input_shape))(agent.x), np.float32)
    np.testing.assert_array_equal(x, direct)
    assert not np.array_equal(x, kept)
