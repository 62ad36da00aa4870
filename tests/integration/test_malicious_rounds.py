"""``secagg.threat_model: malicious`` end to end: the real coordinator and real agents over
loopback gRPC, each agent with a peer certificate of one federation CA (tests/support/peer_pki.py).

- The malicious-secure job completes; the coordinator's ledger is the semi-honest run's (same
  charges: the threat model changes who can read what, not what is released), and each agent's
  local ledger records the noise of t − c shares (``Policy.verified_shares``), where the
  semi-honest run's agent records its own share alone.
- An agent whose peer certificate comes from another CA makes its neighbours abort at stage 2,
  naming the check, before anything is charged or sent.
- An agent without a peer identity refuses the setup (``POLICY_DECLINED``); the others go on.

docs/secagg.md#the-malicious-secure-variant, docs/accounting.md#what-the-agent-can-verify.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from support import peer_pki
from support.coordination import deadlines, small_job
from support.stored_rounds import secagg_of

from dpfl.accounting import epsilon_from_rdp, event_from_json, event_to_json, rdp_curve
from dpfl.client.policy import Policy
from dpfl.client.summation import PeerCredentials
from dpfl.learning.jobs import JobSpec
from dpfl.simulation import Simulation

AGENTS = 6
#: n = 6 at these fractions gives a complete graph, k = 5, t = 4 (malicious), min_survivors 5:
#: with c = 1, 2t = 8 > k + 1 + c = 7, so each agent can count on t − c = 3 shares
SECAGG = {"corrupt_fraction": 0.2, "dropout_fraction": 0.2}
#: the agents' policy: count on the verified noise only, c = 1, budgets wide enough for it
POLICY = Policy(
    max_colluding_peers=1,
    min_noise_multiplier=0.0,
    max_epsilon_per_job=1e4,
    max_epsilon_total=1e4,
)


def job(threat_model: str, rounds: int = 2) -> JobSpec:
    return small_job(rounds=rounds, secagg={**SECAGG, "threat_model": threat_model})


def peers(ca: peer_pki.TestCA, count: int) -> dict[int, PeerCredentials]:
    return {
        i: PeerCredentials(signer=ca.signer(f"silo-{i}"), authority=ca.authority())
        for i in range(count)
    }


def _noise(event: Mapping[str, Any]) -> float:
    """The first noise parameter (Skellam μ, Gaussian σ) of an event's JSON form."""
    for key in ("mu", "sigma"):
        if isinstance(event.get(key), int | float):
            return float(event[key])
    for value in event.values():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, Mapping):
                try:
                    return _noise(item)
                except LookupError:
                    continue
    raise LookupError(f"no noise parameter in {event}")


async def _run(sim: Simulation) -> tuple[Any, float]:
    started = time.process_time()
    result = await sim.run()
    return result, time.process_time() - started


def test_malicious_job_charges_like_semi_honest_and_agents_record_t_minus_c(
    tmp_path: Path,
) -> None:
    ca = peer_pki.TestCA.make()
    policies = dict.fromkeys(range(AGENTS), POLICY)

    async def main() -> None:
        runs: dict[str, dict[str, Any]] = {}
        for threat in ("semi-honest", "malicious"):
            (tmp_path / threat).mkdir()
            sim = Simulation(
                job(threat),
                agents=AGENTS,
                transport="grpc",
                workdir=tmp_path / threat,
                deadlines=deadlines(),
                policies=policies,
                peers=peers(ca, AGENTS) if threat == "malicious" else None,
            )
            try:
                result, cpu = await _run(sim)
                assert result.status == "completed", result.error
                assert result.rounds_completed == 2
                store = sim.coordinator.store
                rounds = store.list_rounds(sim.job_id)
                ids = [a.agent_id for a in sim.agents]
                runs[threat] = {
                    "result": result,
                    "cpu": cpu,
                    "rounds": rounds,
                    "claims": [
                        [e.event for e in store.ledger_entries(agent_id=a, job_id=sim.job_id)]
                        for a in ids
                    ],
                    "local": [
                        [entry.events for entry in agent.ledger.entries(job_id=sim.job_id)]
                        for agent in sim.agents
                    ],
                }
            finally:
                await sim.close()
        honest, malicious = runs["semi-honest"], runs["malicious"]
        for rnd in malicious["rounds"]:
            record = secagg_of(rnd)
            assert record.threat_model == "malicious"
            assert (record.degree, record.threshold) == (5, 4)
            # every summed agent attested the survivor set before the commit
            assert sorted(rnd.survivors["consistency"]) == sorted(rnd.survivors["masked_input"])
            assert len(rnd.survivors["unmask"]) == AGENTS
        for rnd in honest["rounds"]:
            assert secagg_of(rnd).threat_model == "semi-honest"
            assert "consistency" not in rnd.survivors
        # the coordinator charges the same events for the same job: the threat model is no part
        # of what the release costs
        assert malicious["claims"] == honest["claims"]
        assert all(len(claims) == 2 for claims in malicious["claims"])
        t, k = 4, 5
        v = POLICY.verified_shares(malicious_secure=True, threshold=t, degree=k)
        assert v == t - 1 == 3
        for i in range(AGENTS):
            for number in range(2):
                claim = malicious["claims"][i][number]
                (own,) = honest["local"][i][number]  # semi-honest: its own share alone
                (recorded,) = malicious["local"][i][number]
                f1 = _noise(event_to_json(own)) / _noise(claim)
                assert 0 < f1 < 1 / v  # the scaling is visible: 3 shares stay below the claim
                expected = event_from_json(claim).with_noise_fraction(min(1.0, v * f1))
                assert _noise(event_to_json(recorded)) == pytest.approx(
                    _noise(event_to_json(expected)), rel=1e-12
                )
                # more verified noise: a smaller ε than the own-share figure, a larger one than
                # the claim
                eps = [epsilon_from_rdp(rdp_curve(e), delta=1e-5)[0] for e in (own, recorded)]
                claimed = epsilon_from_rdp(rdp_curve(event_from_json(claim)), delta=1e-5)[0]
                assert claimed < eps[1] < eps[0]
        print(
            f"\nCPU of the process (coordinator and {AGENTS} agents), 2 rounds: semi-honest "
            f"{honest['cpu']:.2f} s, malicious {malicious['cpu']:.2f} s; accuracy "
            f"{honest['result'].accuracy} vs {malicious['result'].accuracy}; consistency stage "
            f"{[r.stage_seconds.get('consistency') for r in malicious['rounds']]} s"
        )

    asyncio.run(main())


def _texts(agent: Any) -> str:
    return "\n".join(event.message for event in agent.events)


def test_a_peer_of_another_ca_makes_its_neighbours_abort_at_stage_2(tmp_path: Path) -> None:
    ca, foreign = peer_pki.TestCA.make(), peer_pki.TestCA.make("another CA")
    credentials = peers(ca, AGENTS - 1)
    # the intruder trusts its own CA: its certificate is not a peer of the federation's
    credentials[AGENTS - 1] = PeerCredentials(
        signer=foreign.signer("intruder"), authority=foreign.authority()
    )

    async def main() -> None:
        sim = Simulation(
            job("malicious", rounds=1),
            agents=AGENTS,
            transport="grpc",
            workdir=tmp_path,
            deadlines=deadlines(),
            policies=dict.fromkeys(range(AGENTS), POLICY),
            peers=credentials,
            coordinator_options={"max_attempts": 1},
        )
        try:
            result = await sim.run()
            assert result.status == "failed"
            (rnd,) = sim.coordinator.store.list_rounds(sim.job_id)
            assert rnd.status.value == "aborted"
            assert "masked_input" not in rnd.survivors
            for agent in sim.agents[:-1]:
                texts = _texts(agent)
                assert "uncertified peer" in texts, texts
                assert "'intruder': not issued by the federation CA" in texts
                assert agent.ledger.entries(job_id=sim.job_id) == []  # nothing charged or sent
        finally:
            await sim.close()

    asyncio.run(main())


def test_an_agent_without_peer_identity_refuses_a_malicious_setup(tmp_path: Path) -> None:
    ca = peer_pki.TestCA.make()

    async def main() -> None:
        sim = Simulation(
            job("malicious", rounds=1),
            agents=AGENTS,
            transport="grpc",
            workdir=tmp_path,
            deadlines=deadlines(),
            policies=dict.fromkeys(range(AGENTS), POLICY),
            peers=peers(ca, AGENTS - 1),  # the last agent has none
        )
        try:
            result = await sim.run()
            assert result.status == "completed", result.error  # five agents are enough
            (rnd,) = sim.coordinator.store.list_rounds(sim.job_id)
            lone = sim.agents[-1]
            assert lone.agent_id not in rnd.survivors["advertise_keys"]
            assert len(rnd.survivors["unmask"]) == AGENTS - 1
            texts = _texts(lone)
            assert "ERROR_POLICY_DECLINED: malicious-secure setup refused: this agent has no " in (
                texts
            )
            assert "peer identity" in texts
            assert lone.ledger.entries(job_id=sim.job_id) == []
        finally:
            await sim.close()

    asyncio.run(main())


def test_fewer_shares_verified_at_stage_2_lower_the_charge_before_it_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The setup lets each agent count on t − c = 3 shares; if the protocol's own checks
    verified only 2 by the time the masked input leaves, the charge is recomputed on 2 and
    decided again, and the ledger records that (never more noise than verified)."""
    from dpfl.secagg import client as secagg_client

    verified = secagg_client.verified_noise_shares
    monkeypatch.setattr(
        secagg_client, "verified_noise_shares", lambda state: min(2, verified(state))
    )
    ca = peer_pki.TestCA.make()

    async def main() -> None:
        sim = Simulation(
            job("malicious", rounds=1),
            agents=AGENTS,
            transport="grpc",
            workdir=tmp_path,
            deadlines=deadlines(),
            policies=dict.fromkeys(range(AGENTS), POLICY),
            peers=peers(ca, AGENTS),
        )
        try:
            result = await sim.run()
            assert result.status == "completed", result.error
            store = sim.coordinator.store
            for agent in sim.agents:
                (setup,) = [e.data for e in agent.events if e.kind.value == "setup"]
                (charged,) = [e.data for e in agent.events if e.kind.value == "charged"]
                assert (setup["verified_shares"], charged["verified_shares"]) == (3, 2)
                fraction = charged["recorded_fraction"]
                assert fraction == pytest.approx(setup["recorded_fraction"] * 2 / 3, rel=1e-12)
                (claim,) = store.ledger_entries(agent_id=agent.agent_id, job_id=sim.job_id)
                ((recorded,),) = [e.events for e in agent.ledger.entries(job_id=sim.job_id)]
                expected = event_from_json(claim.event).with_noise_fraction(fraction)
                assert recorded == expected
        finally:
            await sim.close()

    asyncio.run(main())


def test_the_library_simulation_certifies_its_agents_for_a_malicious_job() -> None:
    """``dpfl.simulation.simulate`` (and ``dpfl simulate``) of a malicious-secure job: the
    simulation makes one federation CA and a peer certificate per agent, so the job runs."""
    from dpfl.simulation import simulate

    result = simulate(job("malicious"), AGENTS, transport="inproc")
    assert result.status == "completed", result
    assert result.rounds_completed == 2
