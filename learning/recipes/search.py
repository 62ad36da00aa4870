"""Choosing a job's recipe on a public proxy before its first round (docs/utility.md#recipes).

Each candidate (the job as written, then the algorithm's candidates or the job's own) sets only
fields the document left unset: what the user wrote is never changed. A candidate runs as the
job would (same privacy target and noise calibration, same sampling, same number of agents and
partition scheme) on the proxy: a labelled public data set, of which only the training split is
read, a stratified ``recipe.holdout`` of it held out as the validation split. The candidate
with the best validation accuracy wins (ties: the earlier one). No private record and no test
record is read: the proxy is refused when it is the agents' own data set (``JobSpec``), and the
``holdout`` view drops the proxy's test split before anything sees it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence

from pydantic import JsonValue

from dpfl.learning.algorithms.base import AlgorithmError
from dpfl.learning.algorithms.registry import get_algorithm
from dpfl.learning.errors import LearningError
from dpfl.learning.jobs import (
    ALTERNATIVE_FIELDS,
    RECIPE_FIELDS,
    JobSpec,
    RecipeChoice,
    RecipeTrial,
    job_to_dict,
    parse_job,
)
from dpfl.learning.recipes.trial import run_trial

__all__ = [
    "AS_WRITTEN",
    "RecipeError",
    "candidates",
    "choose_recipe",
    "proxy_job",
    "run_candidate",
    "search_recipe",
    "search_trials",
    "with_recipe",
]

#: The name of the candidate that changes nothing: the job as written, its defaults included.
AS_WRITTEN = "as-written"
#: The proxy's holdout split is drawn with this seed, whatever the job's own seeds.
HOLDOUT_SEED = 0

Progress = Callable[[RecipeTrial], None]


class RecipeError(LearningError):
    """A search that cannot run: no proxy, no candidate, or none ran on the proxy."""


def _free(overrides: Mapping[str, JsonValue], unset: Sequence[str]) -> dict[str, JsonValue]:
    """The part of ``overrides`` that sets only fields in ``unset`` (``model``, ``params.x``)."""
    out: dict[str, JsonValue] = {}
    for key, value in overrides.items():
        if key == "params" and isinstance(value, Mapping):
            params = {k: v for k, v in value.items() if f"params.{k}" in unset}
            if params:
                out["params"] = params
        elif key in RECIPE_FIELDS and key in unset:
            out[key] = value
    return out


def candidates(job: JobSpec) -> list[tuple[str, dict[str, JsonValue]]]:
    """The candidates a search of ``job`` runs, in order: the job as written, then each of the
    job's own (``recipe.candidates``) or else the algorithm's, reduced to the fields the
    document left unset; a candidate that changes nothing, or repeats an earlier one, is
    dropped."""
    unset = job.recipe.defaults or ()
    given = job.recipe.candidates
    if given is not None:
        named: list[tuple[str, Mapping[str, JsonValue]]] = [
            (f"candidate-{i + 1}", c) for i, c in enumerate(given)
        ]
    else:
        named = list(get_algorithm(job.algorithm).recipe_candidates.items())
    out: list[tuple[str, dict[str, JsonValue]]] = [(AS_WRITTEN, {})]
    for name, overrides in named:
        free = _free(overrides, unset)
        if free and all(free != seen for _, seen in out):
            out.append((name, free))
    return out


def _merge(base: Mapping[str, JsonValue], extra: Mapping[str, JsonValue]) -> dict[str, JsonValue]:
    out = dict(base)
    for key, value in extra.items():
        old = out.get(key)
        if isinstance(value, Mapping) and isinstance(old, Mapping) and key == "params":
            out[key] = {**old, **value}
        else:
            out[key] = value
    return out


def with_recipe(job: JobSpec, overrides: Mapping[str, JsonValue]) -> JobSpec:
    """``job`` with a candidate's fields set (its recipe record unchanged); a field that
    answers the same question as one the candidate sets (``local_epochs`` beside
    ``local_steps``) is cleared when the document left it to defaults.

    Raises:
        JobSpecError: the candidate makes the job invalid.
    """
    document = _merge(job_to_dict(job), overrides)
    params, unset = overrides.get("params"), job.recipe.defaults or ()
    merged = document.get("params")
    if isinstance(params, Mapping) and isinstance(merged, dict):
        for name in params:
            for other in ALTERNATIVE_FIELDS.get(name, ()):
                if f"params.{other}" in unset and other not in params:
                    merged[other] = None
    return parse_job(document)


def proxy_job(job: JobSpec, *, holdout: float | None = None) -> JobSpec:
    """``job`` moved onto its proxy's holdout view (its recipe cleared: the proxy job is run,
    never searched).

    Raises:
        RecipeError: the job names no proxy.
    """
    recipe = job.recipe
    if recipe.proxy is None:
        raise RecipeError("recipe.proxy: the job names no proxy data set to search on")
    fraction = recipe.holdout if holdout is None else holdout
    base, _, options = recipe.proxy.partition("?")
    view = (
        f"{base}?{options + '&' if options else ''}holdout={fraction:g}&holdout_seed={HOLDOUT_SEED}"
    )
    document = job_to_dict(job)
    data = document["data"]
    assert isinstance(data, dict)
    document["data"] = {**data, "dataset": view}
    document["recipe"] = {"defaults": list(recipe.defaults or ())}
    return parse_job(document)


def search_recipe(
    job: JobSpec,
    *,
    agents: int,
    data_dir: str | None = None,
    device: str = "cpu",
    progress: Progress | None = None,
) -> JobSpec:
    """``job`` with the recipe chosen on its proxy, and the choice recorded as
    ``recipe.chosen``; a job whose recipe was already chosen is returned as it is.

    The trials run one after the other here; a caller with workers of its own runs each
    :func:`search_trials` entry through :func:`run_candidate` wherever it likes, then hands the
    trials, in that order, to :func:`choose_recipe`: the choice is the same.

    Args:
        job: a job whose ``recipe`` names a proxy.
        agents: the job's population (``recipe.agents`` takes precedence).
        data_dir: the folder of the registered data sets (default ``$DPFL_DATA_DIR``).
        device: where the simulated agents train.
        progress: called with each trial as it ends.

    Raises:
        RecipeError: no candidate sets a field the job leaves unset, or none ran on the proxy
            (each trial's error is named).
    """
    if job.recipe.chosen is not None:
        return job
    trials: list[RecipeTrial] = []
    for name, overrides in search_trials(job):
        trial = run_candidate(job, name, overrides, agents=agents, data_dir=data_dir, device=device)
        trials.append(trial)
        if progress is not None:
            progress(trial)
    return choose_recipe(job, trials, agents=agents)


def search_trials(job: JobSpec) -> list[tuple[str, dict[str, JsonValue]]]:
    """The candidates a search of ``job`` runs (:func:`candidates`), refused when only the job
    as written is left.

    Raises:
        RecipeError: no candidate sets a field the job leaves unset.
    """
    found = candidates(job)
    if len(found) == 1:
        listed = "recipe.candidates" if job.recipe.candidates else f"{job.algorithm}'s candidates"
        raise RecipeError(
            f"nothing to search: none of {listed} sets a field the job leaves unset (a search "
            "never changes what the document states; give recipe.candidates)"
        )
    return found


def choose_recipe(job: JobSpec, trials: Sequence[RecipeTrial], *, agents: int) -> JobSpec:
    """``job`` with the best of ``trials`` (:func:`search_trials`' order; ties: the earlier)
    set and the choice recorded as ``recipe.chosen``.

    Raises:
        RecipeError: none of the trials ran on the proxy (each one's error is named).
    """
    ran = [t for t in trials if t.validation_accuracy is not None]
    if not ran:
        problems = "; ".join(f"{t.name}: {t.error}" for t in trials)
        raise RecipeError(f"no candidate recipe ran on the proxy {job.recipe.proxy}: {problems}")
    best = max(ran, key=lambda t: (t.validation_accuracy, -trials.index(t)))
    assert job.recipe.proxy is not None
    choice = RecipeChoice(
        proxy=job.recipe.proxy,
        agents=job.recipe.agents or agents,
        chosen=best.name,
        overrides=best.overrides,
        trials=tuple(trials),
    )
    chosen = with_recipe(job, best.overrides)
    document = job_to_dict(chosen)
    recipe = document["recipe"]
    assert isinstance(recipe, dict)
    document["recipe"] = {**recipe, "chosen": choice.model_dump(mode="json")}
    return parse_job(document)


def run_candidate(
    job: JobSpec,
    name: str,
    overrides: dict[str, JsonValue],
    *,
    agents: int,
    data_dir: str | None = None,
    device: str = "cpu",
) -> RecipeTrial:
    """One candidate of :func:`search_trials` on ``job``'s proxy, with the job's population
    (``recipe.agents`` taking precedence over ``agents``): ``recipe.repeats`` runs, each with its
    own seed (the first run's is the same for any ``repeats``); a candidate that cannot run
    there, or any of whose runs reports no accuracy, is a trial with an error."""
    agents = job.recipe.agents or agents
    runs: list[float] = []
    seconds = 0.0
    try:
        spec = proxy_job(with_recipe(job, overrides))
        for repeat in range(job.recipe.repeats):
            label = f"dpfl-recipe/{name}" + (f"/{repeat}" if repeat else "")
            seed = hashlib.sha256(label.encode()).digest()
            result = run_trial(spec, agents=agents, seed=seed, data_dir=data_dir, device=device)
            seconds += result.seconds
            if result.accuracy is None:
                return RecipeTrial(
                    name=name,
                    overrides=overrides,
                    seconds=round(seconds, 3),
                    error=f"run {repeat + 1} reported no accuracy on the validation split",
                )
            runs.append(result.accuracy)
    except (LearningError, AlgorithmError, ValueError) as exc:
        return RecipeTrial(name=name, overrides=overrides, error=str(exc)[:500])
    return RecipeTrial(
        name=name,
        overrides=overrides,
        validation_accuracy=sum(runs) / len(runs),
        runs=tuple(runs),
        seconds=round(seconds, 3),
    )
