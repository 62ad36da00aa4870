"""``benchmarks/utility.py --quick`` end to end on two rows (digits, a few agents, two seeds):
one JSON line per row with the documented fields, table.md and curves.png written; and the rows'
job documents (full and quick) are valid jobs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from support.limits import hang_guard
from support.paths import ROOT
from support.scripts import load_script

from dpfl.learning.jobs import parse_job


def _utility() -> ModuleType:
    return load_script(ROOT / "benchmarks" / "utility.py", "utility", register=True)


def test_every_row_is_a_valid_job_full_and_quick() -> None:
    utility = _utility()
    rows = utility.rows()
    names = [r.name for r in rows]
    assert len(names) == len(set(names))
    for row in rows:
        for quick in (False, True):
            job = parse_job(row.document(quick=quick))
            assert job.privacy.delta == pytest.approx(row.delta)
            assert job.privacy.target_epsilon == row.epsilon
        for other in row.beats:
            assert other in names
    assert {r.agents for r in rows if "dp-fed-ls" in r.name} == {1000}


def test_judged_and_table() -> None:
    utility = _utility()
    base = {
        "series": "s",
        "algorithm": "a",
        "agents": 2,
        "seeds": [1, 2],
        "accuracies": [0.8, 0.9],
        "std": 0.07,
        "epsilon": 3.0,
        "epsilon_target": 4.0,
        "delta": 1e-5,
        "paper": None,
        "paper_note": "",
        "beats": [],
        "met": None,
        "stop_reasons": [None, None],
        "declined": {},
        "quick": True,
        "wall_s": 1.0,
    }
    low = utility.RowResult(row="low", mean=0.5, target=None, **base)
    hit = utility.RowResult(row="hit", mean=0.85, target=0.8, **{**base, "beats": ["low"]})
    over = utility.RowResult(row="over", mean=0.85, target=0.8, **{**base, "epsilon": 4.5})
    others = {"low": low, "hit": hit}
    assert utility.judged(low, others).met is None
    assert utility.judged(hit, others).met is True
    assert utility.judged(over, others).met is False  # ε above the row's ε
    higher = low.model_copy(update={"mean": 0.95})
    assert utility.judged(hit, {"low": higher}).met is False  # below a row it must beat
    text = utility.table([utility.judged(hit, others)])
    assert "| hit | 2 | 2 | 3 (≤ 4) |" in text
    assert "85.0 % ± 7.0" in text
    assert "| yes |" in text
    claim = low.model_copy(update={"epsilon": 15.5, "claimed_epsilon": 3.998})
    assert "| 15.5 (≤ 4); claim 4, not a bound |" in utility.table([claim])


def test_the_claim_row_is_the_epoch_row_under_the_papers_accounting() -> None:
    """Shown apart: same recipe, sum-dominating accounting, no target, and budgets and a policy
    that let its agents pay their share's local-DP charge."""
    utility = _utility()
    rows = {r.name: r for r in utility.rows()}
    epoch, claim = rows["fmnist-dp-fedsgd-1epoch"], rows["fmnist-dp-fedsgd-1epoch-claim"]
    assert claim.document()["params"] == epoch.document()["params"]
    assert epoch.document()["privacy"]["accounting"] == "provable"
    assert claim.document()["privacy"]["accounting"] == "sum-dominating"
    assert (epoch.target, claim.target) == (0.82, None)
    assert claim.agent_policy == {"min_noise_multiplier": 0.0}


@pytest.mark.slow
def test_quick_run_writes_lines_table_and_curves(tmp_path: Path) -> None:
    """Two worker processes run the two rows' four seeds; the lines come in row order."""
    rows = "mnist-iid-dp-fedavg-poisson-eps7,mnist-iid-dp-fed-ls-poisson-eps7"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "utility.py"),
            "--quick",
            "--seeds",
            "2",
            "--rows",
            rows,
            "--workers",
            "2",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=hang_guard(60),  # every row's quick variant
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(x) for x in done.stdout.strip().splitlines()]
    assert [x["row"] for x in lines] == rows.split(",")
    for x in lines:
        assert x["quick"] is True
        assert x["seeds"] == [1, 2]
        assert len(x["accuracies"]) == 2
        assert all(0 <= a <= 1 for a in x["accuracies"])
        assert x["mean"] == pytest.approx(sum(x["accuracies"]) / 2)
        assert x["epsilon"] <= x["epsilon_target"]
        assert x["delta"] == pytest.approx(1000**-1.1)
        assert len(x["metrics"]) == 2
        assert all("survivors" in m for m in x["metrics"])
    fedls = lines[1]
    assert fedls["paper"] == 0.851
    assert fedls["target"] == 0.86
    assert isinstance(fedls["met"], bool)
    table = (tmp_path / "table.md").read_text(encoding="utf-8")
    assert table.count("\n") == 4
    assert "mnist-iid-dp-fed-ls-poisson-eps7" in table
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "targets.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_replot_writes_the_reports_of_stored_lines(tmp_path: Path) -> None:
    """The recipe rows' published lines: the table again, and the targets plot, whose bar for a
    row judged against a rival is the rival's mean less the margin."""
    utility = _utility()
    stored = ROOT / "docs" / "results" / "utility-recipes.jsonl"
    utility.replot(stored, tmp_path)
    table = (tmp_path / "table.md").read_text(encoding="utf-8")
    assert "| fmnist-dp-helmet | 100 | 3 |" in table
    for name in ("curves.png", "targets.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = [utility.RowResult.model_validate_json(x) for x in stored.read_text().splitlines()]
    means = {r.row: r.mean for r in lines if r.mean is not None}
    (plain,) = [r for r in lines if r.row == "mnist-plain-dp-fedavg"]
    assert plain.target is None
    assert utility._bar(plain, means) == pytest.approx(means["mnist-noniid-dp-fedavg"] - 0.02)


def test_replot_names_a_line_that_is_not_a_result(tmp_path: Path) -> None:
    bad = tmp_path / "lines.jsonl"
    stored = (ROOT / "docs" / "results" / "utility-recipes.jsonl").read_text().splitlines()
    bad.write_text(stored[0] + "\n" + '{"row": "x"}\n', encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "utility.py"), "--replot", str(bad),
         "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert f"{bad}:2: not a row's result line" in done.stderr
    assert not (tmp_path / "out").exists()


def test_seed_outcomes_combine_into_the_row_line() -> None:
    utility = _utility()
    row = next(r for r in utility.rows() if r.name == "mnist-iid-dp-fed-ls-poisson-eps7")
    outcomes = [
        utility.SeedOutcome(
            accuracy=a, epsilon=e, stop_reason=None, declined=d, metrics={"m": a}, wall_s=w
        )
        for a, e, d, w in [
            (0.8, 6.5, {"max_epsilon_total": 2}, 1.5),
            (0.9, 6.9, {"max_epsilon_total": 1, "other": 1}, 2.5),
        ]
    ]
    line = utility.combine(row, [1, 2], outcomes, quick=False)
    assert line.claimed_epsilon is None
    assert line.accuracies == [0.8, 0.9]
    assert line.mean == pytest.approx(0.85)
    assert line.std == pytest.approx(0.0707, abs=1e-4)
    assert line.epsilon == 6.9
    assert line.declined == {"max_epsilon_total": 3, "other": 1}
    assert line.wall_s == 4.0
    assert line.agents == 1000
    assert line.metrics == [{"m": 0.8}, {"m": 0.9}]
    failed = outcomes[0].model_copy(update={"accuracy": None, "stop_reason": "error: boom"})
    partial = utility.combine(row, [1, 2], [failed, outcomes[1]], quick=False)
    assert partial.mean is None
    assert partial.stop_reasons == ["error: boom", None]
    claims = [
        o.model_copy(update={"claimed_epsilon": c})
        for o, c in zip(outcomes, (3.9, 4.0), strict=True)
    ]
    assert utility.combine(row, [1, 2], claims, quick=False).claimed_epsilon == 4.0


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--rows", "nope"], "unknown rows ['nope']"), (["--workers", "0"], "--workers must be >= 1")],
)
def test_bad_arguments_are_refused(tmp_path: Path, args: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "utility.py"), *args, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert message in done.stderr


def test_the_longest_runs_start_first_and_every_run_once() -> None:
    utility = _utility()
    table = [r for r in utility.rows() if not r.extra]
    order = utility.schedule(table, [1, 2, 3])
    assert sorted(order) == [(i, s) for i in range(len(table)) for s in (1, 2, 3)]
    costs = [table[i].cost for i, _ in order]
    assert costs == sorted(costs, reverse=True)
    assert table[order[0][0]].name == "fmnist-noniid-pate-fl"  # a PATE-FL search and its seeds
    assert order[:3] == [(order[0][0], 1), (order[0][0], 2), (order[0][0], 3)]  # ties: in order


def test_workers_get_a_core_each_only_when_there_are_enough() -> None:
    utility = _utility()
    cores = sorted(os.sched_getaffinity(0))
    plan = utility.core_plan(len(cores))
    assert plan == cores
    assert utility.core_plan(1) == cores[:1]
    assert utility.core_plan(len(cores) + 1) == [None] * (len(cores) + 1)


def test_the_default_run_is_the_table_and_list_marks_the_extra_rows() -> None:
    utility = _utility()
    extra = {r.name for r in utility.rows() if r.extra}
    assert extra == {
        "mnist-noniid-dp-fedavg-cnn",
        "usps-dp-fedavg",
        "usps-pate-fl",
        "usps-pate-fl-da",
    }
    assert len([r for r in utility.rows() if not r.extra]) == 23 + 5  # the papers', the recipes'
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "utility.py"), "--list"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    listed = done.stdout.splitlines()
    assert "usps-pate-fl  (extra)" in listed
    assert "mnist-dp-helmet" in listed


def test_each_dp_fed_ls_row_and_its_baseline_differ_only_in_the_smoothing() -> None:
    """The comparison rows are an ablation: DP-FedAvg runs DP-Fed-LS's validated recipe (rates,
    clip, sampling) without the smoothing (``dp-fedavg`` under Poisson sampling, σ_LS = 0 under
    uniform sampling)."""
    utility = _utility()
    rows = {r.name: r for r in utility.rows()}
    fedls = [r for r in rows.values() if r.name.startswith("mnist-iid-dp-fed-ls-")]
    assert len(fedls) == 8

    def recipe(params: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in params.items() if k not in ("sigma_ls", "client_sampling")}

    for row in fedls:
        (baseline,) = row.beats
        mine, theirs = row.document()["params"], rows[baseline].document()["params"]
        assert mine["sigma_ls"] == utility.FEDLS_SIGMA_LS > 0
        assert theirs.get("sigma_ls", 0.0) == 0.0
        assert theirs.get("client_sampling", "poisson") == mine["client_sampling"]
        assert recipe(mine) == recipe(theirs)
        server = mine["server_optimizer"]["learning_rate"]
        assert server == utility.FEDLS_SERVER_RATE[mine["client_sampling"]]


def test_a_row_within_a_margin_of_another_is_met() -> None:
    utility = _utility()
    base = {
        "series": "s",
        "algorithm": "a",
        "agents": 2,
        "seeds": [1],
        "accuracies": [0.9],
        "std": None,
        "epsilon": 3.0,
        "epsilon_target": 4.0,
        "delta": 1e-5,
        "paper": None,
        "paper_note": "",
        "met": None,
        "stop_reasons": [None],
        "declined": {},
        "quick": False,
        "wall_s": 1.0,
        "target": None,
    }
    documented = utility.RowResult(row="doc", mean=0.925, beats=[], **base)
    near = utility.RowResult(row="plain", mean=0.91, beats=["doc"], margin=0.02, **base)
    far = near.model_copy(update={"mean": 0.90})
    assert utility.judged(near, {"doc": documented}).met is True
    assert utility.judged(far, {"doc": documented}).met is False
    assert "≥ doc − 2 points" in utility.table([near])


@pytest.mark.slow
def test_a_row_s_recipe_is_searched_once_and_kept(tmp_path: Path) -> None:
    """``resolve`` runs the row's search and keeps it by the job's hash: a second resolve reads
    it back without searching (the proxy is gone by then); each seed then runs the choice."""
    from support.recipe_data import recipe_files

    utility = _utility()
    files = recipe_files(tmp_path)
    candidates = [{"params": {"learning_rate": 1e-4}}, {"params": {"learning_rate": 1.0}}]
    row = utility.Row(
        name="searched",
        series="s",
        job=files.job(candidates=candidates),
        agents=4,
        epsilon=8.0,
        delta=1e-5,
    )
    cache = tmp_path / "recipes"
    first = utility.resolve(row, quick=False, data_dir=None, cache=cache)
    chosen = first.document["recipe"]["chosen"]
    assert chosen["chosen"] == "candidate-2"
    assert first.search_s is not None
    assert first.search_s > 0
    assert len(list(cache.iterdir())) == 1
    files.proxy.unlink()
    again = utility.resolve(row, quick=False, data_dir=None, cache=cache)
    assert again == first
    line = utility.combine(row, [1], [], quick=False, resolved=again)
    assert line.recipe == chosen


def test_the_recipe_rows_search_on_another_data_set() -> None:
    utility = _utility()
    rows = [r for r in utility.rows() if r.series == "recipes"]
    assert len(rows) == 5
    for row in rows:
        job = parse_job(row.document())
        if job.recipe.search:
            assert job.recipe.proxy is not None
            assert job.recipe.proxy.split("?")[0] != job.data.dataset.split("?")[0]
        assert not parse_job(row.document(quick=True)).recipe.search
    plain = parse_job(next(r for r in rows if r.name == "mnist-plain-dp-fedavg").document())
    assert plain.params.features == "gabor"  # type: ignore[attr-defined]  # the image defaults


@pytest.mark.slow
def test_pooled_searches_choose_as_one_search_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With workers, each candidate is a run of its own in the pool; the rows' choices are the
    ones a search in one process makes, each kept by its job's hash, and ``search_s`` is the
    trials' run times summed."""
    from support.recipe_data import recipe_files

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # the workers import it by name
    utility = _utility()
    files = recipe_files(tmp_path)
    candidates = [{"params": {"learning_rate": 1e-4}}, {"params": {"learning_rate": 1.0}}]
    rows = [
        utility.Row(
            name=name,
            series="s",
            job=files.job(candidates=candidates),
            agents=4,
            epsilon=8.0,
            delta=1e-5,
            # the job's noise is tiny, for a clear choice: no budget or policy of a real row
            budget_epsilon=1e6,
            agent_max_epsilon=1e6,
            agent_policy={"min_noise_multiplier": 0.0},
        )
        for name in ("first", "second")
    ]
    alone = utility.resolve(rows[0], quick=False, data_dir=None, cache=None)
    expected = alone.document["recipe"]["chosen"]
    cache = tmp_path / "recipes"
    lines = list(utility.run_rows(rows, [1], quick=False, data_dir=None, workers=2, cache=cache))
    assert [line.row for line in lines] == ["first", "second"]
    for line in lines:
        assert line.recipe["chosen"] == expected["chosen"] == "candidate-2"
        assert [t["name"] for t in line.recipe["trials"]] == [t["name"] for t in expected["trials"]]
        assert line.search_s == pytest.approx(
            sum(t["seconds"] for t in line.recipe["trials"]), abs=0.01
        )
        assert line.accuracies[0] is not None
    assert len(list(cache.iterdir())) == 2


def _running(pid: int) -> bool:
    """``pid`` exists and is not a zombie waiting for a parent to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_worker_ends_when_the_benchmark_is_killed(tmp_path: Path) -> None:
    """A benchmark killed mid-run (SIGKILL: nothing of it runs again) takes its pool's workers
    with it, even one in the middle of a long run."""
    import signal
    import time

    script = tmp_path / "pool.py"
    script.write_text(
        "import multiprocessing, os, time\n"
        "from concurrent.futures import ProcessPoolExecutor\n"
        "import utility\n"
        "if __name__ == '__main__':\n"
        "    context = multiprocessing.get_context('spawn')\n"
        "    cores = context.Queue()\n"
        "    cores.put(None)\n"
        "    pool = ProcessPoolExecutor(1, mp_context=context, initializer=utility._worker_init,\n"
        "                               initargs=(1, cores, os.getpid()))\n"
        "    print(pool.submit(os.getpid).result(), flush=True)\n"
        "    pool.submit(time.sleep, 300)\n"
        "    time.sleep(300)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "benchmarks")}
    parent = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env
    )
    worker = None
    try:
        assert parent.stdout is not None
        worker = int(parent.stdout.readline())
        time.sleep(1.0)  # the long run has started in the worker
        assert _running(worker)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 15
        while _running(worker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _running(worker), "the worker outlived the killed benchmark"
    finally:
        parent.kill()
        if worker is not None and _running(worker):
            os.kill(worker, signal.SIGKILL)
