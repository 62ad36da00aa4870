"""Rounds without secure aggregation (``secagg.enabled: false``), docs/architecture.md,
"Without secure aggregation".

- real agents (``dpfl.client``) against a scripted coordinator that sends exactly what
  ``server/orchestrator/round.py`` sends in a plain round (setup with ``degree = threshold = 0``,
  ``min_survivors = 1``, a masked-input request without shares): the acknowledgement, the local
  charge before the vector, the FULL noise in each agent's vector, the refusals of a downgraded
  or malformed setup and of messages a plain round does not have;
- real agents against the real coordinator (``dpfl simulate``'s :class:`Simulation`, loopback
  gRPC): the coordinator's ledger says ``secure_aggregation=False`` with the local-DP event and
  every agent's local ledger holds the same events;
- the protocol-level agent (``support.wire_agent``) sending malformed and repeated plain vectors,
  which the real agent never does: the coordinator refuses them and charges nobody for them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from support.agent_kit import DIGITS, JOB, ExactSum, Setup, fedavg_job, federation, publish
from support.coordination import deadlines, small_job
from support.scripted_coordinator import ScriptedCoordinator
from support.stored_rounds import secagg_of
from support.wire_agent import run_wire_job, wire_agents

from dpfl.accounting import (
    PoissonSampledEvent,
    SkellamEvent,
    event_from_json,
    event_to_json,
)
from dpfl.client.local_ledger import LocalLedger
from dpfl.client.policy import Policy
from dpfl.client.progress import EventKind
from dpfl.learning.algorithms.base import AgentData
from dpfl.learning.algorithms.dp_fedavg import DpFedAvg, DpFedAvgTask, FedAvgAgent
from dpfl.learning.algorithms.registry import get_algorithm
from dpfl.learning.jobs import JobSpec, job_to_dict, parse_job
from dpfl.mechanisms import EncodingConfig, decode
from dpfl.mechanisms.noise import NoiseKind, NoiseSpec
from dpfl.protos import secagg_wire
from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.secagg import RoundParameters
from dpfl.secagg import server as server_sm
from dpfl.secagg.primitives import compute_session_id
from dpfl.server.coordinator import Coordinator
from dpfl.server.settings import Settings, StageDeadlines
from dpfl.simulation import Simulation


def plain_job(*, secure: bool = False) -> JobSpec:
    """``agent_kit``'s small DP-FedAvg job, with secure aggregation on or off."""
    doc = job_to_dict(fedavg_job())
    return parse_job({**doc, "secagg": {**doc["secagg"], "enabled": secure}})


def make_setup(job: JobSpec, *, population: int, algorithm: Any = None) -> Setup:
    alg = algorithm if algorithm is not None else get_algorithm("dp-fedavg")
    plan = alg.plan(job, population=population, data=DIGITS)
    state = alg.bind(job, plan).initial_state(DIGITS)
    return Setup(alg, job, plan, state, alg.bind(job, plan).round_task(state, round_number=1))


class KnownVectorAgent(FedAvgAgent[DpFedAvgTask]):
    """DP-FedAvg's agent side contributing ``ExactSum.vector_for``."""

    def compute(self, data: AgentData, **_: Any) -> npt.NDArray[np.float64]:
        dimension, bits = self.task.dimension, self.task.scale_bits
        return ExactSum.vector_for(data, dimension=dimension, scale_bits=bits)


class KnownVector(DpFedAvg):
    """DP-FedAvg whose agents contribute a known vector (``ExactSum.vector_for``), so that the
    noise in one agent's encoded vector can be measured; encoding and checks stay DP-FedAvg's."""

    agent_type = KnownVectorAgent


def header(round_number: int, stage: int, session: bytes = b"") -> pb.RoundHeader:
    return pb.RoundHeader(job_id=JOB, round=round_number, stage=stage, session_id=session)


def plain_setup(
    round_number: int,
    index: int,
    n: int,
    encoding: EncodingConfig,
    m: int,
    *,
    nonce: bytes,
    **overrides: Any,
) -> pb.CoordinatorMessage:
    """The plain-round setup exactly as ``server/orchestrator/wire_sum.py`` builds it."""
    session = compute_session_id(job_id=JOB, round=round_number, nonce=nonce)
    setup = pb.SecAggSetup(
        client_index=index,
        num_clients=n,
        degree=0,
        threshold=0,
        ring_bits=encoding.ring_bits,
        vector_length=m,
        min_survivors=1,
        encoding_json=encoding.to_json(),
        session_nonce=nonce,
    )
    for key, value in overrides.items():
        setattr(setup, key, value)
    return pb.CoordinatorMessage(
        advertise_keys=pb.AdvertiseKeysRequest(
            header=header(round_number, pb.STAGE_ADVERTISE_KEYS, session), setup=setup
        )
    )


async def invite(
    coordinator: ScriptedCoordinator, setup: Setup, agents: Sequence[str], round_number: int
) -> None:
    task = setup.algorithm.bind(setup.job, setup.plan).round_task(setup.state, round_number=1)
    events = setup.algorithm.bind(setup.job, setup.plan).invitation_events(
        round_number=round_number, population=list(agents)
    )
    for agent_id in agents:
        coordinator.send(
            agent_id,
            coordinator.invitation(
                job_id=JOB,
                round=round_number,
                algorithm="dp-fedavg",
                job_name=setup.job.name,
                params=task.params.to_json(),
                events=events,
                model_version=task.model_version or 0,
            ),
        )
    for agent_id in agents:
        reply = await coordinator.next_message(agent_id)
        assert reply.invitation_response.accept, reply


async def expect_error(coordinator: ScriptedCoordinator, agent_id: str, code: int) -> pb.Error:
    reply = await coordinator.next_message(agent_id)
    assert reply.WhichOneof("body") == "error", reply
    assert reply.error.code == code, (pb.ErrorCode.Name(reply.error.code), reply.error.message)
    return reply.error


def plain_encoding(setup: Setup, n: int) -> EncodingConfig:
    return setup.algorithm.bind(setup.job, setup.plan).encoding(
        setup.task, participants=n, min_survivors=1
    )


# -- real agents, scripted coordinator ---------------------------------------------------------


def test_a_plain_round_acknowledges_charges_first_and_sends_the_fully_noised_vector(
    tmp_path: Path,
) -> None:
    known = KnownVector()
    setup = make_setup(plain_job(), population=3, algorithm=known)
    n, m = 3, setup.task.vector_length
    encoding = plain_encoding(setup, n)
    mu = float(setup.plan.details.noise_total)
    assert encoding.noise.kind is NoiseKind.SKELLAM
    assert encoding.noise.parameter >= mu  # the whole noise per agent, not a share

    async def main() -> None:
        async with federation(tmp_path, "inproc", n, algorithms={"dp-fedavg": known}) as (
            coordinator,
            agents,
        ):
            publish(coordinator, setup)
            ids = [a.agent_id for a in agents]
            await invite(coordinator, setup, ids, 1)
            nonce = os.urandom(32)
            session = compute_session_id(job_id=JOB, round=1, nonce=nonce)
            for i, agent_id in enumerate(ids):
                coordinator.send(agent_id, plain_setup(1, i, n, encoding, m, nonce=nonce))
            for agent_id in ids:
                ack = await coordinator.next_message(agent_id)
                assert ack.WhichOneof("body") == "advertise_keys", ack
                keys = ack.advertise_keys
                assert keys.header == header(1, pb.STAGE_ADVERTISE_KEYS, session)
                assert (keys.encryption_public_key, keys.masking_public_key) == (b"", b"")
            request = pb.CoordinatorMessage(
                masked_input=pb.MaskedInputRequest(header=header(1, pb.STAGE_MASKED_INPUT, session))
            )
            vectors = {}
            for agent in agents:
                coordinator.send(agent.agent_id, request)
                assembler = secagg_wire.MaskedInputAssembler(
                    vector_length=m, ring_bits=encoding.ring_bits
                )
                done = None
                while done is None:
                    piece = await coordinator.next_message(agent.agent_id, timeout=30)
                    assert piece.WhichOneof("body") == "masked_input", piece
                    # ledger first: the charge is on disk when the first piece arrives
                    assert len(agent.ledger.entries(job_id=JOB)) == 1
                    done = assembler.add(piece.masked_input)
                assert done.header.session_id == session
                vectors[agent.agent_id] = done.masked_input
            for agent_id in ids:
                coordinator.send(
                    agent_id,
                    pb.CoordinatorMessage(
                        result=pb.RoundResult(
                            header=header(1, pb.STAGE_RESULT, session), completed=True
                        )
                    ),
                )
            await asyncio.sleep(0.05)
            claimed = setup.algorithm.bind(setup.job, setup.plan).invitation_events(
                round_number=1, population=ids
            )
            assert isinstance(claimed[0], SkellamEvent)  # no amplification without secagg
            bits = int(setup.plan.details.scale_bits)
            for agent in agents:
                (entry,) = agent.ledger.entries()
                assert [event_to_json(e) for e in entry.events] == [
                    event_to_json(e) for e in claimed
                ]
                assert entry.session_id == session.hex()
                assert len(entry.attempt) == 32
                assert entry.attempt != entry.session_id
                kinds = agent.kinds()
                assert kinds.index("charged") < kinds.index("masked-input-sent")
                sent = [e for e in agent.events if e.kind is EventKind.MASKED_INPUT_SENT]
                assert "unmasked" in sent[0].message
                (setup_event,) = [e for e in agent.events if e.kind is EventKind.SETUP]
                assert setup_event.data["secure_aggregation"] is False
                assert agent.events[-1].kind is EventKind.RESULT
                assert agent.events[-1].data["completed"] is True
                # the unmasked vector is the known vector plus Skellam(μ) noise of variance 2μ
                # per coordinate (a share μ/3 would give a third of it)
                own = ExactSum.vector_for(agent.data, dimension=m, scale_bits=bits)
                noise = (decode(vectors[agent.agent_id], config=encoding) - own) * 2.0**bits
                assert 0.7 < float(np.var(noise)) / (2 * mu) < 1.4

    asyncio.run(asyncio.wait_for(main(), 60))


@pytest.mark.parametrize(
    "secure", [True, False], ids=["plain-setup-for-masked", "masked-for-plain"]
)
def test_a_setup_of_the_other_mode_than_the_invitation_is_refused(
    tmp_path: Path, secure: bool
) -> None:
    """No downgrade: an agent invited with secure aggregation never sends its vector in the
    clear; and a masked setup for a task announced without it does not match what was checked."""
    setup = make_setup(plain_job(secure=secure), population=2)
    n, m = 2, setup.task.vector_length

    async def main() -> None:
        async with federation(tmp_path, "inproc", n) as (coordinator, agents):
            publish(coordinator, setup)
            ids = [a.agent_id for a in agents]
            await invite(coordinator, setup, ids, 1)
            encoding = plain_encoding(setup, n)
            if secure:
                nonce = os.urandom(32)  # one session for all, as the coordinator does
                messages = [plain_setup(1, i, n, encoding, m, nonce=nonce) for i in range(n)]
            else:
                probe = RoundParameters.choose(num_clients=n, vector_length=m, ring_bits=64)
                params = dataclasses.replace(probe, ring_bits=encoding.ring_bits)
                _, outbound = server_sm.start_round(
                    job_id=JOB, round=1, params=params, encoding_json=encoding.to_json()
                )
                messages = [secagg_wire.to_coordinator_message(o.message) for o in outbound]
            for agent_id, message in zip(ids, messages, strict=True):
                coordinator.send(agent_id, message)
            for agent in agents:
                error = await expect_error(coordinator, agent.agent_id, pb.ERROR_POLICY_DECLINED)
                assert "secure aggregation" in error.message
                assert ("never sends its vector in the clear" in error.message) is secure
                # it left the round before any work: nothing trained, charged or sent
                request = pb.CoordinatorMessage(
                    masked_input=pb.MaskedInputRequest(
                        header=header(
                            1, pb.STAGE_MASKED_INPUT, messages[0].advertise_keys.header.session_id
                        )
                    )
                )
                coordinator.send(agent.agent_id, request)
                await expect_error(coordinator, agent.agent_id, pb.ERROR_STALE_ROUND)
                assert agent.ledger.entries() == []
                assert "left-round" in agent.kinds()
                assert "training" not in agent.kinds()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_malformed_plain_setups_and_messages_a_plain_round_lacks(tmp_path: Path) -> None:
    """One agent, a new round per malformed setup: each is refused (INVALID_ARGUMENT, or
    POLICY_DECLINED for a noise share instead of the whole noise) before any work; then a valid
    plain round refuses a repeated setup, share-keys and unmask requests, and a masked-input
    request that carries shares."""
    setup = make_setup(plain_job(), population=2)
    m = setup.task.vector_length
    good = plain_encoding(setup, 2)
    share = dataclasses.replace(
        good, noise=NoiseSpec(NoiseKind.SKELLAM, good.noise.parameter / 2)
    )  # what each of two agents adds WITH secure aggregation
    wide = EncodingConfig.for_summands(
        clip=good.clip, scale_bits=good.scale_bits, summands=2, noise=good.noise
    )
    nonce = os.urandom(32)
    cases: list[tuple[str, pb.CoordinatorMessage, int]] = []

    def case(name: str, code: int, encoding: EncodingConfig = good, **overrides: Any) -> None:
        number = len(cases) + 1
        cases.append((name, plain_setup(number, 0, 2, encoding, m, nonce=nonce, **overrides), code))

    invalid = pb.ERROR_INVALID_ARGUMENT
    case("session nonce of another round", invalid, session_nonce=os.urandom(32))
    case("min_survivors 2", invalid, min_survivors=2)
    case("index outside [0, n)", invalid, client_index=2)
    case("no encoding", invalid, encoding_json="")
    case("encoding ring differs", invalid, ring_bits=wide.ring_bits + 1)
    case("vector length 0", invalid, vector_length=0)
    case("a noise share", pb.ERROR_POLICY_DECLINED, encoding=share)

    async def main() -> None:
        async with federation(tmp_path, "inproc", 1) as (coordinator, (agent,)):
            publish(coordinator, setup)
            for number, (name, message, code) in enumerate(cases, start=1):
                await invite(coordinator, setup, [agent.agent_id], number)
                coordinator.send(agent.agent_id, message)
                error = await expect_error(coordinator, agent.agent_id, code)
                assert error.header.round == number, name
            assert "training" not in agent.kinds()
            number = len(cases) + 1
            await invite(coordinator, setup, [agent.agent_id], number)
            valid = plain_setup(number, 0, 2, good, m, nonce=nonce)
            session = valid.advertise_keys.header.session_id
            coordinator.send(agent.agent_id, valid)
            assert (await coordinator.next_message(agent.agent_id)).HasField("advertise_keys")
            coordinator.send(agent.agent_id, valid)
            await expect_error(coordinator, agent.agent_id, pb.ERROR_DUPLICATE)
            for kind, body in (
                (
                    "share_keys",
                    pb.ShareKeysRequest(header=header(number, pb.STAGE_SHARE_KEYS, session)),
                ),
                ("unmask", pb.UnmaskRequest(header=header(number, pb.STAGE_UNMASK, session))),
            ):
                coordinator.send(agent.agent_id, pb.CoordinatorMessage(**{kind: body}))
                await expect_error(coordinator, agent.agent_id, pb.ERROR_WRONG_STAGE)
            other = pb.MaskedInputRequest(
                header=header(number, pb.STAGE_MASKED_INPUT, b"\x01" * 32)
            )
            coordinator.send(agent.agent_id, pb.CoordinatorMessage(masked_input=other))
            await expect_error(coordinator, agent.agent_id, pb.ERROR_STALE_ROUND)
            with_shares = pb.MaskedInputRequest(
                header=header(number, pb.STAGE_MASKED_INPUT, session),
                shares=[pb.EncryptedShare(sender=1, receiver=0, ciphertext=b"x" * 40)],
            )
            coordinator.send(agent.agent_id, pb.CoordinatorMessage(masked_input=with_shares))
            await expect_error(coordinator, agent.agent_id, pb.ERROR_PROTOCOL_ABORT)
            assert agent.ledger.entries() == []  # it left before any charge
            assert agent.events[-1].kind is EventKind.LEFT_ROUND

    asyncio.run(asyncio.wait_for(main(), 60))


# -- real agents, real coordinator (dpfl simulate) ---------------------------------------------


def test_simulate_without_secure_aggregation_charges_local_dp_in_both_ledgers(
    tmp_path: Path,
) -> None:
    job = small_job(rounds=2, secagg={"enabled": False})

    async def main() -> None:
        sim = Simulation(job, agents=4, transport="grpc", workdir=tmp_path, deadlines=deadlines())
        try:
            result = await sim.run()
            assert result.status == "completed", result.error
            assert result.rounds_completed == 2
            store = sim.coordinator.store
            rounds = store.list_rounds(sim.job_id)
            entries = store.ledger_entries(job_id=sim.job_id)
            assert len(entries) == 2 * 4
            for rnd in rounds:
                assert secagg_of(rnd).enabled is False
                assert {"share_keys", "unmask"}.isdisjoint(rnd.survivors)
            for entry in entries:
                assert entry.secure_aggregation is False
                event = event_from_json(entry.event)
                assert isinstance(event, SkellamEvent)
                assert not isinstance(event, PoissonSampledEvent)
            delta = job.privacy.delta
            for agent in sim.agents:
                assert agent.loop.executor is sim.host.executor
                mine = sorted(
                    (e for e in entries if e.agent_id == agent.agent_id),
                    key=lambda e: e.round_number,
                )
                local = agent.ledger.entries(job_id=sim.job_id)
                assert [e.round for e in local] == [1, 2]
                assert [[event_to_json(x) for x in e.events] for e in local] == [
                    [e.event] for e in mine
                ]
                # both ledgers compose the same events into the same figure
                own = store.job_epsilon_reports(sim.job_id)[agent.agent_id]
                assert agent.ledger.epsilon(delta=delta) == pytest.approx(own.epsilon, rel=1e-9)
                assert store.client_budget(agent.agent_id, delta=delta).epsilon == pytest.approx(
                    own.epsilon, rel=1e-9
                )
                assert result.epsilon[agent.agent_id] <= own.rdp_epsilon * (1 + 1e-12)
                setups = [e for e in agent.events if e.kind is EventKind.SETUP]
                assert [e.data["secure_aggregation"] for e in setups] == [False, False]
        finally:
            await sim.close()

    asyncio.run(main())


# -- the protocol-level agent: what the real agent never sends ----------------------------------


def test_the_coordinator_refuses_malformed_and_repeated_plain_vectors(tmp_path: Path) -> None:
    """Agent 0's vector is truncated: refused, never summed (the stage waits for it until its
    deadline), but charged: every agent is charged before any vector is requested. Agent 1 sends
    its vector twice: the repeat is refused, it is summed and charged once. Agents 2 and 3 are
    summed; nobody is asked for keys or shares."""
    job = small_job(rounds=1, secagg={"enabled": False})

    def truncate(message: pb.AgentMessage) -> list[pb.AgentMessage]:
        if message.WhichOneof("body") == "masked_input":
            message.masked_input.masked_input.data = message.masked_input.masked_input.data[:-1]
        return [message]

    def repeat(message: pb.AgentMessage) -> list[pb.AgentMessage]:
        return [message, message] if message.WhichOneof("body") == "masked_input" else [message]

    async def main() -> None:
        fast = {**deadlines().model_dump(), "masked_input": 2.0, "training": 1.0}
        settings = Settings(
            database_url=f"sqlite:///{tmp_path / 'c.db'}",
            grpc_port=0,
            admin_token=secrets.token_urlsafe(32),
            stage_deadlines=StageDeadlines(**fast),
        )
        c = Coordinator(settings=settings, serve_api=False, max_attempts=1)
        await c.start()
        try:
            agents = await wire_agents(c, 4, name="plain")
            agents[0].rewrite = truncate
            agents[1].rewrite = repeat
            job_id, final = await run_wire_job(c, job, agents)
            assert final.status.value == "completed", final.error
            (rnd,) = c.store.list_rounds(job_id)
            assert secagg_of(rnd).enabled is False
            summed = sorted(a.agent_id for a in agents[1:])
            assert sorted(rnd.survivors["masked_input"]) == summed
            entries = c.store.ledger_entries(job_id=job_id)
            assert sorted(e.agent_id for e in entries) == sorted(a.agent_id for a in agents)
            assert all(e.secure_aggregation is False for e in entries)
            assert rnd.model_version == 1
            for agent in agents:
                assert "share_keys" not in agent.received
                assert "unmask" not in agent.received
            assert [pb.ErrorCode.Name(e.code) for e in agents[0].errors] == [
                "ERROR_INVALID_ARGUMENT"
            ]
            assert [pb.ErrorCode.Name(e.code) for e in agents[1].errors] == [
                "ERROR_INVALID_ARGUMENT"
            ]
            assert "already received" in agents[1].errors[0].message
            assert agents[2].errors == []
            assert agents[3].errors == []
            assert all(a.results[-1].completed for a in agents[1:])
        finally:
            await c.close()

    asyncio.run(main())


def test_the_coordinator_refuses_keyed_and_repeated_plain_acknowledgements(tmp_path: Path) -> None:
    """A plain setup is acknowledged without keys: agent 0 sends keys (another protocol) and is
    left out of the round; agent 1 acknowledges twice and counts once; agents 2, 3 are summed."""
    job = small_job(rounds=1, secagg={"enabled": False})

    def with_keys(message: pb.AgentMessage) -> list[pb.AgentMessage]:
        if message.WhichOneof("body") == "advertise_keys":
            message.advertise_keys.encryption_public_key = bytes(32)
        return [message]

    def twice(message: pb.AgentMessage) -> list[pb.AgentMessage]:
        return [message, message] if message.WhichOneof("body") == "advertise_keys" else [message]

    async def main() -> None:
        fast = {**deadlines().model_dump(), "advertise_keys": 2.0}
        settings = Settings(
            database_url=f"sqlite:///{tmp_path / 'c.db'}",
            grpc_port=0,
            admin_token=secrets.token_urlsafe(32),
            stage_deadlines=StageDeadlines(**fast),
        )
        c = Coordinator(settings=settings, serve_api=False, max_attempts=1)
        await c.start()
        try:
            agents = await wire_agents(c, 4, name="ack")
            agents[0].rewrite = with_keys
            agents[1].rewrite = twice
            job_id, final = await run_wire_job(c, job, agents)
            assert final.status.value == "completed", final.error
            (rnd,) = c.store.list_rounds(job_id)
            summed = sorted(a.agent_id for a in agents[1:])
            assert sorted(rnd.survivors["advertise_keys"]) == summed
            assert sorted(rnd.survivors["masked_input"]) == summed
            assert sorted(e.agent_id for e in c.store.ledger_entries(job_id=job_id)) == summed
            assert "carries no keys" in agents[0].errors[0].message
            assert [e.message for e in agents[1].errors] == ["already acknowledged"]
        finally:
            await c.close()

    asyncio.run(main())


def test_a_repeated_session_nonce_charges_every_vector_the_agent_sends(tmp_path: Path) -> None:
    """A coordinator that runs round 1 three times with ONE nonce (so one session id), each time
    after a new invitation to the same round (another deadline): every fresh noisy vector the
    agent sends is a row of its own in its local ledger, keyed by the agent's own attempt id,
    with the session id and the digest of what was sent. Over real gRPC."""
    setup = make_setup(plain_job(), population=1)
    m = setup.task.vector_length
    encoding = plain_encoding(setup, 1)
    policy = Policy(max_epsilon_per_job=1000.0, max_epsilon_total=1000.0)

    async def main() -> None:
        async with federation(tmp_path, "grpc", 1, policy=policy) as (coordinator, (agent,)):
            publish(coordinator, setup)
            nonce = os.urandom(32)
            session = compute_session_id(job_id=JOB, round=1, nonce=nonce)
            request = pb.CoordinatorMessage(
                masked_input=pb.MaskedInputRequest(header=header(1, pb.STAGE_MASKED_INPUT, session))
            )
            sent: list[bytes] = []
            for _ in range(3):
                await invite(coordinator, setup, [agent.agent_id], 1)
                coordinator.send(agent.agent_id, plain_setup(1, 0, 1, encoding, m, nonce=nonce))
                ack = await coordinator.next_message(agent.agent_id)
                assert ack.WhichOneof("body") == "advertise_keys", ack
                coordinator.send(agent.agent_id, request)
                assembler = secagg_wire.MaskedInputAssembler(
                    vector_length=m, ring_bits=encoding.ring_bits
                )
                done = None
                while done is None:
                    piece = await coordinator.next_message(agent.agent_id, timeout=30)
                    assert piece.WhichOneof("body") == "masked_input", piece
                    done = assembler.add(piece.masked_input)
                assert done.header.session_id == session
                sent.append(np.asarray(done.masked_input).tobytes())
            entries = agent.ledger.entries(job_id=JOB)
            assert len(entries) == len(sent) == 3  # every release is recorded
            assert len(set(sent)) == 3  # three fresh noisy releases of the agent's data
            assert len({e.attempt for e in entries}) == 3
            assert all(len(e.attempt) == 32 for e in entries)  # the agent's ids, not the nonce's
            assert {e.session_id for e in entries} == {session.hex()}
            assert len({e.sent_sha256 for e in entries}) == 3
            claimed = setup.algorithm.bind(setup.job, setup.plan).invitation_events(
                round_number=1, population=[agent.agent_id]
            )
            one = LocalLedger(tmp_path / "one.sqlite")
            one.record(job_id=JOB, round=1, events=claimed, algorithm=setup.algorithm.name)
            delta = policy.delta
            assert agent.ledger.epsilon(delta=delta) > one.epsilon(delta=delta)
            one.close()

    asyncio.run(asyncio.wait_for(main(), 90))
