"""The default DP-FedAvg job calibrated at target ε = 4 charges its clients at most 4, and a
client with a budget of 4 finishes it: calibration and budgets use the same figure (issue 31;
the tight path was reverted once because calibration used it while budgets summed RDP curves,
and the same job charged 4.33-4.67)."""

from __future__ import annotations

import pytest

from dpfl.cli.demo import DEMO_AGENTS, demo_job
from dpfl.learning.algorithms.base import CoordinatorData
from dpfl.learning.algorithms.dp_fedavg import ALGORITHM
from dpfl.learning.data import load_dataset
from dpfl.server.errors import BudgetExceeded
from dpfl.server.ledger_charges import store_charge
from dpfl.server.store import Budget, JobStatus
from dpfl.server.store.sql import SqlStore

pytestmark = pytest.mark.slow


def test_the_demo_job_at_target_4_charges_at_most_4_and_a_budget_of_4_finishes_it() -> None:
    spec = demo_job()
    ds = load_dataset("digits")
    data = CoordinatorData(
        input_shape=ds.input_shape, num_classes=ds.num_classes, test_x=ds.x_test, test_y=ds.y_test
    )
    plan = ALGORITHM.plan(spec, population=DEMO_AGENTS, data=data)
    assert plan.calibration["epsilon"] <= 4.0
    store = SqlStore("sqlite://")
    try:
        ids = [store.create_agent(name=f"a{i}", budget=Budget(4.0, 1e-5)).id for i in range(3)]
        job = store.create_job(spec, members=ids)
        store.set_job_status(job.id, JobStatus.RUNNING)
        for number in range(1, spec.rounds + 1):
            charges = (
                ALGORITHM.bind(spec, plan)
                .round_charge(round_number=number, population=ids)
                .charges(ids[:1])
            )
            rnd = store.start_round(job.id, number, invited=ids[:1])
            store.commit_round(
                rnd.id, [store_charge(a, charges[a], own_noise_fraction=1.0) for a in ids]
            )
            store.complete_round(rnd.id)
        for a in ids:
            report = store.client_budget(a)
            assert report.method == "pld"
            assert report.epsilon <= 4.0
            assert report.epsilon == pytest.approx(plan.calibration["epsilon"], rel=1e-9)
        # one more round of the same noise is over every budget
        extra = store.create_job(spec, members=ids)
        store.set_job_status(extra.id, JobStatus.RUNNING)
        charges = (
            ALGORITHM.bind(spec, plan).round_charge(round_number=1, population=ids).charges([])
        )
        rnd = store.start_round(extra.id, 1)
        with pytest.raises(BudgetExceeded):
            store.commit_round(
                rnd.id, [store_charge(a, charges[a], own_noise_fraction=1.0) for a in ids]
            )
    finally:
        store.close()
