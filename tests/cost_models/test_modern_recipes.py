"""The published recipes of bench/data/modern_recipes.json load, pin valid plans and simulate."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.modern_recipes import decoder_split, load_recipes, recipe_plan
from cost_models.simulate import simulate
from planner.validate import validate_plan

RECIPES = load_recipes()
REFERENCES = (Path(__file__).parents[2] / "docs" / "references.md").read_text()


def test_the_table_covers_the_issue_models_with_a_source_each() -> None:
    assert {r.model for r in RECIPES} >= {"llama3-8b", "llama3-70b", "llama3-405b", "mixtral-8x7b", "qwen3-30b-a3b",
                                          "deepseek-v3"}
    for r in RECIPES:
        assert r.source and f"[{r.source_key}]" in REFERENCES
        assert r.num_gpus == r.data * r.tensor * r.pipeline * r.context
        if r.measured:
            assert f"[{r.measured['source_key']}]" in REFERENCES and r.measured["precision"] in ("bf16", "fp8")


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.name for r in RECIPES])
def test_each_recipe_is_a_valid_plan_that_simulates(recipe) -> None:  # type: ignore[no-untyped-def]
    plan = validate_plan(recipe_plan(recipe))
    d = plan.degrees
    assert (d.tensor, d.pipeline, d.virtual, d.context, d.expert) == (
        recipe.tensor, recipe.pipeline, recipe.virtual, recipe.context, recipe.expert)
    assert plan.num_microbatches * plan.microbatch_size * d.data == recipe.global_batch_size
    result = simulate(plan, include_events=False, include_bubbles=False)
    assert result.iteration_time_s > 0 and len(result.stages) == recipe.pipeline


def test_uneven_ends_follow_the_llama3_layout() -> None:
    """126 layers on 16 stages: one layer fewer on the first and the last (Llama 3 Sec. 3.3.2)."""
    assert decoder_split(126, 16) == [7] + [8] * 14 + [7]
    assert decoder_split(80, 20) == [4] * 20
