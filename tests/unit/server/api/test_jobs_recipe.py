"""A job that asks for a recipe search is stored with the recipe its coordinator chose on the
proxy, and REST shows the choice and the validation figures; a proxy outside the data roots
is refused at submission, naming the field, with nothing written."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from support.api import admin_settings, snapshot
from support.recipe_data import RecipeFiles, recipe_files

from dpfl.server.settings import Settings
from dpfl.server.store import Store

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def files(tmp_path: Path) -> RecipeFiles:
    return recipe_files(tmp_path / "data")


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    (tmp_path / "data").mkdir(exist_ok=True)
    return admin_settings().model_copy(update={"data_roots": [tmp_path / "data"]})


async def test_rest_submission_stores_and_shows_the_chosen_recipe(
    admin: httpx.AsyncClient, store: Store, files: RecipeFiles
) -> None:
    candidates = [{"params": {"learning_rate": 1e-4}}, {"params": {"learning_rate": 1.0}}]
    r = await admin.post("/api/v1/jobs", json=files.job(candidates=candidates, agents=4))
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    shown = (await admin.get(f"/api/v1/jobs/{job_id}")).json()["spec"]
    chosen = shown["recipe"]["chosen"]
    assert chosen["chosen"] == "candidate-2"
    assert [t["name"] for t in chosen["trials"]] == ["as-written", "candidate-1", "candidate-2"]
    assert all(0 <= t["validation_accuracy"] <= 1 for t in chosen["trials"])
    assert shown["params"]["learning_rate"] == 1.0
    assert "params.learning_rate" in shown["recipe"]["defaults"]
    assert store.get_job(job_id).spec == shown


async def test_a_proxy_outside_the_data_roots_is_refused_and_nothing_written(
    admin: httpx.AsyncClient, db_url: str, tmp_path: Path
) -> None:
    elsewhere = recipe_files(tmp_path)  # beside the data root, not under it
    inside = recipe_files(tmp_path / "data")
    document = inside.job()
    document["recipe"]["proxy"] = f"npz:{elsewhere.proxy}"
    before = snapshot(db_url)
    r = await admin.post("/api/v1/jobs", json=document)
    assert r.status_code == 422, r.text
    assert "recipe.proxy" in r.json()["detail"]
    assert snapshot(db_url) == before
