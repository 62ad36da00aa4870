"""Secure aggregation disabled: the same stages' transport carries plain vectors, the coordinator
sums them itself, and the ledger says so (docs/architecture.md, "Without secure aggregation").

Driven by the protocol-level test agent (``support.wire_agent``), which implements the plain
round exactly as documented; nothing may pretend the round was masked: every entry is marked
``secure_aggregation=False``, only the participants are charged, with the non-amplified event.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from support.coordination import deadlines, small_job
from support.stored_rounds import secagg_of
from support.wire_agent import WireAgent, enroll, run_wire_job, wire_agents

from dpfl.accounting import (
    GaussianEvent,
    PoissonSampledEvent,
    SkellamEvent,
    event_from_json,
    rdp_curve,
)
from dpfl.learning.algorithms.base import AgentData
from dpfl.learning.data import federate, load_dataset, partition_from_config
from dpfl.protos.dpfl.v1 import agent_pb2 as pb
from dpfl.server.agent_protocol import submit
from dpfl.server.coordinator import Coordinator
from dpfl.server.settings import Settings, StageDeadlines
from dpfl.server.store import Budget, Charge, JobStatus, ProtectedUnit, open_store
from dpfl.server.store.ledger import epsilon_of


def test_plain_round_is_summed_by_the_coordinator_and_charged_as_local_dp(tmp_path: Path) -> None:
    job = small_job(rounds=1, secagg={"enabled": False}, params={"sampling_rate": 0.99})
    dataset = load_dataset("digits")
    fed = federate(dataset, scheme=partition_from_config({"scheme": "iid"}), num_agents=4)

    async def main() -> None:
        settings = Settings(
            database_url=f"sqlite:///{tmp_path / 'c.db'}",
            grpc_port=0,
            admin_token=secrets.token_urlsafe(32),
            stage_deadlines=deadlines(),
        )
        c = Coordinator(settings=settings, serve_api=False, max_attempts=1)
        await c.start()
        agents: list[WireAgent] = []
        try:
            for i in range(4):
                token = c.store.create_enrollment_token(ttl=timedelta(hours=1)).token
                e = await enroll(c.grpc_address, token, f"plain-{i}")
                part = fed.agent_dataset(i)
                data = AgentData(
                    part.x_train, part.y_train, dataset.input_shape, dataset.num_classes
                )
                agents.append(WireAgent(c.grpc_address, e.agent_id, e.credential, data))
            tasks = [asyncio.create_task(a.run()) for a in agents]
            assert await c.registry.wait_connected([a.agent_id for a in agents], timeout=10)
            created = submit(
                c.store, job.model_dump(mode="json"), members=[a.agent_id for a in agents]
            )
            await c.orchestrator.start(created.id)
            final = await asyncio.wait_for(c.orchestrator.wait(created.id), 60)
            (rnd,) = c.store.list_rounds(created.id)
            assert final.status.value == "completed", final.error
            assert secagg_of(rnd).enabled is False
            assert "share_keys" not in rnd.survivors  # no key exchange, no unmasking
            assert "unmask" not in rnd.survivors
            summed = set(rnd.survivors["masked_input"])
            entries = c.store.ledger_entries(job_id=created.id)
            assert {e.agent_id for e in entries} == summed  # participants only
            for e in entries:
                assert e.secure_aggregation is False
                event = event_from_json(e.event)
                assert isinstance(event, SkellamEvent)  # never amplified by sampling
                assert not isinstance(event, PoissonSampledEvent)
            assert rnd.model_version == 1
            async with asyncio.timeout(10):  # the RoundResult is on its way when the job ends
                while not all(a.results for a in agents if a.agent_id in summed):
                    await asyncio.sleep(0.01)
            assert all(a.results[-1].completed for a in agents if a.agent_id in summed)
            for a in agents:
                await a.stop()
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
        finally:
            await c.close()

    asyncio.run(main())


class _Hooks:
    """Calls ``actions[point]`` when the engine reaches that point of round 1."""

    def __init__(self, actions: Mapping[str, Callable[[Mapping[str, Any]], Awaitable[None]]]):
        self.actions = dict(actions)

    async def at(self, point: str, context: Mapping[str, Any]) -> None:
        action = self.actions.get(point)
        if action is not None and context["round"] == 1:
            await action(context)


def _settings(url: str, **stages: float) -> Settings:
    return Settings(
        database_url=url,
        grpc_port=0,
        admin_token=secrets.token_urlsafe(32),
        stage_deadlines=StageDeadlines(**{**deadlines().model_dump(), **stages}),
    )


def _withhold_vector(message: pb.AgentMessage) -> list[pb.AgentMessage]:
    return [] if message.WhichOneof("body") == "masked_input" else [message]


def test_a_crash_after_the_first_plain_vector_arrived_keeps_its_charge(
    coordinator_db: str, tmp_path: Path
) -> None:
    """Agent 0 sends its vector, agent 1 withholds its own; the coordinator has read agent 0's
    vector and is crashed when the masked-input stage closes (before the engine writes anything
    more). The store, reopened, holds a charge for every agent whose vector was read."""
    job = small_job(rounds=1, secagg={"enabled": False})
    state: dict[str, Any] = {}

    async def block(context: Mapping[str, Any]) -> None:
        state["round_id"] = context["round_id"]
        state["reached"].set()
        await asyncio.Event().wait()  # the crash cancels the engine here

    async def main() -> None:
        state["reached"] = asyncio.Event()
        c = Coordinator(
            settings=_settings(coordinator_db, masked_input=2.0, training=1.0),
            serve_api=False,
            max_attempts=1,
            hooks=_Hooks({"masked_input_closed": block}),
        )
        await c.start()
        agents = await wire_agents(c, 2, name="crash")
        agents[1].rewrite = _withhold_vector
        tasks = [asyncio.create_task(a.run()) for a in agents]
        try:
            ids = [a.agent_id for a in agents]
            assert await c.registry.wait_connected(ids, timeout=10)
            created = submit(c.store, job.model_dump(mode="json"), members=ids)
            await c.orchestrator.start(created.id)
            await asyncio.wait_for(state["reached"].wait(), 60)
        finally:
            await c.crash()
            for a in agents:
                await a.stop()
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
        store = open_store(coordinator_db)
        try:
            rnd = store.get_round(state["round_id"])
            read = set(rnd.survivors["masked_input"])
            assert read == {agents[0].agent_id}  # its vector reached the coordinator
            charged = {e.agent_id for e in store.ledger_entries(job_id=created.id)}
            assert read <= charged  # ... and is charged, though the round never finished
            assert charged == set(ids)  # both were asked, so both are charged
            assert store.verify_ledger().ok
        finally:
            store.close()

    asyncio.run(main())


def test_a_refused_plain_commit_requests_no_vector(coordinator_db: str, tmp_path: Path) -> None:
    """Between the setup and the vectors, a concurrent job spends agent 0's budget: the round's
    ledger commit is refused, and no agent is ever asked for its vector (nothing uncharged is
    read); the round aborts with the reason and charges nobody."""
    job = small_job(rounds=1, secagg={"enabled": False})
    # a concurrent job's charge X, and a budget that X fits but X plus this round does not
    spend = GaussianEvent(sigma=0.4, sensitivity=1.0)
    budget = Budget(epsilon_of(rdp_curve(spend), 1e-5)[0] * 1.001, 1e-5)

    async def main() -> None:
        state: dict[str, Any] = {}

        async def concurrent_job_spends(context: Mapping[str, Any]) -> None:
            store = state["store"]
            other = state["other"]

            def commit() -> None:
                store.set_job_status(other, JobStatus.RUNNING)
                rnd = store.start_round(other, 1, invited=[state["poor"]])
                store.update_round(rnd.id, accepted=[state["poor"]])
                store.commit_round(
                    rnd.id,
                    [Charge(state["poor"], spend, ProtectedUnit.AGENT, secure_aggregation=False)],
                )

            await asyncio.to_thread(commit)

        c = Coordinator(
            settings=_settings(coordinator_db),
            serve_api=False,
            max_attempts=1,
            hooks=_Hooks({"advertise_keys_closed": concurrent_job_spends}),
        )
        await c.start()
        try:
            agents = await wire_agents(c, 2, name="budget")
            ids = [a.agent_id for a in agents]
            c.store.set_agent_budget(ids[0], budget)
            other = job.model_dump(mode="json") | {"name": "concurrent"}
            state.update(
                store=c.store, poor=ids[0], other=submit(c.store, other, members=ids[:1]).id
            )
            job_id, _ = await run_wire_job(c, job, agents)
            (rnd,) = c.store.list_rounds(job_id)
            assert rnd.status.value == "aborted"
            assert "ledger commit refused" in (rnd.abort_reason or "")
            assert "masked_input" not in rnd.survivors
            for agent in agents:
                assert "masked_input" not in agent.received  # no vector was ever requested
            assert c.store.ledger_entries(job_id=job_id) == []
            assert [e.job_id for e in c.store.ledger_entries()] == [state["other"]]
            assert all(a.results and not a.results[-1].completed for a in agents)
        finally:
            await c.close()

    asyncio.run(main())
