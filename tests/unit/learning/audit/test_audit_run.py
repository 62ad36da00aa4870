"""The one-run audit of every algorithm on small data: ε_lower ≤ ε_upper, and a mechanism whose
noise is silently scaled down is caught (ε_lower above the charged ε)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from support.algorithm_harness import make_job, make_pate_job

from dpfl.learning.algorithms.base import AlgorithmError
from dpfl.learning.audit import run_audit
from dpfl.learning.audit.synthetic import synthetic_federation
from dpfl.learning.jobs import parse_job
from dpfl.mechanisms.noise import NoiseSpec

SEED = b"dpfl-audit-test-seed-0001"


def _fedsgd_job(**privacy: Any) -> Any:
    return parse_job(
        {
            "name": "audit-fedsgd",
            "algorithm": "dp-fedsgd",
            "data": {"dataset": "digits", "partition": {"scheme": "iid"}},
            "model": "logreg",
            "rounds": 1,
            "privacy": {"unit": "record", "target_epsilon": 4.0, "delta": 1e-5, **privacy},
            "params": {
                "clip": 1.0,
                "local_steps": 1,
                "batch_sampling_rate": 1.0,
                "learning_rate": 0.5,
                "expected_batch_size": 40,
                "max_local_size": 40,
            },
        }
    )


def _jobs() -> Iterator[tuple[str, Any, int, int]]:
    """(label, job, agents, canaries) for every algorithm, each a few seconds."""
    yield "dp-fedavg", make_job(name="audit-fedavg", rounds=3), 6, 120
    yield (
        "dp-fed-ls",
        make_job(
            name="audit-ls",
            algorithm="dp-fed-ls",
            rounds=3,
            params={"sigma_ls": 1.0, "client_sampling": "uniform"},
        ),
        6,
        120,
    )
    yield (
        "dp-fedsgd",
        parse_job(
            {
                "name": "audit-fedsgd-digits",
                "algorithm": "dp-fedsgd",
                "data": {"dataset": "digits", "partition": {"scheme": "iid"}},
                "model": "logreg",
                "rounds": 2,
                "privacy": {"unit": "record", "target_epsilon": 4.0, "delta": 1e-5},
                "params": {
                    "clip": 1.0,
                    "local_steps": 1,
                    "batch_sampling_rate": 0.3,
                    "learning_rate": 0.5,
                },
            }
        ),
        4,
        200,
    )
    for unit, loss in (("record", "huber"), ("agent", "huber"), ("record", "softmax")):
        yield (
            f"dp-helmet-{unit}-{loss}",
            parse_job(
                {
                    "name": f"audit-helmet-{unit}-{loss}",
                    "algorithm": "dp-helmet",
                    "data": {"dataset": "digits", "partition": {"scheme": "iid"}},
                    "privacy": {"unit": unit, "target_epsilon": 4.0, "delta": 1e-5},
                    "params": {"regularization": 1.0, "radius": 1.4, "epochs": 2, "loss": loss},
                }
            ),
            4,
            200,
        )
    yield "pate-fl-agent", make_pate_job(name="audit-pate", rounds=1), 5, 100
    yield (
        "private-knn-fl-record",
        make_pate_job(
            name="audit-knn",
            algorithm="private-knn-fl",
            rounds=1,
            privacy={"unit": "record"},
            params={"queries": 60, "k": 5, "sigma": 2.0, "student_epochs": 2},
        ),
        4,
        200,
    )


@pytest.mark.slow
@pytest.mark.parametrize(("label", "job", "agents", "canaries"), list(_jobs()))
def test_lower_bound_stays_below_the_ledger(
    label: str, job: Any, agents: int, canaries: int
) -> None:
    report = run_audit(job, agents=agents, canaries=canaries, seed=SEED)
    assert report.algorithm == job.algorithm
    assert report.canaries == canaries
    assert 0 < report.guesses <= canaries
    assert 0.0 <= report.epsilon_lower <= report.epsilon_upper, label
    assert report.epsilon_upper > 0
    assert 0 <= report.correct <= report.guesses


@pytest.fixture(scope="module")
def synthetic() -> Any:
    return synthetic_federation(agents=4, records_per_agent=40, informative=5, silent=300)


def _audit_synthetic(synthetic: Any, **kwargs: Any) -> Any:
    return run_audit(
        _fedsgd_job(),
        agents=4,
        canaries=600,
        seed=SEED,
        coordinates=synthetic.silent_coordinates,
        data=(synthetic.coordinator, synthetic.agents),
        **kwargs,
    )


def test_sound_mechanism_on_silent_coordinates_is_audited_below_but_near_the_ledger(
    synthetic: Any,
) -> None:
    report = _audit_synthetic(synthetic)
    assert report.epsilon_lower <= report.epsilon_upper
    # the audit has power: over 12 seeds this design gives 0.67 to 1.34 against ε_upper 4
    assert report.epsilon_lower > 0.15 * report.epsilon_upper
    # the Gaussian-family bound uses the whole trade-off curve: tighter, and still below
    assert report.epsilon_lower < report.epsilon_lower_gdp <= report.epsilon_upper
    assert report.mu_lower > 0
    assert 0 < report.gdp_correct <= report.gdp_guesses
    assert "trace" not in report.to_json()
    # the trace is what the ledger charges: ε_upper is the canaries' units' ε over its rounds
    assert len(report.trace.rounds) == report.rounds
    assert set(report.trace.units) <= set(report.trace.rounds[0].charges)


def test_plan_only_guesses_need_no_union_bound(synthetic: Any) -> None:
    report = _audit_synthetic(synthetic, catch_all=False)
    assert 0.0 < report.epsilon_lower <= report.epsilon_lower_gdp <= report.epsilon_upper
    assert report.guesses < report.canaries  # the plan's count, without r = m beside it
    assert report.gdp_guesses < report.canaries


def test_noise_scaled_down_is_caught(synthetic: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every agent's noise ×0.1 (in the sampler both encoders use) while the plan, the agents'
    checks and the ledger still claim the full noise: the audit proves more leakage than the
    charged ε."""
    original = NoiseSpec.sample

    def thinned(self: NoiseSpec, count: int, stream: Any) -> Any:
        return np.rint(original(self, count, stream) * 0.1).astype(np.int64)

    monkeypatch.setattr(NoiseSpec, "sample", thinned)
    report = _audit_synthetic(synthetic)
    assert report.epsilon_lower > report.epsilon_upper
    assert report.epsilon_lower_gdp > report.epsilon_upper


def test_black_box_reads_the_final_model(synthetic: Any) -> None:
    report = _audit_synthetic(synthetic, mode="black-box")
    assert report.mode == "black-box"
    assert 0.0 < report.epsilon_lower <= report.epsilon_upper


def test_designs_refuse_what_they_cannot_audit() -> None:
    with pytest.raises(AlgorithmError, match="one local step"):
        run_audit(_fedsgd_job_with_steps(3), agents=3, canaries=10, seed=SEED)
    with pytest.raises(AlgorithmError, match="white-box"):
        run_audit(make_pate_job(name="p", rounds=1), agents=3, canaries=10, mode="black-box")
    with pytest.raises(AlgorithmError, match="mode must be"):
        run_audit(_fedsgd_job(), agents=3, canaries=10, mode="grey-box")
    with pytest.raises(AlgorithmError, match="distinct coordinates"):
        run_audit(_fedsgd_job(), agents=3, canaries=10_000, seed=SEED)


def _fedsgd_job_with_steps(steps: int) -> Any:
    job = _fedsgd_job()
    return job.model_copy(update={"params": job.params.model_copy(update={"local_steps": steps})})


def test_the_canary_design_comes_from_the_algorithm() -> None:
    """A new member of an audited family is audited as its family, an algorithm may state its
    own design, and one that does neither is refused by name; the black-box direction is the
    algorithm's own."""
    from dpfl.learning.algorithms.base import Algorithm, CoordinatorData
    from dpfl.learning.algorithms.dp_fedavg import DpFedAvg
    from dpfl.learning.algorithms.dp_fedsgd import DpFedSgd
    from dpfl.learning.audit import CanaryDesign, canary_design
    from dpfl.learning.audit.canaries import ADD_REMOVE

    class Member(DpFedAvg):
        pass

    own = CanaryDesign(
        unit="agent",
        relation=ADD_REMOVE,
        amplitude=1.0,
        presence_rate=1.0,
        black_box=False,
        description="its own",
    )

    class Own(DpFedAvg):
        def canary_design(self, job: Any, plan: Any) -> CanaryDesign:
            return own

    class Bare(Algorithm):  # type: ignore[type-arg]
        name = "bare"

    Bare.__abstractmethods__ = frozenset()  # only its class matters here
    job = make_job()
    plan = DpFedAvg().plan(job, population=20, data=CoordinatorData((1, 8, 8), 10))
    assert canary_design(Member(), job, plan) == canary_design(DpFedAvg(), job, plan)
    assert canary_design(Own(), job, plan) is own
    with pytest.raises(AlgorithmError, match="no canary design for algorithm 'bare'"):
        canary_design(Bare(), job, plan)
    assert (DpFedAvg.model_direction, DpFedSgd.model_direction, Bare.model_direction) == (
        1.0,
        -1.0,
        None,
    )
