"""``/api/v1/jobs/{job_id}/privacy-audits``: the empirical privacy audits of a job's run (admin
only), each a lower bound measured with canaries beside the ledger's ε of the same run."""

from __future__ import annotations

from fastapi import APIRouter

from dpfl.server.api import queries
from dpfl.server.api.deps import AdminDep, JobId, StoreDep
from dpfl.server.api.routes import error_responses
from dpfl.server.api.schemas import PrivacyAuditPublic

router = APIRouter(prefix="/jobs/{job_id}/privacy-audits", tags=["privacy audits"])


@router.get(
    "", response_model=list[PrivacyAuditPublic], responses=error_responses(401, 403, 404, 422)
)
def list_privacy_audits(job_id: JobId, _: AdminDep, store: StoreDep) -> list[PrivacyAuditPublic]:
    """The job's audits, oldest first (an empty list when it was never audited)."""
    return queries.job_privacy_audits(store, job_id)
