"""The one registry: a plugin distribution's ``dpfl.algorithms`` entry point registers a new
algorithm for the job documents, the agent's policy, the REST schema and ``get_algorithm``,
through the very path the built-in algorithms take; nothing else is edited."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import TypeAdapter
from support.algorithm_harness import run_job

from dpfl.client.policy import Policy
from dpfl.learning.algorithms import registry
from dpfl.learning.algorithms.base import AlgorithmError, get_algorithm
from dpfl.learning.errors import LearningError
from dpfl.learning.jobs import JobSpecError, job_spec_union, parse_job

TOY = "toy-halved-fedavg"
TOY_MODULE = '''
"""A toy algorithm of a plugin distribution: DP-FedAvg whose server step is halved."""

from typing import ClassVar, Literal

from dpfl.learning.algorithms.dp_fedavg import (
    FedAvgFamily, FedAvgJobBase, FedAvgPlanBase, FedAvgTaskBase,
)


class ToyJob(FedAvgJobBase):
    algorithm: Literal["toy-halved-fedavg"]


class ToyPlan(FedAvgPlanBase):
    pass


class ToyTask(FedAvgTaskBase):
    algorithm: Literal["toy-halved-fedavg"]


class Toy(FedAvgFamily[ToyJob, ToyPlan, ToyTask]):
    name: ClassVar[str] = "toy-halved-fedavg"
    spec_type = ToyJob
    plan_type = ToyPlan
    task_type = ToyTask

    def _post_process(self, job, net, update):
        return update / 2.0


ALGORITHM = Toy()
'''
DOCUMENT = {
    "algorithm": TOY,
    "name": "toy",
    "rounds": 2,
    "params": {"sampling_rate": 0.5, "local_steps": 2},
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
    _install(tmp_path, "dpfl_toy_plugin", TOY_MODULE, dist="dpfl_toy_plugin")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.refresh()
    yield tmp_path
    monkeypatch.undo()
    sys.modules.pop("dpfl_toy_plugin", None)
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
    task = algorithm.round_task(job, result.plan, result.state, round_number=1)
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
