"""Prometheus metrics of one coordinator: rounds, stage latency, connected agents, privacy spent.

Each :class:`Metrics` owns its ``CollectorRegistry``, so two coordinators in one process never
share a counter. The orchestrator reports round events; privacy figures are read from the store
at scrape time, so ``/metrics`` never disagrees with the ledger, and a failing database only
leaves those gauges out (``dpfl_store_up`` 0). The series are listed in docs/api.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from dpfl.server.errors import ServerError
from dpfl.server.store import STAGES, JobStatus, Round, RoundStatus, Store

__all__ = ["CONTENT_TYPE", "STAGE_BUCKETS", "Metrics", "MetricsError"]

#: The ``Content-Type`` of :meth:`Metrics.render`: the classic Prometheus text format, which every
#: Prometheus version parses (the series names here are all legacy-valid, so nothing is escaped).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: Histogram buckets in seconds: loopback stages take milliseconds, training takes minutes.
STAGE_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
)
#: Stage label values accepted besides the round stages: the whole round.
_EXTRA_STAGES = ("round",)


class MetricsError(ServerError, ValueError):
    """A metric update with an impossible value (a negative duration, an unknown stage)."""

    code = "invalid_metric"


class _StoreCollector(Collector):
    """The privacy and job gauges, computed from the store at every scrape."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def describe(self) -> Iterator[Metric]:
        # declared without touching the store (registration must not need a database)
        yield from self._families()

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, ...]:
        return (
            GaugeMetricFamily(
                "dpfl_client_epsilon_max",
                "Largest privacy loss epsilon spent by any client, each at its budget's delta.",
            ),
            GaugeMetricFamily("dpfl_clients", "Enrolled clients (agents)."),
            GaugeMetricFamily(
                "dpfl_clients_over_budget", "Clients whose epsilon spent exceeds their budget."
            ),
            GaugeMetricFamily("dpfl_jobs", "Jobs per status.", labels=["status"]),
            GaugeMetricFamily(
                "dpfl_clients_approximate",
                "Clients whose epsilon adds up approximate ledger entries (discrete Gaussian "
                "noise charged as the continuous Gaussian): not a proven bound.",
            ),
        )

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("dpfl_store_up", "1 when this scrape could read the store.")
        try:
            budgets = self._store.list_client_budgets()
            jobs = self._store.list_jobs()
        except ServerError:
            up.add_metric([], 0.0)
            yield up
            return
        eps_max, clients, over, per_status, approximate = self._families()
        spent = [b.epsilon for b in budgets]
        # +inf is a legitimate ε (an unaccountable charge) and Prometheus represents it exactly
        eps_max.add_metric([], max(spent, default=0.0))
        clients.add_metric([], float(len(budgets)))
        over.add_metric([], float(sum(b.exceeded for b in budgets)))
        approximate.add_metric([], float(sum(b.approximate for b in budgets)))
        for status in JobStatus:
            per_status.add_metric([status.value], float(sum(j.status == status for j in jobs)))
        up.add_metric([], 1.0)
        yield from (eps_max, clients, over, per_status, approximate, up)


class Metrics:
    """The metrics of one coordinator process.

    Args:
        store: where the privacy and job gauges are read from at scrape time (None: leave them
            out, e.g. for an agent-side or store-less test).
        registry: the registry to register into (default: a new one owned by this object).
    """

    def __init__(self, *, store: Store | None = None, registry: CollectorRegistry | None = None):
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self._completed = Counter(
            "dpfl_rounds_completed",
            "Rounds whose aggregate was decoded and applied.",
            ["job_id"],
            registry=self.registry,
        )
        self._aborted = Counter(
            "dpfl_rounds_aborted",
            "Rounds given up (before or after the ledger commit).",
            ["job_id"],
            registry=self.registry,
        )
        self._latency = Histogram(
            "dpfl_stage_latency_seconds",
            "Duration of each stage of a round.",
            ["stage"],
            buckets=STAGE_BUCKETS,
            registry=self.registry,
        )
        self._agents = Gauge(
            "dpfl_agents_connected",
            "Agents with an open Connect stream.",
            registry=self.registry,
        )
        if store is not None:
            self.registry.register(_StoreCollector(store))

    # the orchestrator's calls -----------------------------------------------------------------
    def round_finished(self, job_id: str, completed: bool) -> None:
        """Count one finished round of ``job_id``: completed (True) or aborted (False)."""
        if not isinstance(job_id, str) or not job_id:
            raise MetricsError(f"job_id must be a non-empty string, got {job_id!r}")
        (self._completed if completed else self._aborted).labels(job_id=job_id).inc()

    def stage_latency(self, stage: str, seconds: float) -> None:
        """Record how long one stage of one round took.

        Raises:
            MetricsError: an unknown stage (label values are bounded to the round's stages and
                ``"round"``) or a negative or non-finite duration.
        """
        if stage not in STAGES and stage not in _EXTRA_STAGES:
            raise MetricsError(
                f"unknown stage {stage!r} (expected one of {', '.join(STAGES + _EXTRA_STAGES)})"
            )
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise MetricsError(f"seconds must be a number, got {seconds!r}")
        if not math.isfinite(seconds) or seconds < 0:
            raise MetricsError(f"seconds must be finite and >= 0, got {seconds!r}")
        self._latency.labels(stage=stage).observe(float(seconds))

    def agents_connected(self, n: int) -> None:
        """Set the number of agents currently connected."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise MetricsError(f"the number of connected agents must be an int >= 0, got {n!r}")
        self._agents.set(n)

    def observe_round(self, rnd: Round) -> None:
        """Record a round from its stored record: every stage duration, and its outcome when it
        is completed or aborted (use this *or* the individual calls for a round, not both)."""
        for stage, seconds in rnd.stage_seconds.items():
            self.stage_latency(stage, seconds)
        if rnd.status == RoundStatus.COMPLETED:
            self.round_finished(rnd.job_id, True)
        elif rnd.status == RoundStatus.ABORTED:
            self.round_finished(rnd.job_id, False)

    # exposition -------------------------------------------------------------------------------
    def render(self) -> bytes:
        """Every series in Prometheus text format (blocking: reads the store)."""
        return generate_latest(self.registry)
