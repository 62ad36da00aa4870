"""Jobs and data shared by the algorithm tests (digits: small, embedded, fast)."""

from __future__ import annotations

import pytest

from dpfl.learning.algorithms.base import AgentData, CoordinatorData
from dpfl.learning.data import federate, load_dataset
from dpfl.learning.data.partition import IidPartition, ShardsPartition


@pytest.fixture(scope="session")
def digits_coordinator() -> CoordinatorData:
    ds = load_dataset("digits")
    return CoordinatorData(
        input_shape=ds.input_shape, num_classes=ds.num_classes, test_x=ds.x_test, test_y=ds.y_test
    )


@pytest.fixture(scope="session")
def digits_public_split() -> tuple[CoordinatorData, AgentData]:
    """The coordinator of a job with a public pool (300 digits, unlabeled), a test split (200)
    and one agent's 300 records, all disjoint."""
    ds = load_dataset("digits")
    x, y = ds.x_train, ds.y_train
    coordinator = CoordinatorData(
        input_shape=(1, 8, 8),
        num_classes=10,
        public_x=x[:300],
        test_x=x[300:500],
        test_y=y[300:500],
    )
    agent = AgentData(x=x[500:800], y=y[500:800], input_shape=(1, 8, 8), num_classes=10)
    return coordinator, agent


@pytest.fixture(scope="session")
def digits_agents() -> list[AgentData]:
    ds = load_dataset("digits")
    fed = federate(ds, scheme=ShardsPartition(classes_per_agent=3), num_agents=20, seed=0)
    out = []
    for i in range(fed.num_agents):
        part = fed.agent_dataset(i)
        out.append(AgentData(part.x_train, part.y_train, ds.input_shape, ds.num_classes))
    return out


@pytest.fixture(scope="session")
def digits_public() -> tuple[CoordinatorData, list[AgentData]]:
    ds = load_dataset("digits")
    fed = federate(ds, scheme=IidPartition(), num_agents=10, seed=0, public_fraction=0.3)
    data = CoordinatorData(
        input_shape=ds.input_shape,
        num_classes=ds.num_classes,
        test_x=ds.x_test,
        test_y=ds.y_test,
        public_x=fed.public_features(),
        public_y=fed.public_labels_for_evaluation(),
    )
    agents = []
    for i in range(fed.num_agents):
        part = fed.agent_dataset(i)
        agents.append(AgentData(part.x_train, part.y_train, ds.input_shape, ds.num_classes))
    return data, agents
