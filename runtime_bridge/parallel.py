"""Tensor, sequence and data parallelism of a rank's chunks: torch's building blocks, composed
the way torchtitan composes them for Llama; this module is only the glue.

The plan's degrees become one ``DeviceMesh`` of shape (pipeline, data, tensor) in Megatron-LM's
rank order (rank = stage x d t + replica x t + tensor rank; ``solvers.common.stage_ranks``): the
``pp`` dimension is the pipeline stages' process group, ``dp`` the replicas, ``tp`` the
tensor-parallel group.

- **Tensor parallelism** (Shoeybi et al., *Megatron-LM*, arXiv:1909.08053, Sec. 3): per layer,
  ``parallelize_module`` with ``ColwiseParallel`` on the Q, K, V projections and on the first
  FFN matrices and ``RowwiseParallel`` on the attention output and the last FFN matrix, so each
  block needs one all-reduce in the forward and one in the backward per sub-layer. The
  embedding is split by vocabulary rows (``RowwiseParallel``), the LM head by vocabulary columns
  (``ColwiseParallel``, logits gathered).
- **Sequence parallelism** (``Plan.sequence_parallel``; Korthikanti et al., *Reducing Activation
  Recomputation in Large Transformer Models*, MLSys 2023, Sec. 4.2.2): the norms run on 1/t of
  the sequence (``SequenceParallel``), ``PrepareModuleInput`` all-gathers the sequence before
  attention and the FFN, and the row-parallel outputs are reduce-scattered (``output_layouts=
  Shard(1)``). Pipeline stages then exchange (b, s/t, h) activations.
- **Data parallelism** by ``Plan.zero_stage`` (Rajbhandari et al., *ZeRO*, SC 2020, Sec. 5):
  0 ``DistributedDataParallel`` over the ``dp`` group (with tensor parallelism, whose DTensor
  parameters DDP does not take: FSDP2's hybrid mode over a (d, 1) mesh, i.e. replicated
  parameters and all-reduced gradients, DDP's semantics); 3 FSDP2 ``fully_shard`` over the ``dp``
  mesh (parameters, gradients and optimizer states sharded; parameters gathered per layer and
  freed after its forward); 2 FSDP2 with ``reshard_after_forward=False``: gradients and
  optimizer states sharded, parameters gathered once per step and kept until the backward is
  done; 1 DDP with torch's ``ZeroRedundancyOptimizer`` (all-reduced gradients, optimizer states
  sharded), or, with tensor parallelism (DTensor parameters, which neither takes), as stage 2.

Mixture-of-experts blocks under tensor parallelism split every expert's FFN the same way (expert
tensor parallelism; the router is replicated). Expert parallelism (``degrees.expert`` > 1):
``runtime_bridge.expert_parallel``, its groups built here (``_expert_groups``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from planner.schema import Plan, TransformerConfig
from runtime_bridge import model as gpt

__all__ = ["RankMesh", "build_mesh", "full_grads", "make_optimizer", "shard_data_parallel", "tensor_parallel_layer"]


@dataclass(frozen=True, slots=True)
class RankMesh:
    """This rank's place in the (pipeline, data, tensor) mesh and its groups (None: a dimension
    of size 1, or no mesh at all for plain pipelines)."""

    stage: int
    replica: int
    tp_rank: int
    pp_group: Any = None
    dp_mesh: Any = None
    tp_mesh: Any = None
    dp_group: Any = None
    """The replicas of this rank's stage and tensor rank (None when d = 1)."""
    ep_group: Any = None
    """Expert parallelism: the e consecutive replicas that split the experts (None when e = 1)."""
    edp_group: Any = None
    """The d / e replicas holding the same experts (None when e = 1 or d = e)."""
    edp_mesh: Any = None
    """Their 1-D mesh (FSDP2 of the experts; size 1 when d = e)."""
    ep_rank: int = 0
    cp_rank: int = 0
    cp_group: Any = None
    """Context parallelism: the c ranks that split one replica's sequence (None when c = 1)."""


def build_mesh(plan: Plan, rank: int, device: torch.device, *, explicit_sync: bool = False) -> RankMesh:
    """The (pp, dp, tp) device mesh of a plan, in Megatron order; groups only where needed.
    ``explicit_sync``: the bridge reduces data-parallel gradients itself (``grad_sync``), so
    replicated parameters need the plain ``dp`` group, not FSDP2's hybrid mesh."""
    p, d, t = plan.degrees.pipeline, plan.degrees.data, plan.degrees.tensor
    if plan.degrees.context > 1:
        return _context_mesh(plan, rank, device)
    stage, replica, tp_rank = rank // (d * t), (rank // t) % d, rank % t
    if d == 1 and t == 1:
        return RankMesh(stage, replica, tp_rank)
    from torch.distributed.device_mesh import init_device_mesh

    if plan.zero_stage == 0 and d > 1 and t > 1 and not explicit_sync:
        # DDP does not take DTensor parameters: replicate with FSDP2's HSDP over a (d, 1) mesh
        mesh = init_device_mesh(device.type, (p, d, 1, t), mesh_dim_names=("pp", "dp", "dp_shard", "tp"))
        dp_mesh = mesh["dp", "dp_shard"]
    else:
        mesh = init_device_mesh(device.type, (p, d, t), mesh_dim_names=("pp", "dp", "tp"))
        dp_mesh = mesh["dp"] if d > 1 else None
    return RankMesh(stage, replica, tp_rank, pp_group=mesh["pp"].get_group(), dp_mesh=dp_mesh,
                    tp_mesh=mesh["tp"] if t > 1 else None, dp_group=mesh["dp"].get_group() if d > 1 else None,
                    **_expert_groups(plan, device))


def _context_mesh(plan: Plan, rank: int, device: torch.device) -> RankMesh:
    """Pipeline x data x context x tensor (experts carved out of data x context) in Megatron-LM's
    order, tensor fastest, context inside data: rank = stage x d c t + replica x c t + context
    rank x t + tensor rank. Two meshes over the same ranks: (pp, dp, cp, tp) for the context
    group, and (pp, dp x cp, tp) whose middle dimension reduces gradients (explicitly for ZeRO 0
    and 1, FSDP2 over it for ZeRO 2 and 3, which averages over d c as the losses need)."""
    from torch.distributed.device_mesh import init_device_mesh

    p, d, c, t = plan.degrees.pipeline, plan.degrees.data, plan.degrees.context, plan.degrees.tensor
    split = init_device_mesh(device.type, (p, d, c, t), mesh_dim_names=("pp", "dp", "cp", "tp"))
    mesh = init_device_mesh(device.type, (p, d * c, t), mesh_dim_names=("pp", "dp_cp", "tp"))
    return RankMesh(rank // (d * c * t), (rank // (c * t)) % d, rank % t, pp_group=mesh["pp"].get_group(),
                    dp_mesh=mesh["dp_cp"], tp_mesh=mesh["tp"] if t > 1 else None,
                    dp_group=mesh["dp_cp"].get_group(), cp_rank=(rank // t) % c, cp_group=split["cp"].get_group(),
                    **_expert_groups(plan, device))


def _expert_groups(plan: Plan, device: torch.device) -> dict[str, Any]:
    """Expert parallelism's groups, carved out of the data x context ranks of a stage (Megatron-LM's
    layout; n = d c of them, numbered replica x c + context rank): n-ranks g e .. g e + e - 1 split
    the experts, those with the same index modulo e reduce the same experts' gradients. A (pp,
    edp, ep, tp) mesh over the same ranks."""
    e = plan.degrees.expert
    if e == 1:
        return {}
    from torch.distributed.device_mesh import init_device_mesh

    p, n, t = plan.degrees.pipeline, plan.degrees.data * plan.degrees.context, plan.degrees.tensor
    mesh = init_device_mesh(device.type, (p, n // e, e, t), mesh_dim_names=("pp", "edp", "ep", "tp"))
    return {"ep_group": mesh["ep"].get_group(), "ep_rank": mesh["ep"].get_local_rank(),
            "edp_group": mesh["edp"].get_group() if n > e else None, "edp_mesh": mesh["edp"]}


def _embedding_plan(cfg: TransformerConfig, sp: bool) -> tuple[dict[str, Any], Any]:
    """Vocabulary-split embedding; with sequence parallelism its output is the local sequence shard."""
    if cfg.position_embedding == "learned":
        # positions are added to the whole sequence, then the layer keeps its shard (no communication)
        style = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
        shard = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1),
                                    use_local_output=True) if sp else None
        return {"tokens": style}, shard
    return {"tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1) if sp else Replicate())}, None


def _block_plan(sp: bool) -> dict[str, Any]:
    """torchtitan's Llama block plan: Megatron's column/row split, plus sequence parallel norms."""
    out = Shard(1) if sp else Replicate()
    plan: dict[str, Any] = {
        "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=out),
        "feed_forward.w1": ColwiseParallel(), "feed_forward.w2": RowwiseParallel(output_layouts=out),
    }
    if sp:
        gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        plan |= {"attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel(),
                 "attention": gather, "feed_forward": gather}
    return plan


def tensor_parallel_layer(layer: nn.Module, index: int, cfg: TransformerConfig, tp_mesh: Any, sp: bool) -> nn.Module:
    """Apply tensor (and sequence) parallelism to model layer ``index`` in place; returns it."""
    if index == 0:
        plan, shard = _embedding_plan(cfg, sp)
        parallelize_module(layer, tp_mesh, plan)
        if shard is not None:
            parallelize_module(layer, tp_mesh, shard)
        return layer
    if index == cfg.num_layers + 1:
        plan = {"output": ColwiseParallel(input_layouts=Shard(1) if sp else Replicate(), output_layouts=Replicate())}
        if sp:
            plan["norm"] = SequenceParallel()
        return parallelize_module(layer, tp_mesh, plan)
    if getattr(layer.feed_forward, "router", None) is not None:  # MoE, whole or expert-parallel
        return _moe_block(layer, tp_mesh, sp)
    plan = _block_plan(sp)
    if getattr(layer.feed_forward, "w3", None) is not None:
        plan["feed_forward.w3"] = ColwiseParallel()
    return parallelize_module(layer, tp_mesh, plan)


def _ffn_plan(prefix: str, ffn: nn.Module) -> dict[str, Any]:
    """One expert's FFN split like the dense one, its output all-reduced (the tokens it serves
    are gathered from the whole sequence)."""
    plan: dict[str, Any] = {f"{prefix}.w1": ColwiseParallel(), f"{prefix}.w2": RowwiseParallel()}
    if ffn.w3 is not None:
        plan[f"{prefix}.w3"] = ColwiseParallel()
    return plan


def _moe_block(layer: nn.Module, tp_mesh: Any, sp: bool) -> nn.Module:
    """A MoE block with every expert tensor-parallel (Megatron's expert tensor parallelism with
    expert-parallel degree 1): the router stays whole on every rank (it sees the same tokens),
    routing runs on the whole sequence, and with sequence parallelism the block gathers the
    sequence before routing and keeps its shard of the output."""
    plan = _block_plan(sp)
    for key in [k for k in plan if k.startswith("feed_forward")]:
        del plan[key]
    moe = layer.feed_forward
    for e, expert in moe.experts.named_children():  # global indices, also of an expert-parallel block
        plan |= _ffn_plan(f"feed_forward.experts.{e}", expert)
    if moe.shared is not None:
        plan |= _ffn_plan("feed_forward.shared", moe.shared)
    parallelize_module(layer, tp_mesh, plan)
    if sp:
        parallelize_module(moe, tp_mesh, PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True))
        parallelize_module(moe, tp_mesh, PrepareModuleOutput(
            output_layouts=Replicate(), desired_output_layouts=Shard(1), use_local_output=True))
    return layer


def shard_data_parallel(chunk: nn.Module, zero_stage: int, mesh: RankMesh, *, explicit_sync: bool = False
                        ) -> nn.Module:
    """Wrap one chunk for data parallelism over the ``dp`` mesh by the plan's ZeRO stage
    (``explicit_sync``: replicated parameters left unwrapped, ``grad_sync`` reduces them).

    Returns:
        The module the pipeline stage runs: DDP, or the chunk itself made an FSDP2 module (each
        layer its own FSDP unit, so parameters are gathered one layer at a time).
    """
    if mesh.dp_mesh is None or (explicit_sync and zero_stage in (0, 1)):
        return chunk
    if zero_stage in (0, 1) and mesh.dp_mesh.ndim == 1 and mesh.tp_mesh is None:
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(chunk, process_group=mesh.dp_mesh.get_group())
    from torch.distributed.fsdp import fully_shard

    reshard = zero_stage == 3  # ZeRO-3 frees gathered parameters after the forward; 0-2 keep them
    for layer in chunk.layers.values():
        _shard_experts(layer, mesh, reshard)
        fully_shard(layer, mesh=mesh.dp_mesh, reshard_after_forward=reshard)
    fully_shard(chunk, mesh=mesh.dp_mesh, reshard_after_forward=reshard)
    return chunk


def _shard_experts(layer: nn.Module, mesh: RankMesh, reshard: bool) -> None:
    """Expert parallelism under FSDP2: each kept expert its own unit over the expert-data-parallel
    mesh (the d / e replicas holding it; torchtitan shards its experts the same way). FSDP2
    averages those gradients over d / e; every token's loss carries 1 / (d m), so the worker
    scales them by a further 1 / e after the step (``grad_sync.ExpertGradScale``: FSDP2's own
    divide factor needs ``PREMUL_SUM``, which gloo lacks)."""
    from torch.distributed.fsdp import fully_shard

    experts = getattr(getattr(layer, "feed_forward", None), "experts", None)
    if mesh.ep_group is None or experts is None:
        return
    for expert in experts.values():
        fully_shard(expert, mesh=mesh.edp_mesh, reshard_after_forward=reshard)


def make_optimizer(params: list[nn.Parameter], zero_stage: int, mesh: RankMesh, *, lr: float,
                   expert_params: list[nn.Parameter] | None = None) -> Any:
    """The bridge's plain SGD; for ZeRO-1 without tensor parallelism, torch's
    ``ZeroRedundancyOptimizer`` over the ``dp`` group (DDP all-reduces the gradients, each replica
    updates and keeps the state of its share of the parameters, then broadcasts them).

    With expert parallelism the experts (``expert_params``, the rest in ``params``) differ between
    the replicas of the ``dp`` group, so ZeRO-1 shards them over the expert-data-parallel group
    only (a second ``ZeroRedundancyOptimizer``; plain SGD when that group is one rank): one shared
    partition over ``dp`` would broadcast one rank's experts over another's (``--check`` saw a
    5e-3 error at the second step)."""
    experts = expert_params or []
    if zero_stage != 1 or mesh.dp_mesh is None or mesh.tp_mesh is not None or mesh.dp_mesh.ndim != 1:
        return torch.optim.SGD(params + experts, lr=lr)
    from torch.distributed.optim import ZeroRedundancyOptimizer

    dense = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.SGD, process_group=mesh.dp_mesh.get_group(),
                                    lr=lr)
    if not experts:
        return dense
    if mesh.edp_group is None:
        return JointOptimizer([dense, torch.optim.SGD(experts, lr=lr)])
    return JointOptimizer([dense, ZeroRedundancyOptimizer(experts, optimizer_class=torch.optim.SGD,
                                                          process_group=mesh.edp_group, lr=lr)])


class JointOptimizer:
    """Several optimizers over disjoint parameters, stepped together (ZeRO-1 with expert
    parallelism: dense parameters sharded over ``dp``, experts over the expert-data-parallel group)."""

    def __init__(self, optimizers: list[Any]) -> None:
        self.optimizers = optimizers

    def step(self) -> None:
        for optimizer in self.optimizers:
            optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)


def full_grads(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's whole gradient (DTensor shards gathered) on the CPU, by model name.

    Collective when parameters are DTensors: every rank of their meshes must call it.
    """
    out = {}
    for name, param in module.named_parameters():
        if param.grad is None:
            continue
        grad = param.grad
        if isinstance(grad, DTensor):
            grad = grad.full_tensor()
        out[_model_name(name)] = grad.detach().float().cpu().clone()
    return out


def _model_name(name: str) -> str:
    """A parameter's name in the whole model: DDP's ``module.`` prefix dropped (FSDP2 and the
    tensor-parallel styles keep names)."""
    return name.removeprefix("module.")
