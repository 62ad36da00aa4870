"""Recipes: the fields a job leaves unset, chosen on a public proxy before its first round
(docs/utility.md#recipes)."""

from dpfl.learning.recipes.search import (
    AS_WRITTEN,
    RecipeError,
    candidates,
    choose_recipe,
    proxy_job,
    run_candidate,
    search_recipe,
    search_trials,
    with_recipe,
)
from dpfl.learning.recipes.trial import TrialResult, run_trial

__all__ = [
    "AS_WRITTEN",
    "RecipeError",
    "TrialResult",
    "candidates",
    "choose_recipe",
    "proxy_job",
    "run_candidate",
    "run_trial",
    "search_recipe",
    "search_trials",
    "with_recipe",
]
