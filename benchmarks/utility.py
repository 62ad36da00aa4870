"""Privacy–utility benchmark: the papers' settings run through ``dpfl.simulate``, over seeds.

Prints ONE JSON line per row (accuracy mean, std and per seed; ε, the largest over clients of the
coordinator's ledger; δ; the paper's figure; the target and whether it was met) and writes
``table.md``, ``curves.png`` (accuracy against ε) and ``targets.png`` (each row's seeds against its
target) to ``--out``; ``--replot LINES`` writes them again from a file of such lines, running
nothing. ``--quick`` runs a tiny digits version of each row (a smoke test, not a result).

Usage: ``python benchmarks/utility.py [--rows NAME,...] [--seeds K] [--out DIR] [--quick]
[--workers W]``.
Rows, settings and what is not expressible yet: docs/utility.md#the-benchmark.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import queue
import statistics
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

if TYPE_CHECKING:
    from dpfl.learning.jobs import JobSpec, RecipeTrial

ROWS_DIR = Path(__file__).resolve().parent / "utility"

#: The paper's DP-Fed-LS setting: δ = N^-1.1 for N = 1000 agents.
FEDLS_DELTA = 1000.0**-1.1


class Row(BaseModel):
    """One benchmark row: a job, how many agents run it, and what it is compared with.

    ``job`` is a job document or the name of a YAML file under benchmarks/utility/.
    ``quick`` is merged (recursively) into the job for ``--quick`` (with the digits data set,
    ``quick_agents`` agents and at most two rounds). ``beats``: names of rows whose mean
    accuracy this row must reach too (the target is then also relative); ``margin``: how far
    below a ``beats`` row's mean this row's may stay (within 2 points: 0.02). ``extra``: a row
    outside the papers' settings (another setting, a comparison), run when named or with ``--all``.
    ``cost``: a rough run time of one seed on the development machine (s), only for scheduling:
    ``--workers`` starts the longest runs first so that none is left alone at the end.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]*$")
    series: str
    job: dict[str, Any] | str
    agents: int = Field(ge=1)
    epsilon: float = Field(gt=0)
    delta: float = Field(gt=0, lt=1)
    target: float | None = Field(default=None, ge=0, le=1)
    paper: float | None = Field(default=None, ge=0, le=1)
    paper_note: str = ""
    beats: tuple[str, ...] = ()
    margin: float = Field(default=0.0, ge=0, le=1)
    budget_epsilon: float | None = Field(default=None, gt=0)
    agent_max_epsilon: float | None = Field(default=None, gt=0)
    agent_policy: dict[str, Any] | None = None
    quick: dict[str, Any] = Field(default_factory=dict)
    quick_agents: int = Field(default=4, ge=1)
    note: str = ""
    extra: bool = False
    cost: float = Field(default=60.0, gt=0)

    def document(self, *, quick: bool = False) -> dict[str, Any]:
        """The job document (read from benchmarks/utility/ when ``job`` names a file)."""
        base = self.job
        if isinstance(base, str):
            loaded = yaml.safe_load((ROWS_DIR / base).read_text(encoding="utf-8"))
            if not isinstance(loaded, dict):
                raise ValueError(f"benchmarks/utility/{base} is not a job mapping")
            base = loaded
        if not quick:
            return dict(base)
        small = merge(base, {"name": f"{self.name}-quick", "data": {"dataset": "digits"}})
        small["rounds"] = min(int(small.get("rounds", 1)), 2)
        if small.get("model") == "cnn":
            small["model"] = "logreg"
        return merge(small, self.quick)


def merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` merged in, mappings recursively."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


# -- the rows --------------------------------------------------------------------------------------


def _mnist_noniid(algorithm: str, params: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """MNIST, 100 agents on shards of 6 classes (~600 records each), agent level, δ 1e-3, ε 4.3.
    The paper's split: 30 % of the MNIST test set is the public unlabeled pool, the other 70 %
    the test set (both rows evaluate on the same 7000 images)."""
    return {
        "name": f"mnist-noniid-{algorithm}",
        "algorithm": algorithm,
        "data": {
            "dataset": "mnist",
            "partition": {"scheme": "shards", "classes_per_agent": 6},
            "public": {"source": "test", "fraction": 0.3},
        },
        "model": "cnn",
        "privacy": {"unit": "agent", "delta": 1e-3, "target_epsilon": 4.3, "noise": "skellam"},
        "params": params,
        **extra,
    }


def _noniid_row(
    name: str,
    series: str,
    job: dict[str, Any],
    *,
    target: float | None,
    paper_note: str,
    quick_params: dict[str, Any],
    cost: float,
    extra: bool = False,
) -> Row:
    """A row of the non-IID setting (:func:`_mnist_noniid`): 100 agents, ε 4.3, δ 1e-3, the
    paper's figure of its algorithm. DP-FedAvg's agents get budgets for all 20 rounds: the
    un-amplified cost of 20 agent-level rounds exceeds an agent's default local cap (10 per job),
    so sampled agents would decline late rounds."""
    fedavg = job["algorithm"] == "dp-fedavg"
    return Row(
        name=name,
        series=series,
        job=job,
        agents=100,
        epsilon=4.3,
        delta=1e-3,
        target=target,
        paper=0.842 if fedavg else 0.951,
        paper_note=paper_note,
        budget_epsilon=1000.0 if fedavg else None,
        agent_max_epsilon=1000.0 if fedavg else None,
        quick={
            "data": {"public": {"fraction": 0.5}, "partition": {"classes_per_agent": 3}},
            "params": quick_params,
        },
        cost=cost,
        extra=extra,
    )


#: The DP-Fed-LS rows' recipe, chosen on a validation split for DP-Fed-LS
#: (benchmarks/fedls_validation.py, docs/algorithms.md#measured-recipes-mnist): local rate 0.03,
#: σ_LS = 3, and FedAvgM (momentum 0.9) at server rate 2 under Poisson sampling, 1 under uniform
#: sampling (whose replace-one charge doubles the noise).
FEDLS_LOCAL_RATE = 0.03
FEDLS_SIGMA_LS = 3.0
FEDLS_SERVER_RATE = {"poisson": 2.0, "uniform": 1.0}


def _fedls(
    algorithm: str, epsilon: float, sampling: str, *, sigma_ls: float = FEDLS_SIGMA_LS
) -> dict[str, Any]:
    """The DP-Fed-LS paper's MNIST setting: logistic regression, 1000 IID agents (60 records
    each), Poisson rate 0.05 (or a uniform sample of 50), 30 rounds, clip 0.3, 5 local epochs of
    batch 10, the local rate decayed by 0.99 a round; the rates and σ_LS of the validated recipe
    above. A row's DP-FedAvg baseline is the same recipe without the smoothing: ``dp-fedavg``
    under Poisson sampling, DP-Fed-LS with σ_LS = 0 under uniform sampling."""
    params: dict[str, Any] = {
        "features": "identity",  # the paper's logistic regression on pixels
        "clip": 0.3,
        "sampling_rate": 0.05,
        "local_epochs": 5,
        "batch_size": 10,
        "learning_rate": FEDLS_LOCAL_RATE,
        "learning_rate_decay": 0.99,
        "server_optimizer": {
            "kind": "momentum",
            "learning_rate": FEDLS_SERVER_RATE[sampling],
            "momentum": 0.9,
        },
    }
    if algorithm == "dp-fed-ls":
        params["client_sampling"] = sampling
        params["sigma_ls"] = sigma_ls
    return {
        "name": f"mnist-iid-{algorithm}-{sampling}-eps{epsilon:g}",
        "algorithm": algorithm,
        "data": {"dataset": "mnist", "partition": {"scheme": "iid"}},
        "model": "logreg",
        "rounds": 30,
        "privacy": {
            "unit": "agent",
            "delta": FEDLS_DELTA,
            "target_epsilon": epsilon,
            "noise": "skellam",
        },
        "params": params,
    }


def _fedls_rows() -> list[Row]:
    quick = {"params": {"sampling_rate": 0.5, "local_epochs": 1, "learning_rate": 0.5}}
    rows = []
    for epsilon in (6.0, 7.0, 8.0, 9.0):
        for sampling in ("poisson", "uniform"):
            # DP-FedAvg has Poisson client sampling only; its uniform baseline is σ_LS = 0
            baseline = f"mnist-iid-dp-fedavg-{sampling}-eps{epsilon:g}"
            job = (
                _fedls("dp-fedavg", epsilon, sampling)
                if sampling == "poisson"
                else _fedls("dp-fed-ls", epsilon, sampling, sigma_ls=0.0)
            )
            job["name"] = baseline
            rows.append(
                Row(
                    name=baseline,
                    series=f"DP-FedAvg ({sampling})",
                    job=job,
                    agents=1000,
                    epsilon=epsilon,
                    delta=FEDLS_DELTA,
                    paper_note="DP-Fed-LS paper, DP-FedAvg baseline",
                    budget_epsilon=1000.0,
                    agent_max_epsilon=1000.0,
                    quick=quick,
                    cost=50,
                )
            )
            rows.append(
                Row(
                    name=f"mnist-iid-dp-fed-ls-{sampling}-eps{epsilon:g}",
                    series=f"DP-Fed-LS ({sampling})",
                    job=_fedls("dp-fed-ls", epsilon, sampling),
                    agents=1000,
                    epsilon=epsilon,
                    delta=FEDLS_DELTA,
                    target={6.0: 0.84, 7.0: 0.86}.get(epsilon),
                    paper=0.851 if epsilon == 7.0 else None,
                    paper_note="85.1–85.3 % at ε = 7" if epsilon == 7.0 else "",
                    beats=(baseline,),
                    budget_epsilon=1000.0,
                    agent_max_epsilon=1000.0,
                    quick=quick,
                    cost=50,
                )
            )
    return rows


def _fmnist_fedsgd(
    name: str,
    *,
    local_steps: int,
    sampling_rate: float,
    rate: float,
    server_momentum: float | None = None,
    claim: bool = False,
) -> Row:
    """Fashion-MNIST CNN, 10 IID agents (6000 records each), 20 rounds, record level, Skellam,
    ε 4 at δ 1e-5, provable accounting; ``local_steps`` = 1/``sampling_rate`` is one local epoch.
    The rate and server momentum of the epoch row were chosen on a validation split
    (docs/utility.md); the 1-step row takes the same rate and batch. ``claim``: the multi-step
    paper's accounting (``sum-dominating``: the noise split over the agents and calibrated on the
    sum), shown apart; its ε 4 is a labelled claim, and the ledger charges each agent's share as
    local DP, so the row's clients get budgets for that (docs/algorithms.md#dp-fedsgd)."""
    params: dict[str, Any] = {
        "clip": 1.0,
        "local_steps": local_steps,
        "batch_sampling_rate": sampling_rate,
        "learning_rate": rate,
    }
    if server_momentum is not None:
        params["server_optimizer"] = {
            "kind": "momentum",
            "learning_rate": 1.0,
            "momentum": server_momentum,
        }
    return Row(
        name=name,
        series=f"DP-FedSGD ({'1 step' if local_steps == 1 else '1 epoch'})"
        + (", the paper's claim" if claim else ""),
        job={
            "name": name,
            "algorithm": "dp-fedsgd",
            "data": {"dataset": "fashion-mnist", "partition": {"scheme": "iid"}},
            "model": "cnn",
            "rounds": 20,
            "privacy": {
                "unit": "record",
                "delta": 1e-5,
                "target_epsilon": 4.0,
                "noise": "skellam",
                "accounting": "sum-dominating" if claim else "provable",
            },
            "params": params,
        },
        agents=10,
        epsilon=4.0,
        delta=1e-5,
        target=None if claim else 0.82,
        budget_epsilon=1e6 if claim else None,
        agent_max_epsilon=1e6 if claim else None,
        # each agent's share of the split noise is below the default policy's floor of 0.5
        agent_policy={"min_noise_multiplier": 0.0} if claim else None,
        quick={"params": {"local_steps": min(local_steps, 3), "batch_sampling_rate": 0.1}},
        cost=40 * local_steps,
    )


def _usps(name: str, algorithm: str, params: dict[str, Any]) -> dict[str, Any]:
    """Issue 13's cross-domain setting: 100 IID MNIST agents; the public pool is 3000 USPS images
    fitted into MNIST's 20-pixel digit box, which the agents may read; the test set is the other
    6298 USPS images; agent level, δ 1e-3, ε 3.6."""
    return {
        "name": name,
        "algorithm": algorithm,
        "data": {
            "dataset": "mnist",
            "partition": {"scheme": "iid"},
            "public": {"source": "usps", "count": 3000, "box": 20},
        },
        "model": "cnn",
        "rounds": 2 if algorithm == "pate-fl" else 20,
        "privacy": {"unit": "agent", "delta": 1e-3, "target_epsilon": 3.6, "noise": "skellam"},
        "params": params,
    }


def _usps_rows() -> list[Row]:
    pate = {
        "queries": 100,
        "query_selection": "kmeans",
        "teacher_epochs": 20,
        "teacher_augment_shift": 1.5,
        "teacher_schedule": "cosine",
        "teacher_validation_fraction": 0.1,
        # chosen on the agents' held-out MNIST records (no USPS label is read): 8000 steps with
        # min_margin 0.1 beat 2000 steps for plain and DANN teachers (docs/utility.md)
        "student": {"method": "consistency", "steps": 8000, "min_margin": 0.1},
    }
    quick = {
        "data": {"public": {"source": "test", "count": 60, "box": None}},
        "params": {"teacher_epochs": 3, "queries": 30, "student": {"steps": 50, "min_margin": 0.0}},
    }
    fedavg = {
        "clip": 1.0,
        "sampling_rate": 0.3,
        "local_steps": 20,
        "batch_size": 32,
        "learning_rate": 0.3,
        "server_optimizer": {"kind": "adam", "learning_rate": 0.02},
    }
    # the cross-domain setting, outside the papers' table: run with --all or by name
    common: dict[str, Any] = {"agents": 100, "epsilon": 3.6, "delta": 1e-3, "extra": True}
    return [
        Row(
            name="usps-dp-fedavg",
            series="DP-FedAvg (MNIST→USPS)",
            job=_usps("usps-dp-fedavg", "dp-fedavg", fedavg),
            paper=0.763,
            paper_note="PATE-FL paper, MNIST+SVHN agents, ε 3.7",
            # as the non-IID DP-FedAvg row: 20 agent-level rounds un-amplified exceed an agent's
            # default local cap, so sampled agents would decline late rounds
            budget_epsilon=1000.0,
            agent_max_epsilon=1000.0,
            quick={
                "data": quick["data"],
                "params": {"sampling_rate": 1.0, "local_steps": 5, "learning_rate": 0.5},
            },
            cost=200,
            **common,
        ),
        Row(
            name="usps-pate-fl",
            series="PATE-FL (MNIST→USPS)",
            job=_usps("usps-pate-fl", "pate-fl", pate),
            paper=0.838,
            paper_note="PATE-FL paper, MNIST+SVHN agents",
            beats=("usps-dp-fedavg",),
            quick=quick,
            cost=700,
            **common,
        ),
        Row(
            name="usps-pate-fl-da",
            series="PATE-FL+DA (MNIST→USPS)",
            job=_usps(
                "usps-pate-fl-da",
                "pate-fl",
                {**pate, "teacher_domain_adaptation": {"method": "dann", "weight": 1.0}},
            ),
            target=0.925,
            paper=0.925,
            paper_note="PATE-FL paper, MNIST+SVHN agents, ε 2.8; target also ≥ PATE-FL + 5 points",
            beats=("usps-pate-fl",),
            quick={**quick, "model": "mlp"},  # DANN aligns hidden features: not logreg
            cost=800,
            **common,
        ),
    ]


#: A recipe row's quick run: digits, and no search (its proxy would be the agents' own set).
_NO_SEARCH: dict[str, Any] = {"recipe": {"search": False, "proxy": None}}


def _searched(
    name: str,
    algorithm: str,
    data: dict[str, Any],
    privacy: dict[str, Any],
    proxy: str | None,
    *,
    params: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A job that states only its data, algorithm and privacy (and ``params`` the setting
    fixes), and chooses the rest on ``proxy`` (None: the defaults alone)."""
    job: dict[str, Any] = {"name": name, "algorithm": algorithm, "data": data, "privacy": privacy}
    if params:
        job["params"] = params
    if proxy is not None:
        job["recipe"] = {"search": True, "proxy": proxy}
    return job


def _recipe_rows() -> list[Row]:
    """Data nobody tuned for (docs/utility.md#recipes-on-data-nobody-tuned-for): a plain MNIST
    job on the defaults, and Fashion-MNIST and 2-class MNIST jobs whose recipes a search chooses
    on the other data set (each row's proxy), never on the row's own."""
    agent = {"unit": "agent", "delta": 1e-5, "target_epsilon": 4.0, "noise": "skellam"}
    shards3 = {"scheme": "shards", "classes_per_agent": 3}
    pool = {"source": "test", "fraction": 0.3}
    budgets = {"budget_epsilon": 1000.0, "agent_max_epsilon": 1000.0}
    return [
        Row(
            name="mnist-plain-dp-fedavg",
            series="recipes",
            job=_searched(
                "mnist-plain-dp-fedavg",
                "dp-fedavg",
                {"dataset": "mnist", "partition": {"scheme": "shards", "classes_per_agent": 6}},
                {"target_epsilon": 4.0},
                None,
            ),
            agents=100,
            epsilon=4.0,
            delta=1e-5,
            paper_note="the documented recipe's row within 2 points",
            beats=("mnist-noniid-dp-fedavg",),
            margin=0.02,
            cost=60,
        ),
        Row(
            name="fmnist-noniid-dp-fedavg",
            series="recipes",
            job=_searched(
                "fmnist-noniid-dp-fedavg",
                "dp-fedavg",
                {"dataset": "fashion-mnist", "partition": shards3, "public": pool},
                agent,
                "mnist",
            ),
            agents=100,
            epsilon=4.0,
            delta=1e-5,
            target=0.80,
            quick=_NO_SEARCH,
            cost=600,
            **budgets,
        ),
        Row(
            name="fmnist-dp-helmet",
            series="recipes",
            job=_searched(
                "fmnist-dp-helmet",
                "dp-helmet",
                {
                    "dataset": "fashion-mnist",
                    "partition": {"scheme": "iid"},
                    "public_fraction": 0.05,
                },
                {"unit": "record", "delta": 1e-5, "target_epsilon": 1.0, "noise": "skellam"},
                "mnist",
            ),
            agents=100,
            epsilon=1.0,
            delta=1e-5,
            target=0.82,
            quick=_NO_SEARCH,
            cost=600,
        ),
        Row(
            name="mnist-noniid2-dp-fedavg",
            series="recipes",
            job=_searched(
                "mnist-noniid2-dp-fedavg",
                "dp-fedavg",
                {
                    "dataset": "mnist",
                    "partition": {"scheme": "shards", "classes_per_agent": 2},
                    "public": pool,
                },
                {"unit": "agent", "delta": 1e-3, "target_epsilon": 2.0, "noise": "skellam"},
                "fashion-mnist",
            ),
            agents=100,
            epsilon=2.0,
            delta=1e-3,
            target=0.88,
            quick=_NO_SEARCH,
            cost=600,
            **budgets,
        ),
        Row(
            name="fmnist-noniid-pate-fl",
            series="recipes",
            job=_searched(
                "fmnist-noniid-pate-fl",
                "pate-fl",
                {"dataset": "fashion-mnist", "partition": shards3, "public": pool},
                agent,
                "mnist",
            ),
            agents=100,
            epsilon=4.0,
            delta=1e-5,
            target=0.85,
            quick={**_NO_SEARCH, "params": {"queries": 40, "teacher_epochs": 3}},
            cost=3000,
        ),
    ]


def rows() -> list[Row]:
    """Every row of the issue, in table order."""
    # the MNIST recipe, chosen on a validation split (docs/algorithms.md#semi-supervised-student):
    # 8000 student steps on pseudo-labels whose noisy margin reaches 0.1 of the agents
    from dpfl.learning.algorithms.pate_fl import MNIST_TEACHERS

    teachers = dict(MNIST_TEACHERS)
    noniid = [
        _noniid_row(
            "mnist-noniid-pate-fl",
            "PATE-FL",
            _mnist_noniid("pate-fl", teachers, rounds=2),
            target=0.951,
            paper_note="PATE-FL paper, 100 agents, agent level",
            quick_params={
                "queries": 40,
                "teacher_epochs": 3,
                "student": {"method": "consistency", "steps": 50},
            },
            cost=700,
        ),
        _noniid_row(
            "mnist-noniid-dp-fedavg",
            "DP-FedAvg (non-IID)",
            _mnist_noniid(
                "dp-fedavg",
                {
                    # logreg on a public-kmeans map fitted on the public pool (d = 650)
                    "features": "public-kmeans",
                    "public_kmeans": {"centroids": 128, "dim": 64, "norm": 3.0},
                    "clip": 1.0,
                    "sampling_rate": 0.3,
                    "local_epochs": 1,
                    "batch_size": 32,
                    "learning_rate": 1.0,
                },
                rounds=20,
                model="logreg",
            ),
            target=0.842,
            paper_note="PATE-FL paper's DP-FedAvg baseline",
            quick_params={
                "sampling_rate": 1.0,
                "public_kmeans": {"centroids": 16, "patch": 3, "stride": 1, "dim": 16},
            },
            cost=100,
        ),
        _noniid_row(
            "mnist-noniid-dp-fedavg-cnn",
            "DP-FedAvg (non-IID, cnn on pixels)",
            _mnist_noniid(
                "dp-fedavg",
                {
                    "clip": 1.0,
                    "sampling_rate": 0.3,
                    "local_steps": 20,
                    "batch_size": 32,
                    "learning_rate": 0.3,
                    "server_optimizer": {"kind": "adam", "learning_rate": 0.02},
                },
                rounds=20,
            ),
            target=None,
            paper_note="the former recipe (cnn on pixels), kept for comparison",
            quick_params={"sampling_rate": 1.0, "local_steps": 5, "learning_rate": 0.5},
            cost=200,
            extra=True,
        ),
    ]
    others = [
        _fmnist_fedsgd("fmnist-dp-fedsgd-1step", local_steps=1, sampling_rate=0.1, rate=8.0),
        _fmnist_fedsgd(
            "fmnist-dp-fedsgd-1epoch",
            local_steps=10,
            sampling_rate=0.1,
            rate=8.0,
            server_momentum=0.5,
        ),
        _fmnist_fedsgd(
            "fmnist-dp-fedsgd-1epoch-claim",
            local_steps=10,
            sampling_rate=0.1,
            rate=8.0,
            server_momentum=0.5,
            claim=True,
        ),
        Row(
            name="mnist-dp-helmet",
            series="DP-Helmet",
            job="mnist-dp-helmet.yaml",
            agents=100,
            epsilon=1.0,
            delta=1e-5,
            target=0.90,
            quick={
                "data": {"public_fraction": 0.2},
                "params": {
                    "epochs": 3,
                    "public_kmeans": {"centroids": 16, "patch": 3, "stride": 1, "dim": 16},
                },
            },
            cost=75,
        ),
        Row(
            name="mnist-private-knn-fl",
            series="Private-kNN-FL",
            job={
                "name": "mnist-private-knn-fl",
                "algorithm": "private-knn-fl",
                "data": {
                    "dataset": "mnist",
                    "partition": {"scheme": "iid"},
                    "public_fraction": 0.05,
                },
                "model": "cnn",
                "rounds": 2,
                "privacy": {
                    "unit": "record",
                    "delta": 1e-5,
                    "target_epsilon": 4.0,
                    "noise": "skellam",
                },
                "params": {
                    "queries": 300,
                    "k": 3,
                    "features": "public-pca",
                    "public_pca": {"dim": 30},
                    "query_selection": "kmeans",
                    "student": {"method": "consistency", "steps": 2000},
                },
            },
            agents=100,
            epsilon=4.0,
            delta=1e-5,
            target=0.93,
            quick={
                "data": {"public_fraction": 0.2},
                "params": {
                    "queries": 40,
                    "k": 5,
                    "public_pca": {"dim": 10},
                    "student": {"method": "consistency", "steps": 50},
                },
            },
            cost=180,
        ),
    ]
    return [*noniid, *_fedls_rows(), *others, *_usps_rows(), *_recipe_rows()]


# -- running ---------------------------------------------------------------------------------------


class RowResult(BaseModel):
    """One row over its seeds: the JSON line."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    row: str
    series: str
    algorithm: str
    agents: int
    seeds: list[int]
    accuracies: list[float | None]
    mean: float | None
    std: float | None
    epsilon: float | None
    # a labelled claim the job reports beside its ledger (DP-FedSGD's sum-dominating figure):
    # never a bound, never charged
    claimed_epsilon: float | None = None
    epsilon_target: float
    delta: float
    paper: float | None
    paper_note: str
    target: float | None
    beats: list[str]
    margin: float = 0.0
    met: bool | None
    stop_reasons: list[str | None]
    declined: dict[str, int]
    quick: bool
    wall_s: float
    # each seed's last-round metrics (e.g. PATE-FL's pseudo_label_accuracy, student_labels)
    metrics: list[dict[str, float]] = Field(default_factory=list)
    # a row whose job searches its recipe: the choice (trials and validation figures) and the
    # search's time, spent once for all seeds (docs/utility.md#recipes)
    recipe: dict[str, Any] | None = None
    search_s: float | None = None


class SeedOutcome(BaseModel):
    """One seed of one row: what :func:`combine` needs from its ``dpfl.simulate`` result."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    accuracy: float | None
    epsilon: float
    claimed_epsilon: float | None = None
    stop_reason: str | None
    declined: dict[str, int]
    metrics: dict[str, float]
    wall_s: float


class Resolved(BaseModel):
    """A row's job document with its recipe chosen (the document itself when it searches
    none), and the search's time."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    document: dict[str, Any]
    search_s: float | None = None


def _known(
    row: Row, *, quick: bool, cache: Path | None
) -> tuple[JobSpec, Path | None, Resolved | None]:
    """``row``'s parsed job, the file keeping its search in ``cache`` (by the job's hash), and
    its resolution when no search is needed: the job searches nothing, or its search is kept."""
    import hashlib

    from dpfl.learning.jobs import job_to_dict, parse_job

    document = row.document(quick=quick)
    job = parse_job(document)
    if not job.recipe.search:
        return job, None, Resolved(document=document)
    digest = hashlib.sha256(json.dumps(job_to_dict(job), sort_keys=True).encode()).hexdigest()
    stored = None if cache is None else cache / f"{row.name}-{digest[:16]}.json"
    if stored is not None and stored.is_file():
        return job, stored, Resolved.model_validate_json(stored.read_text(encoding="utf-8"))
    return job, stored, None


def _kept(resolved: Resolved, stored: Path | None) -> Resolved:
    if stored is not None:
        stored.parent.mkdir(parents=True, exist_ok=True)
        stored.write_text(resolved.model_dump_json(), encoding="utf-8")
    return resolved


def resolve(row: Row, *, quick: bool, data_dir: str | None, cache: Path | None) -> Resolved:
    """``row``'s job with its recipe chosen once for all seeds (``dpfl.learning.recipes``, as
    its coordinator would at submission; the seeds then run the stored choice). ``cache``: a
    folder keeping each search by its job's hash, so a rerun does not search again."""
    from dpfl.learning.jobs import job_to_dict
    from dpfl.learning.recipes import search_recipe

    job, stored, known = _known(row, quick=quick, cache=cache)
    if known is not None:
        return known
    started = time.monotonic()
    agents = row.quick_agents if quick else row.agents
    chosen = search_recipe(job, agents=agents, data_dir=data_dir)
    return _kept(
        Resolved(document=job_to_dict(chosen), search_s=time.monotonic() - started), stored
    )


def run_seed(
    row: Row,
    seed: int,
    *,
    quick: bool,
    data_dir: str | None,
    document: dict[str, Any] | None = None,
) -> SeedOutcome:
    """Run ``row`` (its ``document`` when given: the job with its recipe chosen) once through
    ``dpfl.simulate`` with ``seed``."""
    import dpfl

    started = time.monotonic()
    result = dpfl.simulate(
        document if document is not None else row.document(quick=quick),
        row.quick_agents if quick else row.agents,
        seed=seed,
        budget_epsilon=row.budget_epsilon,
        agent_max_epsilon_per_job=row.agent_max_epsilon,
        agent_max_epsilon_total=row.agent_max_epsilon,
        agent_policy=row.agent_policy,
        data_dir=data_dir,
    )
    return SeedOutcome(
        accuracy=result.accuracy,
        epsilon=max(result.epsilon.values(), default=0.0),
        claimed_epsilon=result.claimed_epsilon,
        stop_reason=None if result.stop is None else f"{result.stop.kind}: {result.stop.message}",
        declined=dict(result.invitations.declined_by_rule),
        metrics={k: float(v) for k, v in result.metrics.items()},
        wall_s=time.monotonic() - started,
    )


def _choice(resolved: Resolved | None) -> dict[str, Any] | None:
    recipe = None if resolved is None else resolved.document.get("recipe")
    return None if not isinstance(recipe, dict) else recipe.get("chosen")


def combine(
    row: Row,
    seeds: Sequence[int],
    outcomes: Sequence[SeedOutcome],
    *,
    quick: bool,
    resolved: Resolved | None = None,
) -> RowResult:
    """The row's line from its seeds' outcomes (``wall_s``: their run times summed)."""
    accuracies = [o.accuracy for o in outcomes]
    declined: dict[str, int] = {}
    for outcome in outcomes:
        for rule, count in outcome.declined.items():
            declined[rule] = declined.get(rule, 0) + count
    measured = [a for a in accuracies if a is not None]
    complete = len(measured) == len(accuracies)
    claims = [o.claimed_epsilon for o in outcomes if o.claimed_epsilon is not None]
    return RowResult(
        row=row.name,
        series=row.series,
        algorithm=str(row.document(quick=quick)["algorithm"]),
        agents=row.quick_agents if quick else row.agents,
        seeds=list(seeds),
        accuracies=accuracies,
        mean=statistics.fmean(measured) if complete and measured else None,
        std=statistics.stdev(measured) if complete and len(measured) > 1 else None,
        epsilon=max((o.epsilon for o in outcomes), default=None),
        claimed_epsilon=max(claims) if claims else None,
        epsilon_target=row.epsilon,
        delta=row.delta,
        paper=row.paper,
        paper_note=row.paper_note,
        target=row.target,
        beats=list(row.beats),
        margin=row.margin,
        met=None,
        stop_reasons=[o.stop_reason for o in outcomes],
        declined=declined,
        quick=quick,
        wall_s=round(sum(o.wall_s for o in outcomes), 3),
        metrics=[o.metrics for o in outcomes],
        recipe=_choice(resolved),
        search_s=None
        if resolved is None or resolved.search_s is None
        else round(resolved.search_s, 3),
    )


def run_row(
    row: Row, seeds: Sequence[int], *, quick: bool, data_dir: str | None, cache: Path | None = None
) -> RowResult:
    """Run ``row`` once per seed through ``dpfl.simulate``, one seed after the other, after its
    recipe search if it has one."""
    resolved = resolve(row, quick=quick, data_dir=data_dir, cache=cache)
    outcomes = [
        run_seed(row, seed, quick=quick, data_dir=data_dir, document=resolved.document)
        for seed in seeds
    ]
    return combine(row, seeds, outcomes, quick=quick, resolved=resolved)


def _worker_init(threads: int, cores: Any, parent: int) -> None:
    """Cap each worker's BLAS and torch threads before torch loads, and pin it to a core of its
    own taken from ``cores`` (a queue) when there is one: the workers then never share a core,
    and each run's agent host sizes its training pool to that one core. The worker ends itself
    when ``parent`` (the benchmark) is gone: a killed benchmark leaves no run behind it."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[name] = str(threads)
    threading.Thread(target=_end_with, args=(parent,), daemon=True).start()
    try:
        core = cores.get(timeout=10)
    except queue.Empty:  # a replacement worker: the cores were handed out
        core = None
    if core is not None:
        os.sched_setaffinity(0, {core})
    import torch

    torch.set_num_threads(threads)


def _end_with(parent: int, every_s: float = 1.0) -> None:
    """Exit this process once its parent is no longer ``parent`` (it died: the process was
    handed to another); a run in progress stops with it."""
    while os.getppid() == parent:
        time.sleep(every_s)
    os._exit(1)


def core_plan(workers: int) -> list[int | None]:
    """One core per worker while there are enough cores to go round, else no pinning."""
    try:
        available = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return [None] * workers
    if workers > len(available):
        return [None] * workers
    return list(available[:workers])


def schedule(chosen: Sequence[Row], seeds: Sequence[int]) -> list[tuple[int, int]]:
    """The (row index, seed) runs, longest first by the rows' ``cost`` (ties in table order):
    the last runs to start are the short ones, so the workers finish close together."""
    runs = [(i, seed) for i in range(len(chosen)) for seed in seeds]
    return sorted(runs, key=lambda run: -chosen[run[0]].cost)


def run_rows(
    chosen: Sequence[Row],
    seeds: Sequence[int],
    *,
    quick: bool,
    data_dir: str | None,
    workers: int,
    cache: Path | None = None,
) -> Iterator[RowResult]:
    """Every row's line, in ``chosen``'s order. ``workers`` > 1 runs the rows' recipe-search
    trials (each candidate a run of its own) and then the (row, seed) runs in that many
    processes (one thread each, each on its own core when there are enough): the trials first,
    the rows without a search longest first (:func:`schedule`), and a searching row's seeds as
    soon as its trials are done. Each line is yielded once its row's seeds are done and the
    rows before it were yielded."""
    if workers == 1:
        for row in chosen:
            yield run_row(row, seeds, quick=quick, data_dir=data_dir, cache=cache)
        return
    context = multiprocessing.get_context("spawn")
    cores = context.Queue()
    for core in core_plan(workers):
        cores.put(core)
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_init,
                             initargs=(1, cores, os.getpid())) as pool:  # fmt: skip
        yield from _pooled(pool, chosen, seeds, quick=quick, data_dir=data_dir, cache=cache)


def _pooled(
    pool: ProcessPoolExecutor,
    chosen: Sequence[Row],
    seeds: Sequence[int],
    *,
    quick: bool,
    data_dir: str | None,
    cache: Path | None,
) -> Iterator[RowResult]:
    """:func:`run_rows` on ``pool``: each search's trials are chosen from in this process, in
    their search order (the choice :func:`resolve` would make), and its ``search_s`` is the
    trials' run times summed."""
    from dpfl.learning.jobs import job_to_dict
    from dpfl.learning.recipes import choose_recipe, run_candidate, search_trials

    resolved: dict[int, Resolved] = {}
    searches: dict[int, tuple[JobSpec, Path | None, list[Future[RecipeTrial]]]] = {}
    for i, row in enumerate(chosen):
        job, stored, known = _known(row, quick=quick, cache=cache)
        if known is not None:
            resolved[i] = known
            continue
        agents = row.quick_agents if quick else row.agents
        trials = [
            pool.submit(run_candidate, job, name, overrides, agents=agents, data_dir=data_dir)
            for name, overrides in search_trials(job)
        ]
        searches[i] = (job, stored, trials)
    futures: dict[tuple[int, int], Future[SeedOutcome]] = {}

    def submit(i: int) -> None:
        for seed in seeds:
            futures[(i, seed)] = pool.submit(
                run_seed, chosen[i], seed, quick=quick, data_dir=data_dir,
                document=resolved[i].document,
            )  # fmt: skip

    for i, seed in schedule(chosen, seeds):
        if i in resolved and seed == seeds[0]:
            submit(i)

    def settle() -> None:
        for i, (job, stored, trials) in list(searches.items()):
            if all(t.done() for t in trials):
                ran = [t.result() for t in trials]
                agents = chosen[i].quick_agents if quick else chosen[i].agents
                document = job_to_dict(choose_recipe(job, ran, agents=agents))
                spent = sum(t.seconds for t in ran)
                resolved[i] = _kept(Resolved(document=document, search_s=spent), stored)
                del searches[i]
                submit(i)

    for i, row in enumerate(chosen):
        while True:
            settle()
            needed = [futures[(i, seed)] for seed in seeds] if i in resolved else []
            if needed and all(f.done() for f in needed):
                break
            running = [t for _, _, trials in searches.values() for t in trials]
            wait([f for f in needed + running if not f.done()], return_when=FIRST_COMPLETED)
        outcomes = [futures[(i, seed)].result() for seed in seeds]
        yield combine(row, seeds, outcomes, quick=quick, resolved=resolved[i])


def judged(result: RowResult, others: Mapping[str, RowResult]) -> RowResult:
    """``met``: ε within the row's ε, the mean at or above the target and at or above every row
    of ``beats`` that ran, less the row's ``margin``; None when the row has nothing to meet (no
    target and no ``beats``)."""
    if result.target is None and not result.beats:
        return result
    if result.mean is None or result.epsilon is None:
        return result.model_copy(update={"met": False})
    ok = result.epsilon <= result.epsilon_target * (1 + 1e-9)
    if result.target is not None:
        ok = ok and result.mean >= result.target
    for name in result.beats:
        other = others.get(name)
        if other is not None and other.mean is not None:
            ok = ok and result.mean >= other.mean - result.margin
    return result.model_copy(update={"met": ok})


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


def table(results: Sequence[RowResult]) -> str:
    """The Markdown table of docs/utility.md#results."""
    lines = [
        "| row | agents | seeds | ε (max over clients) | δ | accuracy (mean ± std) | paper "
        "| target | met |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        acc = _pct(r.mean) + ("" if r.std is None else f" ± {100 * r.std:.1f}")
        eps = "—" if r.epsilon is None else f"{r.epsilon:.3g} (≤ {r.epsilon_target:g})"
        if r.claimed_epsilon is not None:
            eps = f"{eps}; claim {r.claimed_epsilon:.3g}, not a bound"
        paper = _pct(r.paper) + (f" ({r.paper_note})" if r.paper_note else "")
        within = "" if not r.margin else f" − {100 * r.margin:g} points"
        target = _pct(r.target) + ("" if not r.beats else f", ≥ {', '.join(r.beats)}{within}")
        met = {None: "—", True: "yes", False: "no"}[r.met]
        lines.append(
            f"| {r.row} | {r.agents} | {len(r.seeds)} | {eps} | {r.delta:.3g} | {acc} | {paper} "
            f"| {target} | {met} |"
        )
    return "\n".join(lines) + "\n"


def curves(results: Sequence[RowResult], path: Path) -> None:
    """Accuracy (mean ± std) against the reached ε, one curve per series."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    series: dict[str, list[RowResult]] = {}
    for r in results:
        if r.mean is not None and r.epsilon is not None:
            series.setdefault(r.series, []).append(r)
    for name, points in sorted(series.items()):
        points.sort(key=lambda r: r.epsilon_target)
        ax.errorbar(
            [p.epsilon or 0.0 for p in points],
            [100 * (p.mean or 0.0) for p in points],
            yerr=[100 * (p.std or 0.0) for p in points],
            marker="o",
            capsize=3,
            label=name,
        )
    ax.set_xlabel("ε (largest over clients, coordinator's ledger)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(
        "privacy–utility" + (" (--quick smoke run)" if results and results[0].quick else "")
    )
    if series:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _bar(r: RowResult, means: Mapping[str, float]) -> float | None:
    """The accuracy ``r`` had to reach: its target, or its rivals' best mean less its margin."""
    if r.target is not None:
        return r.target
    rivals = [means[b] for b in r.beats if b in means]
    return max(rivals) - r.margin if rivals else None


def targets(results: Sequence[RowResult], path: Path) -> None:
    """Each row with a target or rivals: its seeds' accuracies and mean against what it had to
    reach."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    means = {r.row: r.mean for r in results if r.mean is not None}
    aimed = [(r, bar) for r in results if (bar := _bar(r, means)) is not None]
    fig, ax = plt.subplots(figsize=(7.5, 0.6 * len(aimed) + 1.8))
    for i, (r, bar) in enumerate(aimed):
        seeds = [100 * a for a in r.accuracies if a is not None]
        ax.scatter(seeds, [i] * len(seeds), s=14, color="tab:blue", alpha=0.6,
                   label="seed" if i == 0 else None)  # fmt: skip
        if r.mean is not None:
            ax.scatter([100 * r.mean], [i], s=60, marker="D", zorder=3,
                       color="tab:green" if r.met else "tab:red")  # fmt: skip
        ax.plot([100 * bar] * 2, [i - 0.35, i + 0.35], color="black", linewidth=2,
                label="target" if i == 0 else None)  # fmt: skip
    ax.set_yticks(range(len(aimed)), [f"{r.row} (ε {r.epsilon_target:g})" for r, _ in aimed])
    ax.set_xlabel("test accuracy (%); mean: green diamond met, red missed")
    ax.grid(axis="x", alpha=0.3)
    if aimed:
        ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_reports(final: Sequence[RowResult], out: Path) -> None:
    """``table.md``, ``curves.png`` and ``targets.png`` of the rows' lines under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(table(final), encoding="utf-8")
    curves(final, out / "curves.png")
    targets(final, out / "targets.png")


def replot(lines: Path, out: Path) -> None:
    """The reports of a results file of JSON lines (one :class:`RowResult` each), run again;
    a row measured twice keeps its last line.

    Raises:
        ValueError: a line that is not a row's result, naming its number.
    """
    results: dict[str, RowResult] = {}
    for number, text in enumerate(lines.read_text(encoding="utf-8").splitlines(), start=1):
        if not text.strip():
            continue
        try:
            line = RowResult.model_validate_json(text)
        except ValidationError as exc:
            raise ValueError(f"{lines}:{number}: not a row's result line: {exc}") from exc
        results[line.row] = line
    write_reports(list(results.values()), out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--rows", default=None, help="comma-separated row names (default: the table's rows)"
    )
    parser.add_argument(
        "--all", action="store_true", help="every row, the extra ones too (see --list)"
    )
    parser.add_argument("--seeds", type=int, default=3, help="seeds per row (default 3)")
    parser.add_argument("--out", type=Path, default=Path("build/utility"), help="results folder")
    parser.add_argument("--quick", action="store_true", help="tiny digits smoke run of the rows")
    parser.add_argument("--data-dir", default=None, help="default: $DPFL_DATA_DIR")
    parser.add_argument("--list", action="store_true", help="print the row names and exit")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="processes running the rows' seeds side by side, one thread each (default 1: "
        "one run after the other in this process)",
    )
    parser.add_argument(
        "--replot",
        type=Path,
        default=None,
        help="write table.md, curves.png and targets.png of this file of result lines to --out, "
        "running nothing",
    )
    args = parser.parse_args(argv)
    if args.replot is not None:
        try:
            replot(args.replot, args.out)
        except (OSError, ValueError) as exc:
            parser.error(str(exc))
        return 0
    every = rows()
    if args.list:
        for row in every:
            print(row.name + ("  (extra)" if row.extra else ""))
        return 0
    if args.seeds < 1:
        parser.error("--seeds must be >= 1")
    if args.workers < 1:
        parser.error("--workers must be >= 1")
    chosen = every if args.all else [r for r in every if not r.extra]
    if args.rows is not None:
        names = [n.strip() for n in args.rows.split(",") if n.strip()]
        known = {r.name: r for r in every}
        unknown = [n for n in names if n not in known]
        if unknown or not names:
            parser.error(f"unknown rows {unknown} (see --list)" if unknown else "no rows named")
        chosen = [known[n] for n in names]
    seeds = list(range(1, args.seeds + 1))
    results: dict[str, RowResult] = {}
    # each row's line as soon as it ran (a baseline comes before its rival)
    cache = args.out / "recipes"
    for line in run_rows(
        chosen, seeds, quick=args.quick, data_dir=args.data_dir, workers=args.workers, cache=cache
    ):
        results[line.row] = judged(line, results)
        print(json.dumps(results[line.row].model_dump(mode="json")), flush=True)
    final = [results[r.name] for r in chosen]
    write_reports(final, args.out)
    failed = [r.row for r in final if r.mean is None or not math.isfinite(r.mean)]
    if failed:
        print(f"rows without an accuracy on every seed: {', '.join(failed)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
