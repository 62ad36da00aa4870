"""Property-based fuzzing of the whole REST API from its own OpenAPI document (schemathesis):
no generated request, valid or invalid, may cause a 5xx or an answer that contradicts the
document (undocumented status, wrong content type, a body that violates its schema).

Every operation is fuzzed in positive and negative mode with random path parameters, and again
with the ids of a real client and job of the finished job, so that query parameters and model
versions are also exercised against existing data. Examples are bounded and derandomized (the
run is reproducible and takes about ten seconds); the counts are written to
``tests/artifacts/schemathesis.json``.

Two of schemathesis's checks are left out on purpose: ``negative_data_rejection`` (the API,
like most HTTP APIs, ignores unknown query parameters rather than refusing them) and
``positive_data_acceptance`` (a job document can match the JSON schema and still be refused by
a cross-field rule of ``parse_job``, e.g. a missing noise setting; that is a 422, not a bug).
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance
from support.api import FinishedJob, bearer
from support.paths import ARTIFACTS

pytestmark = pytest.mark.slow

MAX_EXAMPLES = 20
EXCLUDED = [negative_data_rejection, positive_data_acceptance]


def fuzz(strategy: Any, label: str, headers: dict[str, str], statuses: Counter[str]) -> None:
    """Call the app with up to MAX_EXAMPLES cases of ``strategy``; raises on the first failing
    check (after hypothesis has shrunk it)."""

    @given(case=strategy)
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    def run(case: Any) -> None:
        response = case.call_and_validate(headers=headers, excluded_checks=EXCLUDED)
        statuses[f"{label} {response.status_code}"] += 1

    run()


def test_no_server_errors_and_answers_match_the_document(
    app: FastAPI, admin_token: str, finished: FinishedJob
) -> None:
    schema = schemathesis.openapi.from_asgi("/api/v1/openapi.json", app)
    real = {
        "client_id": finished.client_ids[0],
        "job_id": finished.job.id,
        "agent_id": finished.client_ids[-1],
    }
    headers = bearer(admin_token)
    statuses: Counter[str] = Counter()
    failures: list[str] = []
    started = time.perf_counter()
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 22

    for op in operations:
        names = re.findall(r"\{(\w+)\}", op.path)
        variants: list[dict[str, Any]] = [{}]
        if names:
            variants.append({n: real[n] for n in names if n in real})
        for fixed in variants:
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                strategy = op.as_strategy(mode, path_parameters=fixed or None)

                try:
                    fuzz(strategy, op.label, headers, statuses)
                except Unsatisfiable:
                    # negative mode of an operation without parameters: nothing to break
                    assert mode == GenerationMode.NEGATIVE
                    assert not op.path.startswith("/api/v1/clients/")
                except Exception as exc:  # collect every operation's failure, then report all
                    # a flaky failure's own exceptions say what the first call did
                    inner = "; ".join(repr(e) for e in getattr(exc, "exceptions", ()))
                    where = f"{op.label} ({mode.value}, {fixed or 'random ids'})"
                    failures.append(f"{where}: {exc}" + (f" [{inner}]" if inner else ""))

    elapsed = time.perf_counter() - started
    cases = sum(statuses.values())
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "schemathesis.json").write_text(
        json.dumps(
            {
                "cases": cases,
                "seconds": round(elapsed, 2),
                "statuses": dict(sorted(statuses.items())),
            },
            indent=1,
        )
    )
    assert not failures, "\n\n".join(failures)
    assert all(int(key.rsplit(" ", 1)[1]) < 500 for key in statuses)
    # the real ids reached existing data: successful reads of a client, a job and a model
    for label in (
        "GET /api/v1/clients/{client_id}/budget 200",
        "GET /api/v1/jobs/{job_id}/rounds 200",
        "GET /api/v1/jobs/{job_id}/models/{version} 200",
    ):
        assert statuses[label] > 0, label
