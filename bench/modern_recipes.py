"""Published parallelism recipes of today's models (bench/data/modern_recipes.json) as paraplan plans.

``load_recipes()`` reads the table; ``recipe_plan(recipe)`` builds the plan that pins the recipe's
degrees (t, p, v, c, e, data = GPUs / (t p c)), microbatch, batch, sequence, ZeRO stage and
recompute on an H100 cluster of the recipe's size, with the layer profile of the per-operation
cost model. Decoder layers are spread over the p x v virtual stages as Megatron's uneven layout
would (``parallelism.balanced_end_stage_layers``: the embedding and the head count as one layer
each; an even split when the layers divide). bench/modern.py simulates these plans; a test checks
that each passes the plan validator and simulates.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cost_models.hardware import cluster_preset
from cost_models.models import model_preset
from cost_models.parallelism import balanced_end_stage_layers
from cost_models.transformer import transformer_profile
from planner.schema import KNOWN_RECOMPUTE, V_SCHEDULES, Chunk, Degrees, Plan, Stage, recompute_modules_of

RECIPES_PATH = Path(__file__).with_name("data") / "modern_recipes.json"
DEVICES_PER_NODE = 8


@dataclass(frozen=True, slots=True)
class Recipe:
    name: str
    model: str
    num_gpus: int
    seq_length: int
    tensor: int
    pipeline: int
    virtual: int
    context: int
    expert: int
    microbatch_size: int
    global_batch_size: int
    zero_stage: int
    recompute: str
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    overlap_moe_alltoall: bool
    source: str
    source_key: str
    measured: dict[str, Any] | None
    schedule: str | None = None
    """None: 1F1B, interleaved when v > 1; or a schedule name (``dualpipe-v``: V placement)."""

    @property
    def data(self) -> int:
        return self.num_gpus // (self.tensor * self.pipeline * self.context)


def load_recipes(path: Path = RECIPES_PATH) -> list[Recipe]:
    """Every recipe of the table, in its order."""
    rows = json.loads(path.read_text())["recipes"]
    return [Recipe(**row) for row in rows]


def decoder_split(num_layers: int, num_virtual_stages: int) -> list[int]:
    """Decoder layers per virtual stage: even when they divide, else lighter ends (Megatron's
    --decoder-first/last-pipeline-num-layers) with the embedding and head as one layer each."""
    if num_layers % num_virtual_stages == 0:
        return [num_layers // num_virtual_stages] * num_virtual_stages
    return balanced_end_stage_layers(num_layers, num_virtual_stages, embedding_layers=1.0, head_layers=1.0)


def recipe_plan(recipe: Recipe, *, global_batch_size: int | None = None) -> Plan:
    """The plan of a recipe (module docstring); ``global_batch_size`` overrides the recipe's."""
    cfg = model_preset(recipe.model).model_copy(update={"seq_length": recipe.seq_length})
    nodes = max(1, recipe.num_gpus // DEVICES_PER_NODE)
    cluster = cluster_preset(f"h100:{nodes}x{min(DEVICES_PER_NODE, recipe.num_gpus)}")
    assert cluster.device is not None
    t, p, v, b = recipe.tensor, recipe.pipeline, recipe.virtual, recipe.microbatch_size
    modules = recompute_modules_of(recipe.recompute)
    sets = [modules] if modules and recipe.recompute not in KNOWN_RECOMPUTE else False  # a Megatron-Core module set
    profile = transformer_profile(cfg, device=cluster.device, microbatch_size=b, tensor_parallel=t,
                                  intra_node_bytes_per_s=cluster.intra_node_bytes_per_s, sequence_parallel=t > 1,
                                  recompute_modules=sets)
    big_b = global_batch_size or recipe.global_batch_size
    d = recipe.data
    return Plan(
        solver="recipe", options=_options(recipe), model=profile, cluster=cluster, transformer=cfg,
        degrees=Degrees(data=d, tensor=t, pipeline=p, virtual=v, context=recipe.context, expert=recipe.expert),
        schedule=_schedule(recipe), microbatch_size=b,
        num_microbatches=big_b // (b * d), global_batch_size=big_b,
        stages=_stages(cfg.num_layers, p, v, recipe.recompute, d, v_shape=_schedule(recipe) in V_SCHEDULES,
                       head_too=bool(cfg.mtp_layers)),
        zero_stage=recipe.zero_stage,  # type: ignore[arg-type]
        sequence_parallel=t > 1, notes=(f"recipe {recipe.name}: {recipe.source}",),
    )


def _schedule(recipe: Recipe) -> str:
    return recipe.schedule or ("interleaved-1f1b" if recipe.virtual > 1 else "1f1b")


def _options(recipe: Recipe) -> dict[str, Any]:
    return {"overlap_grad_reduce": recipe.overlap_grad_reduce, "overlap_param_gather": recipe.overlap_param_gather,
            "overlap_moe_alltoall": recipe.overlap_moe_alltoall}


def _stages(num_layers: int, p: int, v: int, recompute: str, replicas: int, *, v_shape: bool = False,
            head_too: bool = False) -> tuple[Stage, ...]:
    """Virtual stage k (chunk k // p of stage k % p, or the V placement: stage k, then 2p - 1 - k);
    the embedding joins the first, the head the last (``head_too``: the head's multi-token-prediction
    blocks take the recompute setting, as Megatron-Core applies it to them)."""
    decoders = decoder_split(num_layers, p * v)
    bounds = [0]
    for k, n in enumerate(decoders):
        bounds.append(bounds[-1] + n + (k == 0) + (k == p * v - 1))
    chunks: list[list[Chunk]] = [[] for _ in range(p)]
    for k in range(p * v):
        first, last = bounds[k], bounds[k + 1]
        blocks = tuple(i for i in range(first, last) if 0 < i <= num_layers + head_too)
        spec = {recompute: blocks} if recompute != "none" and blocks else {}
        chunks[(2 * p - 1 - k if k >= p else k) if v_shape else k % p].append(Chunk(layers=(first, last), recompute=spec))
    return tuple(Stage(index=x, replicas=replicas, chunks=tuple(chunks[x])) for x in range(p))
