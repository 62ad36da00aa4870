"""A round attempt's stored record (``RoundSetup``): what the coordinator writes, that it reads
back as written, and that a record it cannot read is refused naming the round and the field."""

from __future__ import annotations

import pytest
from support.algorithm_harness import make_job

from dpfl.learning.algorithms.base import CoordinatorState
from dpfl.learning.algorithms.dp_fedavg import DpFedAvg
from dpfl.learning.rounds.state import Summation, SumSetup
from dpfl.mechanisms import EncodingConfig
from dpfl.mechanisms.noise import NoiseKind, NoiseSpec
from dpfl.secagg import RoundParameters
from dpfl.server.errors import LedgerIntegrityError
from dpfl.server.orchestrator.sampling import AttemptSample
from dpfl.server.orchestrator.state import plan_record, round_record, with_summation
from dpfl.server.store import ROUND_SETUP_VERSION, RoundSetup

ENCODING = EncodingConfig(
    clip=1.0, scale_bits=10, ring_bits=32, noise=NoiseSpec(NoiseKind.SKELLAM, 4.5)
)
WHERE = "round 7 (job 'j', round 2, attempt 1)"

#: A record as the coordinator writes it for a secure round (the stored JSON, today's keys).
STORED = {
    "plan": {
        "noise_multiplier": 1.25,
        "calibration": {"target_epsilon": 4.0, "method": "rdp"},
        "population": 5,
        "details": {"clip": 1.0, "noise_total": 3.5},
    },
    "state": {"model_version": None, "details": {"round": 1}, "blobs": {"m": "AAE="}},
    "population": 5,
    "excluded_over_budget": [],
    "sample": ["a", "b", "c"],
    "sample_population": ["a", "b", "c", "d", "e"],
    "sample_kept": False,
    "declined": {"c": "over budget"},
    "encoding": {
        "clip": 1.0,
        "scale_bits": 10,
        "ring_bits": 32,
        "noise": {"kind": "skellam", "parameter": 4},
        "rounding_beta": 0.0,
    },
    "secagg": {
        "num_clients": 2,
        "degree": 1,
        "threshold": 2,
        "ring_bits": 32,
        "vector_length": 10,
        "min_survivors": 2,
        "threat_model": "semi-honest",
    },
    "restored_noise_shares": 0,
}


def _setup(kind: Summation, accepted: tuple[str, ...]) -> SumSetup:
    params = None
    if kind is Summation.SECURE:
        params = RoundParameters(
            num_clients=3, degree=2, threshold=2, ring_bits=32, vector_length=10, min_survivors=2
        )
    return SumSetup(kind, accepted, 10, ENCODING, params, "semi-honest" if params else "")


def test_a_stored_record_reads_back_as_written() -> None:
    record = RoundSetup.from_stored({**STORED, "version": ROUND_SETUP_VERSION}, where=WHERE)
    assert record.document() == STORED
    assert record.to_json() == {**STORED, "version": ROUND_SETUP_VERSION}
    assert isinstance(record.to_json()["encoding"], dict)
    assert record.kept_sample() == (("a", "b", "c"), ("a", "b", "c", "d", "e"))


def test_the_coordinator_writes_the_plan_state_sample_and_summation() -> None:
    job = make_job(name="setup-record")
    algorithm = DpFedAvg()
    plan = algorithm.plan(job, population=5)
    state = CoordinatorState(model=b"m", model_version=3, details={"round": 2}, blobs={"k": b"\1"})
    sample = AttemptSample(("a", "b"), ("a", "b", "c"), ("a", "b"), kept=True)
    record = round_record(plan, state, sample, ["a", "b", "c"], ["d"])
    stored = record.to_json()
    assert stored["version"] == ROUND_SETUP_VERSION
    assert stored["plan"] == plan.to_json()
    assert stored["state"] == {"model_version": 3, "details": {"round": 2}, "blobs": {"k": "AQ=="}}
    assert (stored["sample"], stored["sample_population"], stored["sample_kept"]) == (
        ["a", "b"],
        ["a", "b", "c"],
        True,
    )
    assert (stored["population"], stored["excluded_over_budget"]) == (3, ["d"])
    assert set(stored) == {
        "version",
        "plan",
        "state",
        "population",
        "excluded_over_budget",
        "sample",
        "sample_population",
        "sample_kept",
    }
    assert algorithm.parse_plan(plan_record(plan).model_dump(mode="json")) == plan
    assert RoundSetup.from_stored(stored, where=WHERE) == record


def test_the_summation_is_recorded_as_the_api_shows_it() -> None:
    empty = RoundSetup.empty()
    plain = with_summation(empty, _setup(Summation.PLAIN, ("a", "b", "c", "d"))).to_json()
    assert plain["secagg"] == {"enabled": False, "num_clients": 4, "ring_bits": 32}
    assert plain["encoding"] == ENCODING.to_dict()
    assert "noise_alone" not in plain
    secure = with_summation(empty, _setup(Summation.SECURE, ("a", "b", "c"))).to_json()
    assert secure["secagg"] == {
        "num_clients": 3,
        "degree": 2,
        "threshold": 2,
        "ring_bits": 32,
        "vector_length": 10,
        "min_survivors": 2,
        "threat_model": "semi-honest",
    }
    alone = with_summation(empty, _setup(Summation.NOISE_ALONE, ())).to_json()
    assert alone["noise_alone"] is True
    assert alone["secagg"] == {"enabled": False, "num_clients": 0, "ring_bits": 32}


@pytest.mark.parametrize(
    ("stored", "message"),
    [
        (STORED, "version None; this coordinator reads version 1"),
        ({**STORED, "version": 2}, "version 2; this coordinator reads version 1"),
        ({"version": 1, "noise_multiplier": 1.1}, "malformed at 'noise_multiplier'"),
        ({"version": 1, "secagg": {"num_clients": "x", "ring_bits": 8}}, "'secagg.num_clients'"),
        ({"version": 1, "plan": {"noise_multiplier": 1.0}}, "'plan.calibration'"),
        ({"version": 1, "declined": {"a": 3}}, "'declined.a'"),
        (["not", "an", "object"], "is not an object: list"),
    ],
)
def test_a_record_this_coordinator_cannot_read_is_refused_naming_round_and_field(
    stored: object, message: str
) -> None:
    with pytest.raises(LedgerIntegrityError) as exc:
        RoundSetup.from_stored(stored, where=WHERE)
    assert f"the stored record of {WHERE}" in str(exc.value)
    assert message in str(exc.value)
