"""Recipes: the fields a job leaves unset, chosen on a public proxy before its first round
(docs/utility.md#recipes)."""

from dpfl.learning.recipes.search import (
    AS_WRITTEN,
    RecipeError,
    candidates,
    proxy_job,
    search_recipe,
    with_recipe,
)
from dpfl.learning.recipes.trial import TrialResult, run_trial

__all__ = [
    "AS_WRITTEN",
    "RecipeError",
    "TrialResult",
    "candidates",
    "proxy_job",
    "run_trial",
    "search_recipe",
    "with_recipe",
]
