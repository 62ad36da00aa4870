"""The one registry: a plugin distribution's ``dpfl.algorithms`` entry point registers a new
algorithm for the job documents, the agent's policy, the REST schema and ``get_algorithm``,
through the very path the built-in algorithms take; nothing else is edited. The plugin also
brings its own privacy event, with its own math, which the accountant, the ledger's JSON form,
the SQL store and the agent's policy take without an edit."""

from __future__ import annotations

import math
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from pydantic import TypeAdapter
from support.algorithm_harness import run_job
from support.databases import fresh_postgres_url

from dpfl.accounting import (
    ORDERS,
    ComposedEvent,
    GaussianEvent,
    PoissonSampledEvent,
    compute_epsilon,
    epsilon_from_rdp,
    event_from_json,
    event_to_json,
    rdp_curve,
)
from dpfl.client.policy import Policy, noise_multiplier
from dpfl.learning.algorithms import registry
from dpfl.learning.algorithms.base import AlgorithmError
from dpfl.learning.algorithms.registry import get_algorithm
from dpfl.learning.errors import LearningError
from dpfl.learning.jobs import JobSpecError, job_spec_union, parse_job
from dpfl.server.store import Budget, Charge, JobStatus, open_store

TOY = "toy-halved-fedavg"
#: The plugin's own event: a Gaussian release stated in its own units, with the closed-form RDP
#: ``α·l2²/(2·std²)``. Only this class knows its math; nothing in dpfl names it.
TOY_EVENTS_MODULE = '''
"""The privacy event of the toy plugin."""

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from dpfl.accounting import DpEvent


@dataclass(frozen=True, slots=True)
class ToyGaussianEvent(DpEvent):
    std: float
    l2: float
    kind: ClassVar[str] = "toy_gaussian"

    def rdp(self, orders):
        return self.gaussian_coefficient() * np.asarray(orders, dtype=np.float64)

    def gaussian_coefficient(self):
        return self.l2 ** 2 / (2.0 * self.std ** 2)

    def add_tight_parts(self, count, parts):
        parts.add_rho(count, self.gaussian_coefficient)

    def min_noise_multiplier(self):
        return self.std / self.l2

    def with_noise_fraction(self, fraction):
        return ToyGaussianEvent(self.std * fraction ** 0.5, self.l2)
'''
TOY_MODULE = '''
"""A toy algorithm of a plugin distribution: DP-FedAvg whose server step is halved, charging
its own event for Gaussian noise."""

from typing import ClassVar, Literal

from dpfl.accounting import GaussianEvent, PoissonSampledEvent
from dpfl.learning.algorithms.dp_fedavg import (
    FedAvgCoordinator, FedAvgFamily, FedAvgJobBase, FedAvgPlanBase, FedAvgTaskBase,
)
from dpfl_toy_events import ToyGaussianEvent


class ToyJob(FedAvgJobBase):
    algorithm: Literal["toy-halved-fedavg"]


class ToyPlan(FedAvgPlanBase):
    def round_event(self, population):
        if self.noise != "gaussian":
            return super().round_event(population)
        inner = ToyGaussianEvent(std=self.noise_total, l2=self.l2_sensitivity)
        if self.secure_aggregation and self.sampling_rate < 1.0:
            return PoissonSampledEvent(self.sampling_rate, inner)
        return inner


class ToyTask(FedAvgTaskBase):
    algorithm: Literal["toy-halved-fedavg"]

    def claimed_release(self, event):
        inner, factor = super().claimed_release(event)
        if isinstance(inner, ToyGaussianEvent):  # the agent checks the noise it stands for
            return GaussianEvent(sigma=inner.std, sensitivity=inner.l2), factor
        return inner, factor


class ToyCoordinator(FedAvgCoordinator):
    def _post_process(self, net, update):
        return update / 2.0


class Toy(FedAvgFamily[ToyJob, ToyPlan, ToyTask]):
    name: ClassVar[str] = "toy-halved-fedavg"
    spec_type = ToyJob
    plan_type = ToyPlan
    task_type = ToyTask
    coordinator_type = ToyCoordinator


ALGORITHM = Toy()
'''
#: q = 0.9 with eight agents: a round is never left short of the agents it needs (the sample is
#: drawn by the coordinator's system randomness; at q = 0.5 an occasional run charged no agent).
DOCUMENT = {
    "algorithm": TOY,
    "name": "toy",
    "rounds": 2,
    "params": {"sampling_rate": 0.9, "local_steps": 2},
    "privacy": {"target_epsilon": 4.0},
}


def _install(root: Path, module: str, source: str, *, dist: str) -> None:
    """A distribution as pip leaves it: the module and a dist-info naming its entry point."""
    (root / f"{module}.py").write_text(textwrap.dedent(source), encoding="utf-8")
    info = root / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[dpfl.algorithms]\n{dist} = {module}\n")


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    (tmp_path / "dpfl_toy_events.py").write_text(textwrap.dedent(TOY_EVENTS_MODULE), "utf-8")
    _install(tmp_path, "dpfl_toy_plugin", TOY_MODULE, dist="dpfl_toy_plugin")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.refresh()
    yield tmp_path
    monkeypatch.undo()
    sys.modules.pop("dpfl_toy_plugin", None)
    sys.modules.pop("dpfl_toy_events", None)
    sys.modules.pop("dpfl_toy_duplicate", None)
    registry.refresh()


def test_a_plugin_algorithm_is_registered_everywhere_through_its_entry_point(
    plugin: Path,
) -> None:
    algorithm = get_algorithm(TOY)
    assert type(algorithm).__module__ == "dpfl_toy_plugin"
    assert TOY in registry.algorithm_names()
    job = parse_job(DOCUMENT)
    assert isinstance(job, algorithm.spec_type)
    assert job.params.local_steps == 2  # type: ignore[attr-defined]
    assert TOY in Policy().allowed_algorithms  # the agent's default policy
    assert Policy(allowed_algorithms=(TOY,)).allowed_algorithms == (TOY,)
    schema = TypeAdapter(job_spec_union()).json_schema()
    assert any(TOY in str(v) for v in schema["$defs"].values())  # the REST job document
    with pytest.raises(JobSpecError, match=r"params\.clip: must be > 0"):
        parse_job({**DOCUMENT, "params": {"clip": 0}})

    # the whole job runs through the shared coordinator and agent code, both ledgers agree
    result = run_job(job, num_agents=8)
    assert [r.round for r in result.rounds] == [1, 2]
    assert result.ledger
    assert result.agent_ledgers
    task = algorithm.bind(job, result.plan).round_task(result.state, round_number=1)
    assert algorithm.parse_task(task.params.to_json()) == task.params
    with pytest.raises(AlgorithmError, match=r"params\.algorithm"):
        algorithm.parse_task({**task.params.to_json(), "algorithm": "dp-fedavg"})


def test_without_the_plugin_the_tag_is_unknown(plugin: Path) -> None:
    del plugin
    assert TOY in registry.algorithm_names()
    (entry,) = (p / "entry_points.txt" for p in Path(sys.path[0]).glob("*.dist-info"))
    entry.write_text("[dpfl.algorithms]\n", encoding="utf-8")  # uninstalled
    assert TOY in registry.algorithm_names()  # found once per process...
    registry.refresh()  # ...until the registry is asked to look again
    assert TOY not in registry.algorithm_names()
    with pytest.raises(JobSpecError, match=rf"unknown algorithm '{TOY}' \(expected one of"):
        parse_job(DOCUMENT)
    with pytest.raises(AlgorithmError, match=f"unknown algorithm '{TOY}'"):
        get_algorithm(TOY)
    with pytest.raises(ValueError, match="unknown algorithm"):
        Policy(allowed_algorithms=(TOY,))


def test_a_tag_registered_twice_or_a_mistagged_module_is_refused(plugin: Path) -> None:
    twice = TOY_MODULE.replace("ALGORITHM = Toy()", "ALGORITHM = Toy()\nToy.name = 'dp-fedavg'")
    _install(plugin, "dpfl_toy_duplicate", twice, dist="dpfl_toy_duplicate")
    registry.refresh()
    with pytest.raises(LearningError, match="is not tagged 'dp-fedavg'"):
        registry.algorithms()
    sys.modules.pop("dpfl_toy_duplicate")
    clash = TOY_MODULE.replace("class Toy(", "class Clash(").replace("Toy()", "Clash()")
    (plugin / "dpfl_toy_duplicate.py").write_text(textwrap.dedent(clash), encoding="utf-8")
    registry.refresh()
    with pytest.raises(LearningError, match=f"algorithm '{TOY}' is registered twice"):
        registry.algorithms()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'dpfl.db'}"
    return fresh_postgres_url(request)


def _closed_form_epsilon(multipliers: list[float], delta: float) -> float:
    """ε of Gaussians of noise multipliers z composed: RDP ``Σ α/(2z²)`` and the conversion of
    Balle et al. 2020, Thm. 21, written out here rather than taken from dpfl."""
    a = np.asarray(ORDERS, dtype=np.float64)
    curve = sum(a / (2.0 * z * z) for z in multipliers)
    eps = curve + np.log1p(-1.0 / a) - (math.log(delta) + np.log(a)) / (a - 1.0)
    eps = np.where(delta * delta + np.expm1(-curve) > 0.0, 0.0, eps)
    return max(0.0, float(eps.min()))


def test_a_plugin_event_is_charged_stored_and_read_back_without_an_edit(
    plugin: Path, db_url: str
) -> None:
    del plugin
    job = parse_job({**DOCUMENT, "privacy": {"target_epsilon": 4.0, "noise": "gaussian"}})
    toy_event = sys.modules["dpfl_toy_events"].ToyGaussianEvent
    result = run_job(job, num_agents=8)  # claims cross the wire in the ledger's JSON form
    delta = job.privacy.delta

    # each agent recorded the plugin's bare event (no client sampling): its closed form
    for agent, events in result.agent_ledgers.items():
        assert events
        assert all(type(e) is toy_event for e in events)
        multipliers = [e.std / e.l2 for e in events]
        composed = ComposedEvent(tuple(events))
        expected = sum(np.asarray(ORDERS) / (2.0 * z * z) for z in multipliers)
        assert rdp_curve(composed) == pytest.approx(expected, rel=1e-12)
        rdp_eps, _ = epsilon_from_rdp(rdp_curve(composed), delta=delta)
        assert rdp_eps == pytest.approx(_closed_form_epsilon(multipliers, delta), rel=1e-12)
        report = compute_epsilon(composed, delta=delta)
        assert report.method == "analytic_gaussian"  # its own tight path: one Gaussian
        assert report.epsilon <= rdp_eps
        assert result.agent_epsilon(agent) == report.epsilon
        assert noise_multiplier(composed) == min(multipliers)  # what the agent's policy reads

    # the coordinator's charges: the plugin event inside dpfl's client-sampling wrapper
    q = job.params.sampling_rate  # type: ignore[attr-defined]
    (client, charges), *_ = sorted(result.ledger.items())
    assert charges
    for charge in charges:
        assert isinstance(charge.event, PoissonSampledEvent)
        assert charge.event.sampling_rate == q
        assert type(charge.event.event) is toy_event
        assert event_to_json(charge.event)["event"]["kind"] == "toy_gaussian"

    # the SQL ledger stores, replays and sums it like any built-in event
    with open_store(db_url) as store:
        ids = {c: store.create_agent(name=c, budget=Budget(100.0, delta)).id for c in result.ledger}
        job_id = store.create_job(job, members=list(ids.values())).id
        store.set_job_status(job_id, JobStatus.RUNNING)
        for number in range(max(len(cs) for cs in result.ledger.values())):
            rnd = store.start_round(job_id, number + 1, invited=list(ids.values()))
            paid = [(ids[c], cs[number]) for c, cs in result.ledger.items() if number < len(cs)]
            store.commit_round(
                rnd.id, [Charge(a, c.event, c.unit, approximate=True) for a, c in paid]
            )
        entries = store.ledger_entries(agent_id=ids[client])
        stored = [event_from_json(e.event) for e in entries]
        assert stored == [c.event for c in charges]
        # dpfl's own subsampled Gaussian of the same noise: a computation that never sees the
        # plugin's class
        twins = [PoissonSampledEvent(q, GaussianEvent(e.event.std, e.event.l2)) for e in stored]  # type: ignore[attr-defined]
        for entry, twin in zip(entries, twins, strict=True):
            assert np.array(entry.curve) == pytest.approx(rdp_curve(twin), rel=1e-12)
        expected_eps, _ = epsilon_from_rdp(sum(rdp_curve(t) for t in twins), delta=delta)
        budget = store.client_budget(ids[client], delta=delta)
        assert budget.rdp_epsilon == pytest.approx(expected_eps, rel=1e-12)
        # the client's figure: the twins composed on the tight path (the plugin provides one)
        tight = compute_epsilon(ComposedEvent(tuple(twins)), delta=delta)
        assert budget.method == tight.method
        assert budget.epsilon == pytest.approx(tight.epsilon, rel=1e-6)
        assert store.verify_ledger().ok
