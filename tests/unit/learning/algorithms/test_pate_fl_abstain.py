"""PATE-FL teachers that abstain on queries unlike their data (parts/abstain.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from support.algorithm_harness import make_pate_job

from dpfl.learning.algorithms.parts import teachers
from dpfl.learning.algorithms.parts.abstain import Abstention, own_share
from dpfl.learning.algorithms.pate_fl import ALGORITHM as PATE
from dpfl.learning.data.partition import ShardsPartition, federate
from dpfl.learning.data.registry import load_dataset
from dpfl.learning.jobs import JobSpecError


def test_the_share_counts_own_records_among_the_nearest_and_never_the_query_itself() -> None:
    rng = np.random.default_rng(0)
    own = rng.normal(0.0, 0.1, (30, 4))  # around the origin
    pool = np.concatenate([rng.normal(0.0, 0.1, (5, 4)), rng.normal(5.0, 0.1, (40, 4))])
    share = own_share(own, pool, np.array([0, 10]), neighbours=10, dim=4)
    # near the origin: own records (30) outnumber the pool's 4 others there; far: none of its
    # 10 nearest are own
    assert share[0] == pytest.approx(1.0)
    assert share[1] == 0.0
    # the query's own copy in the pool never counts: a pool of the query alone and distant own
    # records gives the own records every place
    lone = own_share(own + 100.0, pool[:1], np.array([0]), neighbours=5, dim=1)
    assert lone[0] == 1.0


def test_abstention_options_are_checked() -> None:
    assert (Abstention().shares(np.zeros((2, 3)), np.zeros((4, 3)), np.array([1, 2])) == 1).all()
    with pytest.raises(ValueError, match="only apply to method public-share"):
        Abstention(share=0.3)
    with pytest.raises(ValueError, match="share"):
        Abstention(method="public-share", share=0.0)
    with pytest.raises(JobSpecError, match=r"teacher_abstain\.neighbours"):
        make_pate_job(params={"queries": 10, "teacher_abstain": {"neighbours": 0}})


def _nearest_votes(
    abstain: Abstention,
    agents: list[tuple[np.ndarray, np.ndarray]],
    pool: np.ndarray,
    asked: np.ndarray,
) -> np.ndarray:
    """The histogram of 1-nearest-neighbour teachers' votes on ``pool[asked]``."""
    hist = np.zeros((len(asked), 10))
    flat = pool.reshape(len(pool), -1)
    for x, y in agents:
        own = x.reshape(len(x), -1)
        d = ((flat[asked][:, None, :] - own[None, :, :]) ** 2).sum(-1)
        label = y[d.argmin(1)]
        voting = abstain.shares(x, pool, asked) >= abstain.share
        hist[np.flatnonzero(voting), label[voting]] += 1.0
    return hist


def test_abstaining_teachers_label_more_queries_right_on_shards_of_few_classes() -> None:
    """Teachers of 2 classes out of 10 outvote a query's holders; the public-share rule lets
    mostly the holders vote, so the plurality is right more often (the effect that
    benchmarks/vote_ceiling.py measures on Fashion-MNIST)."""
    ds = load_dataset("digits")
    fed = federate(ds, scheme=ShardsPartition(classes_per_agent=2), num_agents=30, seed=0)
    agents = [(fed.agent_dataset(i).x_train, fed.agent_dataset(i).y_train) for i in range(30)]
    pool, truth = np.asarray(ds.x_test), np.asarray(ds.y_test)
    asked = np.random.default_rng(0).choice(len(pool), 80, replace=False)
    plain = _nearest_votes(Abstention(), agents, pool, asked)
    rule = Abstention(method="public-share", share=0.1, neighbours=20, dim=20)
    kept = _nearest_votes(rule, agents, pool, asked)
    assert plain.sum() == 80 * 30
    assert kept.sum() < plain.sum()
    right = {
        name: float(np.mean(h.argmax(1) == truth[asked]))
        for name, h in [("plain", plain), ("kept", kept)]
    }
    assert right["kept"] > right["plain"] + 0.3, right  # 91 % against 32.5 %


@pytest.mark.slow
def test_an_abstaining_agent_sends_zero_votes_within_the_sensitivity(digits_public: Any) -> None:
    data, agents = digits_public
    params = {"queries": 40, "sigma": 3.0, "teacher_epochs": 2}
    votes = {}
    for name, abstain in [("plain", {}), ("abstain", {"method": "public-share", "share": 0.2})]:
        job = make_pate_job(params={**params, "teacher_abstain": abstain})
        plan = PATE.plan(job, population=10, data=data)
        task = PATE.bind(job, plan).round_task(
            PATE.bind(job, plan).initial_state(data), round_number=1
        )
        parsed = PATE.parse_task(task.params.to_json())
        assert parsed.teacher.abstain == job.params.teacher_abstain
        teachers.clear_teacher_cache()
        votes[name] = (
            PATE.agent(parsed)
            .compute(agents[0], model=None, public_x=data.public_x, device="cpu")
            .reshape(-1, 10)
        )
    plain, kept = votes["plain"], votes["abstain"]
    assert np.all(plain.sum(axis=1) == 1.0)
    silent = kept.sum(axis=1) == 0.0
    # every row a one-hot vote or nothing (norm within one vote's), the same vote where cast
    assert np.all(silent | (kept.sum(axis=1) == 1.0))
    assert 0 < silent.sum() < len(kept)
    np.testing.assert_array_equal(kept[~silent], plain[~silent])


def test_the_share_matches_its_definition_on_random_records() -> None:
    """Against the direct definition: distances to the own records and to the pool without the
    query, in the pool's principal components, the nearest counted."""
    rng = np.random.default_rng(3)
    own, pool = rng.normal(size=(200, 30)), rng.normal(size=(500, 30)) + 0.3
    asked = rng.choice(500, 40, replace=False)
    mean = pool.mean(0)
    basis = np.linalg.svd(pool - mean, full_matrices=False)[2][:10].T
    projected, mine = (pool - mean) @ basis, (own - mean) @ basis
    expected = []
    for i in asked:
        to_pool = np.delete(((projected - projected[i]) ** 2).sum(1), i)
        d = np.concatenate([((mine - projected[i]) ** 2).sum(1), to_pool])
        expected.append(float((np.argsort(d, kind="stable")[:20] < len(own)).mean()))
    got = own_share(own, pool, asked, neighbours=20, dim=10)
    np.testing.assert_allclose(got, expected)
