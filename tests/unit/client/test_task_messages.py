"""The task loop's answers to stale, duplicate, out-of-order and malformed coordinator messages.

One real agent (task loop, policy, SQLite ledger) on an in-process link to a scripted
coordinator that sends raw messages and reads the agent's raw answers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from support.agent_kit import AgentHandle, Setup, fedavg_round, start_agent
from support.scripted_coordinator import ScriptedCoordinator

from dpfl.client.progress import EventKind
from dpfl.client.transport import InProcessConnector
from dpfl.protos import secagg_wire
from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.secagg import RoundParameters
from dpfl.secagg import server as server_sm

JOB = "job-m"
AGENT = "agent-0"


@asynccontextmanager
async def one_agent(tmp_path: Path) -> AsyncIterator[tuple[ScriptedCoordinator, AgentHandle]]:
    coordinator = ScriptedCoordinator()
    credential = coordinator.add_agent(AGENT)
    connector = InProcessConnector(
        connect_handler=coordinator.connect_handler,
        download_handler=coordinator.download_handler,
        agent_id=AGENT,
        credential=credential,
    )
    handle = start_agent(
        agent_id=AGENT, connector=connector, state_dir=tmp_path / AGENT, index=0, agents=2
    )
    try:
        await coordinator.wait_connected([AGENT])
        yield coordinator, handle
    finally:
        await handle.close()


def run(body: Callable[[ScriptedCoordinator, AgentHandle], Awaitable[None]], tmp: Path) -> None:
    async def main() -> None:
        async with one_agent(tmp) as (coordinator, handle):
            await body(coordinator, handle)

    asyncio.run(asyncio.wait_for(main(), 60))


@pytest.fixture(scope="module")
def setup() -> Setup:
    return fedavg_round(population=2)


def invitation(coordinator: ScriptedCoordinator, setup: Setup, round_number: int) -> pb.Invitation:
    task = setup.algorithm.bind(setup.job, setup.plan).round_task(
        setup.state, round_number=round_number
    )
    events = setup.algorithm.bind(setup.job, setup.plan).invitation_events(
        round_number=round_number, population=[AGENT, "other"]
    )
    return coordinator.invitation(
        job_id=JOB,
        round=round_number,
        algorithm="dp-fedavg",
        job_name=setup.job.name,
        params=task.params.to_json(),
        events=events,
    ).invitation


def _task_json(coordinator: ScriptedCoordinator, setup: Setup, **changes: object) -> str:
    """A round-1 task's ``params_json`` with ``changes``."""
    params = json.loads(invitation(coordinator, setup, 1).params_json)
    return json.dumps({**params, **changes})


def setup_request(setup: Setup, round_number: int) -> pb.CoordinatorMessage:
    """A valid AdvertiseKeysRequest (index 0 of 2) from the real secagg server."""
    probe = RoundParameters.choose(
        num_clients=2, vector_length=setup.task.vector_length, ring_bits=64
    )
    encoding = setup.algorithm.bind(setup.job, setup.plan).encoding(
        setup.task, participants=2, min_survivors=probe.min_survivors
    )
    params = dataclasses.replace(probe, ring_bits=encoding.ring_bits)
    _, outbound = server_sm.start_round(
        job_id=JOB, round=round_number, params=params, encoding_json=encoding.to_json()
    )
    return secagg_wire.to_coordinator_message(outbound[0].message)


async def answer(
    coordinator: ScriptedCoordinator, message: pb.CoordinatorMessage
) -> pb.AgentMessage:
    coordinator.send(AGENT, message)
    return await coordinator.next_message(AGENT, timeout=10, skip_pongs=False)


async def expect_error(
    coordinator: ScriptedCoordinator, message: pb.CoordinatorMessage, code: int
) -> pb.Error:
    reply = await answer(coordinator, message)
    assert reply.WhichOneof("body") == "error", reply
    assert reply.error.code == code, (pb.ErrorCode.Name(reply.error.code), reply.error.message)
    return reply.error


def test_ping_empty_and_unknown_job(tmp_path: Path) -> None:
    async def body(coordinator: ScriptedCoordinator, handle: AgentHandle) -> None:
        pong = await answer(coordinator, pb.CoordinatorMessage(ping=pb.Ping(sent_unix=12.5)))
        assert pong.WhichOneof("body") == "pong"
        assert pong.pong.sent_unix == 12.5
        await expect_error(coordinator, pb.CoordinatorMessage(), pb.ERROR_INVALID_ARGUMENT)
        share = pb.CoordinatorMessage(
            share_keys=pb.ShareKeysRequest(
                header=pb.RoundHeader(job_id="nope", round=1, stage=pb.STAGE_SHARE_KEYS)
            )
        )
        error = await expect_error(coordinator, share, pb.ERROR_UNKNOWN_JOB)
        assert error.header.job_id == "nope"
        headless = pb.CoordinatorMessage(invitation=pb.Invitation(algorithm="dp-fedavg"))
        await expect_error(coordinator, headless, pb.ERROR_INVALID_ARGUMENT)

    run(body, tmp_path)


def test_invitation_duplicates_stale_rounds_and_wrong_stages(tmp_path: Path, setup: Setup) -> None:
    async def body(coordinator: ScriptedCoordinator, handle: AgentHandle) -> None:
        assert setup.state.model is not None
        coordinator.blobs[(JOB, pb.BLOB_MODEL, 0)] = setup.state.model
        first = pb.CoordinatorMessage(invitation=invitation(coordinator, setup, 2))
        reply = await answer(coordinator, first)
        assert reply.invitation_response.accept, reply.invitation_response.reason
        assert reply.invitation_response.header.round == 2
        await expect_error(coordinator, first, pb.ERROR_DUPLICATE)
        older = pb.CoordinatorMessage(invitation=invitation(coordinator, setup, 1))
        await expect_error(coordinator, older, pb.ERROR_STALE_ROUND)
        wrong = pb.CoordinatorMessage()
        wrong.invitation.CopyFrom(invitation(coordinator, setup, 2))
        wrong.invitation.header.stage = pb.STAGE_UNMASK
        await expect_error(coordinator, wrong, pb.ERROR_WRONG_STAGE)
        early = pb.CoordinatorMessage(
            share_keys=pb.ShareKeysRequest(
                header=pb.RoundHeader(job_id=JOB, round=2, stage=pb.STAGE_SHARE_KEYS)
            )
        )
        await expect_error(coordinator, early, pb.ERROR_WRONG_STAGE)
        future = pb.CoordinatorMessage(
            masked_input=pb.MaskedInputRequest(
                header=pb.RoundHeader(job_id=JOB, round=3, stage=pb.STAGE_MASKED_INPUT)
            )
        )
        await expect_error(coordinator, future, pb.ERROR_WRONG_STAGE)
        no_setup = pb.CoordinatorMessage(
            advertise_keys=pb.AdvertiseKeysRequest(
                header=pb.RoundHeader(job_id=JOB, round=2, stage=pb.STAGE_ADVERTISE_KEYS)
            )
        )
        await expect_error(coordinator, no_setup, pb.ERROR_INVALID_ARGUMENT)
        # the round is still on: a valid setup is answered with keys, a repeat is a duplicate
        request = setup_request(setup, 2)
        keys = await answer(coordinator, request)
        assert keys.WhichOneof("body") == "advertise_keys"
        assert len(keys.advertise_keys.encryption_public_key) == 32
        await expect_error(coordinator, request, pb.ERROR_DUPLICATE)
        other_session = setup_request(setup, 2)
        await expect_error(coordinator, other_session, pb.ERROR_STALE_ROUND)
        assert handle.ledger.entries() == []

    run(body, tmp_path)


def test_a_malformed_setup_makes_the_agent_leave_the_round(tmp_path: Path, setup: Setup) -> None:
    async def body(coordinator: ScriptedCoordinator, handle: AgentHandle) -> None:
        assert setup.state.model is not None
        coordinator.blobs[(JOB, pb.BLOB_MODEL, 0)] = setup.state.model
        reply = await answer(
            coordinator, pb.CoordinatorMessage(invitation=invitation(coordinator, setup, 1))
        )
        assert reply.invitation_response.accept
        bad = setup_request(setup, 1)
        bad.advertise_keys.setup.degree = 3  # odd degree of an incomplete graph... n=2: k<=1
        error = await expect_error(coordinator, bad, pb.ERROR_INVALID_ARGUMENT)
        assert "setup refused" in error.message
        good = setup_request(setup, 1)
        await expect_error(coordinator, good, pb.ERROR_STALE_ROUND)
        assert EventKind.LEFT_ROUND in [e.kind for e in handle.events]

    run(body, tmp_path)


def test_malformed_invitations_are_declined_with_the_reason(tmp_path: Path, setup: Setup) -> None:
    async def body(coordinator: ScriptedCoordinator, handle: AgentHandle) -> None:
        cases = {
            "params: not valid JSON": {"params_json": "{"},
            "params: must be a JSON object": {"params_json": "[1]"},
            "params.clip: must be > 0": {"params_json": _task_json(coordinator, setup, clip=-1)},
            "params.extra: unknown field": {"params_json": _task_json(coordinator, setup, extra=1)},
            "malformed privacy_events_json": {"privacy_events_json": '[{"kind": "nope"}]'},
            "claims no privacy events": {"privacy_events_json": "[]"},
            "unsupported algorithm": {"algorithm": "dp-magic"},
        }
        for number, (reason, change) in enumerate(cases.items(), start=1):
            message = invitation(coordinator, setup, number)
            for field, value in change.items():
                setattr(message, field, value)
            reply = await answer(coordinator, pb.CoordinatorMessage(invitation=message))
            assert not reply.invitation_response.accept
            assert reason in reply.invitation_response.reason
        declined = [e for e in handle.events if e.kind is EventKind.DECLINED]
        assert len(declined) == len(cases)
        assert handle.ledger.entries() == []
        params = json.loads(invitation(coordinator, setup, 9).params_json)
        assert params["algorithm"] == "dp-fedavg"

    run(body, tmp_path)
