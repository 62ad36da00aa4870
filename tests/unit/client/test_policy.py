"""The agent's local policy: YAML loading, defaults, and a decision naming the rule."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dpfl.accounting import (
    ComposedEvent,
    GaussianEvent,
    NoPrivacyEvent,
    PoissonSampledEvent,
    SelfComposedEvent,
    SkellamEvent,
    VotingEvent,
    epsilon_from_rdp,
    rdp_curve,
)
from dpfl.accounting.events import DpEvent
from dpfl.client.local_ledger import LocalBudgetExceeded, LocalLedger
from dpfl.client.policy import Decision, Policy, PolicyError, noise_multiplier
from dpfl.learning.algorithms.registry import algorithm_names

SKELLAM = SkellamEvent(
    mu=(2.0 * 1024.6) ** 2 / 2, l1_sensitivity=26121.9, l2_sensitivity=1024.6, dimension=650
)
#: A PATE-FL round of agent-level one-hot Skellam votes (σ = 3, 20 queries): its level is not in
#: the event, only in the task's unit.
SKELLAM_VOTES = SelfComposedEvent(SkellamEvent((3.0 * 1024) ** 2 / 2, 1024.0, 1024.0, 1), 20)


@pytest.fixture
def ledger(tmp_path: Path) -> LocalLedger:
    with LocalLedger.open(tmp_path) as opened:
        yield opened


def test_defaults_and_yaml(tmp_path: Path) -> None:
    default = Policy.load(None)
    assert default == Policy()
    assert default.allowed_algorithms == algorithm_names()
    assert (default.max_epsilon_per_job, default.max_epsilon_total, default.delta) == (
        10.0,
        30.0,
        1e-5,
    )
    path = tmp_path / "policy.yaml"
    path.write_text(
        "allowed_algorithms: [dp-fedavg]\nmax_epsilon_per_job: 3\nmax_epsilon_total: 5\n"
        "delta: 1.0e-6\nmin_noise_multiplier: 1.5\nallowed_coordinators: [coord-a]\n"
        "allowed_jobs: ['demo-*']\nrequire_secure_aggregation: true\n"
    )
    policy = Policy.load(path)
    assert policy.allowed_algorithms == ("dp-fedavg",)
    assert policy.delta == 1e-6
    assert policy.allowed_jobs == ("demo-*",)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert Policy.load(empty) == Policy()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("max_epsilon_per_job: -1", "max_epsilon_per_job"),
        ("allowed_algorithms: [fedprox]", "unknown algorithm"),
        ("max_epsilon_total: 2", "must not exceed"),
        ("delta: 2", "delta"),
        ("max_epsilon_per_jobs: 1", "max_epsilon_per_jobs"),  # a typo is an error
        ("[1, 2]", "mapping"),
        ("a: [", "cannot read"),
    ],
)
def test_bad_policies_name_the_field(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError, match=problem) as info:
        Policy.load(path)
    assert str(path) in str(info.value)
    with pytest.raises(PolicyError, match="cannot read"):
        Policy.load(tmp_path / "missing.yaml")


def test_noise_multiplier_of_events() -> None:
    assert noise_multiplier(GaussianEvent(sigma=3.0, sensitivity=2.0)) == 1.5
    assert noise_multiplier(SKELLAM) == pytest.approx(2.0)
    assert noise_multiplier(PoissonSampledEvent(0.3, SKELLAM)) == pytest.approx(2.0)
    assert noise_multiplier(VotingEvent(queries=9, sigma=4.0, level="agent")) == 4.0
    assert noise_multiplier(VotingEvent(queries=9, sigma=4.0, level="instance")) == pytest.approx(
        4.0 / math.sqrt(2)
    )
    per_query = SkellamEvent(
        mu=(3.0 * 1024) ** 2 / 2, l1_sensitivity=1024, l2_sensitivity=1024, dimension=10
    )
    assert noise_multiplier(SelfComposedEvent(per_query, 100)) == pytest.approx(3.0)
    assert noise_multiplier(ComposedEvent((GaussianEvent(1.0), GaussianEvent(5.0)))) == 1.0
    assert noise_multiplier(NoPrivacyEvent()) == math.inf

    class Odd(DpEvent):
        pass

    with pytest.raises(PolicyError, match="Odd"):
        noise_multiplier(Odd())


def _decide(policy: Policy, ledger: LocalLedger, **kw: object) -> Decision:
    args: dict[str, object] = {
        "algorithm": "dp-fedavg",
        "job_id": "job-1",
        "job_name": "demo-dpfedavg",
        "coordinator": "coord-a",
        "events": [SKELLAM],
        "ledger": ledger,
    }
    args.update(kw)
    return policy.decide(**args)  # type: ignore[arg-type]


def test_accepts_within_the_policy(ledger: LocalLedger) -> None:
    decision = _decide(Policy(), ledger)
    assert decision
    assert decision.rule == ""
    assert decision.epsilon_job == pytest.approx(
        ledger.epsilon_with([SKELLAM], job_id="job-1", delta=1e-5)[0]
    )


@pytest.mark.parametrize(
    ("policy", "overrides", "rule"),
    [
        (Policy(allowed_coordinators=("coord-b",)), {}, "allowed_coordinators"),
        (Policy(allowed_algorithms=("pate-fl",)), {}, "allowed_algorithms"),
        (Policy(allowed_jobs=("prod-*",)), {}, "allowed_jobs"),
        (
            Policy(require_secure_aggregation=True),
            {"secure_aggregation": False},
            "require_secure_aggregation",
        ),
        (
            Policy(max_honest_fraction=0.9, trust_announced_cohort=True),
            {"honest_fraction": 1.0},
            "max_honest_fraction",
        ),
        (Policy(allow_approximate=False), {"approximate": True}, "allow_approximate"),
        (Policy(min_noise_multiplier=2.5), {}, "min_noise_multiplier"),
        (Policy(max_epsilon_per_job=0.5, max_epsilon_total=30), {}, "max_epsilon_per_job"),
        (Policy(), {"events": []}, "events"),
        (Policy(), {"events": ["not an event"]}, "events"),
    ],
)
def test_declines_naming_the_rule(
    ledger: LocalLedger, policy: Policy, overrides: dict[str, object], rule: str
) -> None:
    decision = _decide(policy, ledger, **overrides)
    assert not decision
    assert decision.rule == rule
    assert decision.reason.startswith(rule)


def test_the_default_policy_declines_approximate_rounds_saying_how_to_proceed(
    ledger: LocalLedger,
) -> None:
    """Every ε a user sees must be a proven upper bound: discrete Gaussian noise's is not, so the
    default policy (no file, an empty file) declines it, and the reason names the rule and both
    ways on."""
    assert Policy().allow_approximate is False
    for default in (Policy(), Policy.load(None), Policy.from_mapping({})):
        decision = _decide(default, ledger, approximate=True)
        assert not decision
        assert decision.rule == "allow_approximate"
        assert decision.reason.startswith("allow_approximate: ")
        assert "not a proven upper bound" in decision.reason
        assert "privacy.noise: skellam" in decision.reason
        assert "allow_approximate: true" in decision.reason
        assert decision.epsilon_job is None  # declined before any ε is computed
    assert _decide(Policy(), ledger)  # an exact round is still accepted by default
    assert ledger.entries() == []


def test_allow_approximate_true_accepts_approximate_rounds_within_the_other_rules(
    tmp_path: Path, ledger: LocalLedger
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("allow_approximate: true\n")
    knowing = Policy.load(path)
    assert knowing == Policy(allow_approximate=True)
    decision = _decide(knowing, ledger, approximate=True)
    assert decision
    assert decision.epsilon_job == _decide(Policy(), ledger).epsilon_job
    # the opt-in lifts only this rule: the budgets still hold
    tight = Policy(allow_approximate=True, max_epsilon_per_job=0.5)
    assert _decide(tight, ledger, approximate=True).rule == "max_epsilon_per_job"


def test_honest_fraction_matters_only_when_the_agent_trusts_a_split_noise(
    ledger: LocalLedger,
) -> None:
    policy = Policy(max_honest_fraction=0.9, trust_announced_cohort=True)
    assert not _decide(policy, ledger, honest_fraction=1.0)
    assert _decide(policy, ledger, honest_fraction=1.0, secure_aggregation=False)
    # an agent that records only the noise it verified never relies on the announced t
    assert _decide(Policy(max_honest_fraction=0.9), ledger, honest_fraction=1.0)


def test_the_verified_shares_follow_the_threshold_and_the_colluders() -> None:
    trusting = Policy(max_colluding_peers=2)
    # t − c shares when 2t > k + 1 + c in a malicious-secure round
    assert trusting.verified_shares(malicious_secure=True, threshold=8, degree=10) == 6
    # the threshold condition fails (2t = 14 ≤ k + 1 + c = 15): the own share alone
    assert trusting.verified_shares(malicious_secure=True, threshold=7, degree=12) == 1
    # semi-honest rounds, or no stated c: the own share alone
    assert trusting.verified_shares(malicious_secure=False, threshold=8, degree=10) == 1
    assert Policy().verified_shares(malicious_secure=True, threshold=8, degree=10) == 1
    assert trusting.recorded_fraction(0.1, 6) == pytest.approx(0.6)
    assert trusting.recorded_fraction(0.3, 6) == 1.0
    assert Policy(trust_announced_cohort=True).recorded_fraction(0.01, 1) == 1.0
    with pytest.raises(PolicyError, match="max_colluding_peers"):
        Policy.from_mapping({"max_colluding_peers": -1})


def test_job_patterns_match_name_or_id(ledger: LocalLedger) -> None:
    policy = Policy(allowed_jobs=("demo-*", "job-7"))
    assert _decide(policy, ledger)
    assert _decide(policy, ledger, job_name="", job_id="job-7")
    assert not _decide(policy, ledger, job_name="other", job_id="job-8")


def test_budgets_count_the_local_ledger_across_jobs(ledger: LocalLedger) -> None:
    policy = Policy(max_epsilon_per_job=8.0, max_epsilon_total=8.0)
    round_ = 0
    while _decide(policy, ledger):
        round_ += 1
        assert policy.charge(
            ledger,
            job_id="job-1",
            round=round_,
            attempt=0,
            events=[SKELLAM],
            algorithm="dp-fedavg",
        )
    refused = _decide(policy, ledger)
    assert refused.rule == "max_epsilon_per_job"
    assert refused.epsilon_job is not None
    assert refused.epsilon_job > 8.0
    assert ledger.epsilon(delta=1e-5, job_id="job-1") <= 8.0
    # another job still fits its own budget but not the total
    other = _decide(policy, ledger, job_id="job-2")
    assert other.rule == "max_epsilon_total"
    with pytest.raises(LocalBudgetExceeded):
        policy.charge(
            ledger, job_id="job-2", round=1, attempt=0, events=[SKELLAM] * 5, algorithm="dp-fedavg"
        )
    assert ledger.jobs() == ["job-1"]
    # the figure is the tight one: more rounds than the RDP sum allows
    rdp = epsilon_from_rdp(round_ * rdp_curve(SKELLAM), delta=1e-5)[0]
    assert ledger.epsilon(delta=1e-5, job_id="job-1") < rdp


def test_the_budgets_see_votes_composed_with_other_jobs_at_the_tasks_unit(
    ledger: LocalLedger,
) -> None:
    """Told the task's unit, the policy's total composes agent-level votes with the agent's
    DP-FedAvg job on the PLD; without it, through the looser replace-one conversion, so a total
    budget between the two figures admits the round only with the unit."""
    loose_policy = Policy(max_epsilon_per_job=30.0, max_epsilon_total=30.0)
    assert loose_policy.charge(
        ledger,
        job_id="avg",
        round=1,
        attempt=0,
        events=[SKELLAM],
        algorithm="dp-fedavg",
        unit="agent",
    )
    votes: dict[str, object] = {"algorithm": "pate-fl", "job_id": "pate", "events": [SKELLAM_VOTES]}
    tight = _decide(loose_policy, ledger, **votes, unit="agent")
    unstated = _decide(loose_policy, ledger, **votes)
    assert tight
    assert unstated
    assert tight.epsilon_total is not None
    assert unstated.epsilon_total is not None
    assert tight.epsilon_total < 0.5 * unstated.epsilon_total
    limit = (tight.epsilon_total + unstated.epsilon_total) / 2
    policy = Policy(max_epsilon_per_job=limit, max_epsilon_total=limit)
    assert _decide(policy, ledger, **votes, unit="agent")
    assert _decide(policy, ledger, **votes).rule == "max_epsilon_total"
    charge = {"job_id": "pate", "round": 1, "attempt": 0, "events": [SKELLAM_VOTES]}
    with pytest.raises(LocalBudgetExceeded, match="all jobs"):
        policy.charge(ledger, **charge, algorithm="pate-fl")  # type: ignore[arg-type]
    assert policy.charge(ledger, **charge, algorithm="pate-fl", unit="agent")  # type: ignore[arg-type]
    assert ledger.epsilon(delta=1e-5) == pytest.approx(tight.epsilon_total, rel=1e-12)
    assert [e.unit for e in ledger.entries()] == ["agent", "agent"]
    # a unit the ledger does not know is a decline naming it, never an exception
    odd = _decide(loose_policy, ledger, **votes, unit="client")
    assert odd.rule == "events"
    assert "unit must be" in odd.reason


def test_policy_and_ledger_stay_light() -> None:
    """The task loop may load them anywhere: no gRPC, no server, no torch."""
    import subprocess
    import sys

    code = (
        "import sys, dpfl.client.policy, dpfl.client.local_ledger\n"
        "print(sorted(m for m in ('grpc', 'torch', 'dpfl.server', 'sqlalchemy') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_task_fields_the_policy_reads_are_typed_and_checked_once() -> None:
    """The gate hands the policy a parsed task: a malformed flag, honest fraction, noise or
    accounting is refused when the invitation is parsed, naming the field."""
    from dpfl.learning.algorithms.base import AlgorithmError
    from dpfl.learning.algorithms.registry import get_algorithm

    sgd = get_algorithm("dp-fedsgd")
    task = {
        "algorithm": "dp-fedsgd",
        "job": "j",
        "round": 1,
        "noise": "skellam",
        "noise_total": 10.0,
        "noise_multiplier": 1.0,
        "scale_bits": 8,
        "secure_aggregation": True,
        "honest_fraction": 1.0,
        "unit": "record",
        "delta": 1e-5,
        "dimension": 3,
        "model": "logreg",
        "clip": 1.0,
        "local_steps": 2,
        "batch_sampling_rate": 0.1,
        "learning_rate": 0.1,
        "expected_batch_size": 5.0,
        "max_local_size": 10,
        "accounting": "provable",
    }
    parsed = sgd.parse_task(task)
    assert (parsed.secure_aggregation, parsed.honest_fraction, parsed.approximate) == (
        True,
        1.0,
        False,
    )
    for key, bad in (
        ("honest_fraction", "all"),
        ("secure_aggregation", 1),
        ("noise", "laplace"),
        ("accounting", "optimistic"),
        ("honest_fraction", 1.5),
    ):
        with pytest.raises(AlgorithmError, match=f"params.{key}"):
            sgd.parse_task({**task, key: bad})


def test_the_sybil_figures_of_docs_accounting() -> None:
    """docs/accounting.md, "What the agent can verify": z = 1.44 split over N = 30 agents with
    δ_d = 0.05, 6 participations, δ = 1e-3. The announced cohort's 6.14 is what a coordinator
    with 29 agents of its own makes false; one share alone is 68.4, what the agent records."""
    from dpfl.accounting import GaussianEvent, SelfComposedEvent, compute_epsilon

    charge = SelfComposedEvent(GaussianEvent(sigma=1.44), 6)
    own = 1.0 / (30 * 0.95)  # one share of t·N·(1 − δ_d), t = 1
    fraction = Policy().recorded_fraction(
        own, Policy().verified_shares(malicious_secure=False, threshold=0, degree=0)
    )
    assert fraction == own
    announced = compute_epsilon(charge, delta=1e-3).epsilon
    recorded = compute_epsilon(charge.with_noise_fraction(fraction), delta=1e-3).epsilon
    assert round(announced, 2) == 6.14
    assert round(recorded, 1) == 68.4
    assert Policy(trust_announced_cohort=True).recorded_fraction(own, 1) == 1.0
