"""``--check``: the same batches through single-process training, and the largest differences.

The reference builds the whole model in one process with the same layer initialisation
(``model.init_layer`` depends only on the seed and layer index), runs every step on the global
batch split into the same d x m microbatches, and takes the gradient of the mean of their
losses: exactly what the pipeline computes with ``scale_grads=True`` (grads / m per replica)
followed by DDP's average over d replicas (shared/design/ecosystem.md Sec. 2.3, 3.2). It then
applies the same plain SGD step, so later steps compare too.

With tensor parallelism the ranks' gradients are DTensor shards; each rank reports the whole
gradient (``parallel.full_grads`` gathers them), and with FSDP the gathered, averaged one.

Reported: ``max_loss_diff`` over every (step, microbatch) loss and ``max_grad_diff`` over every
gradient element of every step; on CPU in fp32 both must be at most ``TOLERANCE``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from planner.schema import Plan, TransformerConfig
from runtime_bridge import model as gpt
from runtime_bridge.stages import full_model

__all__ = ["TOLERANCE", "compare", "reference_run"]

TOLERANCE = 1e-5
"""Absolute bound for max_loss_diff and max_grad_diff, fp32 on CPU. Pipeline and DDP runs add the
same numbers in the same order as one process (differences 0 to 1e-7). Tensor and sequence
parallelism and FSDP add partial sums in another order (row-parallel all-reduce, reduce-scatter,
averaging over replicas), which moves an fp32 loss of about 5 by a few units in the last place:
up to 1e-6 in the tests. 1e-5 is ten times that and still a thousand times below what a real
mistake gives (a missing 1/d or 1/m scaling, a wrong shard, a skipped all-reduce: 1e-2 or more)."""


def reference_run(plan: Plan, cfg: TransformerConfig, *, steps: int, seed: int, lr: float
                  ) -> tuple[list[list[float]], list[dict[str, torch.Tensor]]]:
    """Single-process training of the plan's batches.

    Returns:
        (losses[step][global microbatch], grads[step][parameter name]).
    """
    model = full_model(gpt.num_model_layers(cfg), lambda i: gpt.build_layer(cfg, i),
                       device=torch.device("cpu"), init=lambda layer, i: gpt.init_layer(layer, i, seed=seed))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    num_microbatches = plan.degrees.data * plan.num_microbatches
    all_losses, all_grads = [], []
    for step in range(steps):
        tokens, targets = gpt.sample_batch(cfg, batch_size=plan.global_batch_size, step=step, seed=seed)
        losses = [gpt.lm_loss(model(x), y) for x, y in zip(tokens.chunk(num_microbatches),
                                                            targets.chunk(num_microbatches))]
        torch.stack(losses).mean().backward()
        all_losses.append([float(x.detach()) for x in losses])
        all_grads.append({n: q.grad.detach().clone() for n, q in model.named_parameters() if q.grad is not None})
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return all_losses, all_grads


def compare(plan: Plan, records: Sequence[dict[str, Any]], ref_losses: list[list[float]],
            ref_grads: list[dict[str, torch.Tensor]]) -> dict[str, Any]:
    """Largest absolute differences between the ranks' records and the reference, and the
    ``check_failures`` that make the check fail whatever the differences (explicit verdicts,
    not ``assert``: they hold under ``python -O`` too).

    Every parameter of the model must have been reported by some rank (a missing layer is a
    bridge bug, not a pass), and some rank must have reported a loss.
    """
    m = plan.num_microbatches
    max_loss = max_grad = 0.0
    seen: set[str] = set()
    failures: list[str] = []
    for rec in records:
        for step, losses in enumerate(rec["losses"]):
            expected = ref_losses[step][rec["replica"] * m: (rec["replica"] + 1) * m]
            if losses and len(losses) != len(expected):
                failures.append(f"step {step}: a rank reported {len(losses)} losses, the reference {len(expected)}")
            elif losses:
                max_loss = max(max_loss, *(abs(a - b) for a, b in zip(losses, expected)))
        for step, grads in enumerate(rec["grads"]):
            for name, grad in grads.items():
                seen.add(name)
                max_grad = max(max_grad, float((grad - ref_grads[step][name]).abs().max()))
    missing = set(ref_grads[0]) - seen if ref_grads else set()
    if missing:
        failures.append(f"no rank reported gradients of {sorted(missing)[:5]}")
    if not any(rec["losses"] and rec["losses"][0] for rec in records):
        failures.append("no rank reported a loss")
    return {"max_loss_diff": max_loss, "max_grad_diff": max_grad, "check_failures": failures}
