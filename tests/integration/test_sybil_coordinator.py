"""A coordinator that fills a round with its own agents (docs/accounting.md, "What the agent
can verify").

Real agent, real gRPC, the real secure-aggregation server: the scripted coordinator invites one
honest agent and runs 29 secure-aggregation clients of its own that add zero vectors and no noise,
so the unmasked sum is the honest agent's vector under its own noise share alone. The agent's
ledger must record that share's ε, not the announced cohort's, and its budget must apply to it.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
from support import peer_pki
from support.agent_kit import JOB, fedavg_round, federation, publish

from dpfl.accounting import DpEvent, compute_epsilon
from dpfl.client.policy import Policy
from dpfl.client.summation import PeerCredentials
from dpfl.mechanisms import EncodingConfig
from dpfl.secagg import ClientIdentity, ThreatModel

SYBILS = 29
DELTA = 1e-5


def _figures(setup_events: tuple[DpEvent, ...], share: float, total: float) -> tuple[float, float]:
    """(the announced cohort's ε, the ε of one share alone) of one round's charge."""
    (event,) = setup_events
    announced = compute_epsilon(event, delta=DELTA).epsilon
    alone = compute_epsilon(event.with_noise_fraction(share / total), delta=DELTA).epsilon
    return announced, alone


def _run(tmp_path: Path, policy: Policy) -> tuple[object, object, EncodingConfig | None, object]:
    async def main() -> tuple[object, object, EncodingConfig | None, object]:
        setup = fedavg_round(population=SYBILS + 1)
        async with federation(tmp_path, "grpc", 1, policy=policy) as (coord, agents):
            publish(coord, setup)
            report = await coord.run_round(
                job_id=JOB,
                round=1,
                agents=[agents[0].agent_id],
                algorithm=setup.algorithm,
                job=setup.job,
                plan=setup.plan,
                task=setup.task,
                sybils=SYBILS,
                timeout=30.0,
            )
            return report, agents[0].ledger.entries(), report.encoding, setup

    return asyncio.run(asyncio.wait_for(main(), 120))


def _charge_and_split(setup: object, encoding: EncodingConfig) -> tuple[tuple[DpEvent, ...], float]:
    alg = setup.algorithm  # type: ignore[attr-defined]
    bound = alg.bind(setup.job, setup.plan)  # type: ignore[attr-defined]
    claimed = bound.invitation_events(round_number=1, population=[f"a{i}" for i in range(30)])
    side = alg.agent(alg.parse_task(setup.task.params.to_json()))  # type: ignore[attr-defined]
    charge = side.charge(claimed)
    return charge, encoding.noise.parameter


@pytest.mark.parametrize("budget", ["between", "above"])
def test_a_coordinator_with_its_own_agents_gets_no_more_than_the_policy_allows(
    tmp_path: Path, budget: str
) -> None:
    _, _, encoding, setup = _run(tmp_path / "probe", Policy(trust_announced_cohort=True))
    assert encoding is not None
    charge, share = _charge_and_split(setup, encoding)
    total = setup.plan.details.noise_total  # type: ignore[attr-defined]
    announced, alone = _figures(charge, share, total)
    # one share of 30 carries a thirtieth of the noise: the true cost is several times the claim
    assert alone > 3 * announced
    limit = math.sqrt(announced * alone) if budget == "between" else 2 * alone
    policy = Policy(max_epsilon_per_job=limit, max_epsilon_total=limit, min_noise_multiplier=0.0)
    report, entries, _, _ = _run(tmp_path / budget, policy)
    if budget == "between":
        errors = [e.message for e in report.errors.get("agent-0", [])]  # type: ignore[attr-defined]
        verified = "declined on the noise this agent can verify"
        assert any(verified in m and "max_epsilon_per_job" in m for m in errors), errors
        assert entries == []  # nothing recorded, nothing sent
        assert "agent-0" not in report.survivors  # type: ignore[attr-defined]
    else:
        assert "agent-0" in report.survivors  # type: ignore[attr-defined]
        (entry,) = entries  # type: ignore[misc]
        recorded = compute_epsilon(entry.events[0], delta=DELTA).epsilon
        assert recorded == pytest.approx(alone, rel=1e-6)


def test_an_agent_that_trusts_the_announced_cohort_records_the_claim(tmp_path: Path) -> None:
    """The knowingly trusting mode records the announced figure, which this coordinator makes
    false: why it is the simulations' setting and never the default."""
    report, entries, encoding, setup = _run(
        tmp_path, Policy(trust_announced_cohort=True, min_noise_multiplier=0.0)
    )
    assert encoding is not None
    charge, share = _charge_and_split(setup, encoding)
    announced, alone = _figures(charge, share, setup.plan.details.noise_total)  # type: ignore[attr-defined]
    (entry,) = entries  # type: ignore[misc]
    assert compute_epsilon(entry.events[0], delta=DELTA).epsilon == pytest.approx(announced)
    assert alone > 3 * announced
    assert "agent-0" in report.survivors  # type: ignore[attr-defined]


def test_sybils_certified_by_the_coordinators_own_ca_make_the_agent_abort_at_stage_2(
    tmp_path: Path,
) -> None:
    """The malicious-secure variant: the coordinator gives its 29 agents peer certificates of a CA
    it runs itself. The honest agent trusts only the federation CA: it aborts at stage 2, naming
    the check, and neither charges nor sends anything."""
    federation_ca, own_ca = peer_pki.TestCA.make(), peer_pki.TestCA.make("coordinator's CA")
    sybils = [
        ClientIdentity(
            signer=own_ca.signer(f"sybil-{i}"),
            authority=own_ca.authority(),
            max_colluding_peers=0,
            now=peer_pki.NOW,
        )
        for i in range(SYBILS)
    ]
    peer = PeerCredentials(
        signer=federation_ca.signer("silo-0"), authority=federation_ca.authority()
    )
    policy = Policy(
        max_colluding_peers=1,
        min_noise_multiplier=0.0,
        max_epsilon_per_job=1e4,
        max_epsilon_total=1e4,
    )

    async def main() -> tuple[object, object, list[str]]:
        setup = fedavg_round(population=SYBILS + 1)
        async with federation(tmp_path, "grpc", 1, policy=policy, peer=peer) as (coord, agents):
            publish(coord, setup)
            report = await coord.run_round(
                job_id=JOB,
                round=1,
                agents=[agents[0].agent_id],
                algorithm=setup.algorithm,
                job=setup.job,
                plan=setup.plan,
                task=setup.task,
                sybils=SYBILS,
                threat_model=ThreatModel.MALICIOUS,
                sybil_identities=sybils,
                timeout=30.0,
            )
            return report, agents[0].ledger.entries(), agents[0].kinds()

    report, entries, kinds = asyncio.run(asyncio.wait_for(main(), 120))
    errors = [e.message for e in report.errors.get("agent-0", [])]  # type: ignore[attr-defined]
    assert any(
        "uncertified peer" in m and "not issued by the federation CA" in m for m in errors
    ), errors
    assert "agent-0" not in report.survivors  # type: ignore[attr-defined]
    assert entries == []
    assert "masked-input-sent" not in kinds, kinds
    assert "charged" not in kinds, kinds
