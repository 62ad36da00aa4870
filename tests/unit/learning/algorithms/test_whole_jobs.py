"""Whole jobs in one process (tests/support/algorithm_harness.py): real encoding, real per-agent
integer noise, the real secure-aggregation state machines, both ledgers through dpfl.accounting.

Measured figures (stated in the final report and checked here with a margin):
- DP-FedAvg, the demo job with q = 0.3, 100 agents, 10 rounds, ε = 4 at δ = 1e-5: ~0.70 test
  accuracy on digits on average over sampling/noise seeds (0.67-0.80 typical), this seed 0.70;
- PATE-FL, 10 agents, σ = 3 (agent level, 200 queries): pseudo-labels ~0.85, student ~0.88.
"""

from __future__ import annotations

import math

import pytest
from support.algorithm_harness import make_job, make_pate_job, run_job

from dpfl.accounting import SelfComposedEvent, compute_epsilon, event_from_json
from dpfl.learning.algorithms.dp_fedavg import DpFedAvg
from dpfl.learning.algorithms.parts import teachers
from dpfl.secagg import SeededRandomSource
from dpfl.secagg.messages import Stage


@pytest.mark.slow
def test_dp_fedavg_demo_job_learns_digits_within_epsilon_4() -> None:
    job = make_job()  # the demo job file with sampling_rate 0.3
    sampling = SeededRandomSource(b"sampling-seed-00000000")
    result = run_job(
        job,
        num_agents=100,
        algorithm=DpFedAvg(random_source=sampling),
        seed=b"harness-seed-00000000xx",
    )
    assert len(result.rounds) == 10
    assert not any(r.skipped for r in result.rounds)
    accuracy = result.final_metrics["accuracy"]
    assert accuracy >= 0.60, f"accuracy {accuracy:.3f}"
    # every client of the population pays every round; its ε is the calibrated job ε
    planned = compute_epsilon(event_from_json(result.plan.calibration["event"]), delta=1e-5)
    for client in result.population:
        assert len(result.ledger[client]) == 10
        assert result.epsilon(client) == pytest.approx(planned.epsilon, rel=1e-9)
        assert result.epsilon(client) <= 4.0
    # agents record only the rounds they took part in, without amplification
    took_part = {c for r in result.rounds for c in r.participants}
    assert took_part == set(result.agent_ledgers)
    for client, events in result.agent_ledgers.items():
        rounds = sum(client in r.participants for r in result.rounds)
        assert len(events) == rounds
        assert result.agent_epsilon(client) >= 0.0
    busiest = max(result.agent_ledgers, key=lambda c: len(result.agent_ledgers[c]))
    assert result.agent_epsilon(busiest) > result.epsilon(busiest)  # conditional > amplified
    sizes = [len(r.invited) for r in result.rounds]
    assert min(sizes) >= 10
    assert max(sizes) <= 50


def test_dp_fedavg_without_secure_aggregation_charges_local_dp_to_participants() -> None:
    job = make_job(rounds=2, secagg={"enabled": False}, params={"sampling_rate": 0.5})
    result = run_job(
        job,
        num_agents=12,
        algorithm=DpFedAvg(random_source=SeededRandomSource(b"local-dp-sampling-seed")),
    )
    took_part = [c for r in result.rounds for c in r.participants]
    assert set(result.ledger) == set(took_part)
    for client in result.ledger:
        charges = result.ledger[client]
        assert len(charges) == took_part.count(client)
        assert all(not c.secure_aggregation for c in charges)
        # the agent records exactly the coordinator's (already non-amplified) charge
        assert result.agent_ledgers[client] == [c.event for c in charges]
    assert all(not math.isnan(r.metrics["accuracy"]) for r in result.rounds if not r.skipped)


def test_pate_fl_ten_agents_label_public_digits_and_train_a_student() -> None:
    teachers.clear_teacher_cache()
    job = make_pate_job()
    result = run_job(job, num_agents=10)
    metrics = result.final_metrics
    assert metrics["pseudo_label_accuracy"] >= 0.80, metrics
    assert metrics["accuracy"] >= 0.80, metrics
    assert metrics["answered_queries"] == 200
    assert teachers.teacher_cache_size() == 10  # one teacher per agent, reused in round 2
    for client in result.population:
        charges = result.ledger[client]
        # exactly the answered queries, at the configured level
        assert sum(c.event.count for c in charges) == 200
        assert all(isinstance(c.event, SelfComposedEvent) for c in charges)
        assert all(c.unit == "agent" for c in charges)
        assert result.agent_epsilon(client) == pytest.approx(result.epsilon(client))
    planned = event_from_json(result.plan.calibration["event"])
    assert result.epsilon(result.population[0]) == pytest.approx(
        compute_epsilon(planned, delta=1e-5).epsilon, rel=1e-6
    )


def test_pate_fl_charges_only_the_agents_whose_votes_were_summed() -> None:
    job = make_pate_job(
        rounds=2, params={"queries": 20}, secagg={"dropout_fraction": 0.3, "corrupt_fraction": 0.0}
    )
    # round 1: agent 2 stops before its masked input (excluded, not charged); agent 5 after it
    # (still summed and charged)
    dropouts = {1: {Stage.MASKED_INPUT: {2}, Stage.UNMASK: {5}}}
    result = run_job(job, num_agents=10, dropouts=dropouts)
    first, second = result.rounds
    assert "agent-0002" not in first.participants
    assert "agent-0005" in first.participants
    assert first.metrics["survivors"] == 9
    assert len(result.ledger["agent-0002"]) == 1  # only round 2
    assert len(result.ledger["agent-0005"]) == 2
    assert len(second.participants) == 10


@pytest.mark.slow
def test_dp_fedavg_releases_samples_of_zero_and_one_agents_as_the_coordinator_does() -> None:
    """The harness follows the coordinator's release policy
    (``dpfl.learning.algorithms.parts.sample_release``): with q = 0.3 of 4 agents this seed samples
    1, 2, 0 and 1 agents. No round is skipped, every agent is charged the sampled event for each of
    the four rounds, a lone agent is summed in the plain transport carrying the whole noise, and the
    empty sample releases the noise alone."""
    job = make_job(name="harness-small-samples", rounds=4)
    algorithm = DpFedAvg(random_source=SeededRandomSource(b"harness-small-samples-0"))
    result = run_job(job, num_agents=4, algorithm=algorithm)
    assert [len(r.invited) for r in result.rounds] == [1, 2, 0, 1]
    assert not any(r.skipped for r in result.rounds)
    assert [len(r.participants) for r in result.rounds] == [1, 2, 0, 1]
    for client in result.population:
        assert len(result.ledger[client]) == 4
        assert result.epsilon(client) <= job.privacy.target_epsilon
    task = algorithm.bind(job, result.plan).round_task(result.state, round_number=1)
    alone = algorithm.bind(job, result.plan).noise_alone_encoding(task)
    for record in result.rounds:
        assert record.encoding is not None
        if len(record.invited) <= 1:
            assert record.encoding.noise == alone.noise
    lone = result.rounds[0].participants[0]
    assert len(result.agent_ledgers[lone]) >= 1
    assert all(not math.isnan(r.metrics["accuracy"]) for r in result.rounds)


@pytest.mark.slow
def test_an_honest_malicious_secure_run_gives_the_semi_honest_model_and_ledger() -> None:
    """The same job, data and randomness under both protocols, with a dropout in stage 3: the
    malicious-secure variant (signed keys, the roster's graph, the consistency round) releases
    exactly the semi-honest sum, so the final model is the same to the byte, and the
    coordinator charges the same events to the same clients."""
    runs = {}
    for threat in ("semi-honest", "malicious"):
        job = make_job(
            rounds=2,
            secagg={"threat_model": threat, "dropout_fraction": 0.2, "corrupt_fraction": 0.05},
            params={"sampling_rate": 1.0},
        )
        runs[threat] = run_job(
            job,
            num_agents=8,
            seed=b"same-model-under-both-protocols",
            dropouts={2: {Stage.MASKED_INPUT: [3]}},
        )
    honest, malicious = runs["semi-honest"], runs["malicious"]
    assert [r.participants for r in malicious.rounds] == [r.participants for r in honest.rounds]
    assert len(honest.rounds[1].participants) == 7  # the dropout left the second sum
    assert malicious.state.model == honest.state.model
    assert {c: [x.event for x in charges] for c, charges in malicious.ledger.items()} == {
        c: [x.event for x in charges] for c, charges in honest.ledger.items()
    }
