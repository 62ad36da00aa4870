"""The agent's side of a one-client sample (docs/accounting.md, "Client sampling: every sample is
released"): a plain setup for ONE agent of a secure DP-FedAvg task is taken only when the local
policy allows an unmasked round and the agent's own noise carries the whole claimed noise."""

from __future__ import annotations

import os
from typing import Any

import pytest
from support.algorithm_harness import make_job

from dpfl.client.checks import SetupRefused, check_setup
from dpfl.client.gate import InvitationReview
from dpfl.learning.algorithms.base import CoordinatorData
from dpfl.learning.algorithms.dp_fedavg import DpFedAvg
from dpfl.mechanisms import EncodingConfig
from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.secagg import messages as sm
from dpfl.secagg.primitives import compute_session_id

JOB_ID, ROUND = "job-one", 2
ALGORITHM = DpFedAvg()
JOB = make_job(name="one-agent", params={"sampling_rate": 0.3})
PLAN = ALGORITHM.plan(JOB, population=10, data=CoordinatorData(input_shape=(64,), num_classes=10))


def _review() -> InvitationReview:
    task = ALGORITHM.bind(JOB, PLAN).round_task(
        ALGORITHM.bind(JOB, PLAN).initial_state(_data()), round_number=ROUND
    )
    params = ALGORITHM.parse_task({**task.params.to_json(), "job_id": JOB_ID})
    claimed = ALGORITHM.bind(JOB, PLAN).invitation_events(round_number=ROUND, population=["a"] * 10)
    return InvitationReview(
        job_id=JOB_ID,
        job_name=JOB.name,
        round=ROUND,
        algorithm=ALGORITHM.name,
        task=params,
        claimed=tuple(claimed),
        charge=ALGORITHM.agent(params).charge(claimed),
    )


def _data() -> CoordinatorData:
    return CoordinatorData(input_shape=(64,), num_classes=10)


def _request(encoding: EncodingConfig, *, num_clients: int = 1) -> sm.AdvertiseKeysRequest:
    nonce = os.urandom(32)
    session = compute_session_id(job_id=JOB_ID, round=ROUND, nonce=nonce)
    fields: dict[str, Any] = {
        "client_index": 0,
        "num_clients": num_clients,
        "degree": 0,
        "threshold": 0,
        "ring_bits": encoding.ring_bits,
        "vector_length": int(PLAN.details.dimension),
        "min_survivors": 1,
        "encoding_json": encoding.to_json(),
        "session_nonce": nonce,
    }
    return sm.AdvertiseKeysRequest(
        header=sm.RoundHeader(JOB_ID, ROUND, sm.Stage.ADVERTISE_KEYS, session),
        setup=sm.SecAggSetup(**fields),
    )


def _encoding(participants: int, min_survivors: int) -> EncodingConfig:
    task = ALGORITHM.bind(JOB, PLAN).round_task(
        ALGORITHM.bind(JOB, PLAN).initial_state(_data()), round_number=ROUND
    )
    return ALGORITHM.bind(JOB, PLAN).encoding(
        task, participants=participants, min_survivors=min_survivors
    )


def test_the_lone_agent_takes_the_round_when_its_noise_is_the_whole_sum() -> None:
    review = _review()
    alone = _encoding(1, 1)
    assert alone == ALGORITHM.bind(JOB, PLAN).noise_alone_encoding(
        ALGORITHM.bind(JOB, PLAN).round_task(
            ALGORITHM.bind(JOB, PLAN).initial_state(_data()), round_number=ROUND
        )
    )
    assert alone.noise.parameter >= float(PLAN.details.noise_total)
    params, own = check_setup(
        _request(alone), review=review, side=ALGORITHM.agent(review.task), alone_unmasked=True
    )
    assert params.num_clients == 1
    assert own == 1.0  # the agent's own noise carries the whole claim


def test_a_split_share_or_a_policy_that_requires_masking_is_refused() -> None:
    review = _review()
    split = _encoding(10, 10)  # one tenth of the noise: what ten masked agents would add each
    with pytest.raises(SetupRefused, match="below") as exc:
        check_setup(
            _request(split), review=review, side=ALGORITHM.agent(review.task), alone_unmasked=True
        )
    assert exc.value.code == pb.ERROR_POLICY_DECLINED
    with pytest.raises(SetupRefused, match="requires secure aggregation"):
        check_setup(
            _request(_encoding(1, 1)),
            review=review,
            side=ALGORITHM.agent(review.task),
            alone_unmasked=False,
        )


def test_a_plain_setup_for_several_agents_of_a_secure_task_is_still_a_downgrade() -> None:
    with pytest.raises(SetupRefused, match="never sends its vector in the clear"):
        check_setup(
            _request(_encoding(1, 1), num_clients=2),
            review=_review(),
            side=ALGORITHM.agent(_review().task),
            alone_unmasked=True,
        )


def test_an_agent_side_that_states_no_fraction_is_refused() -> None:
    review = _review()
    side = ALGORITHM.agent(review.task)
    alone = _request(_encoding(1, 1))

    class Silent(type(side)):  # type: ignore[misc]
        def check(self, *args: Any, **kwargs: Any) -> Any:
            super().check(*args, **kwargs)
            return None  # an agent side written before the fraction was part of the contract

    with pytest.raises(SetupRefused, match="states no fraction") as exc:
        check_setup(alone, review=review, side=Silent(ALGORITHM, review.task), alone_unmasked=True)
    assert exc.value.code == pb.ERROR_POLICY_DECLINED
