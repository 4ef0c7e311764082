"""SPipe runtime (runtime_bridge.offload): offloaded training equals plain training, copies are freed.

On CPU the "devices" are simulated (separate working tensors, no-op streams) and the whole
code path runs; the CUDA tests run the same on a GPU and skip without one.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import solvers  # noqa: E402
from planner import api  # noqa: E402
from planner.errors import InvalidProblemError  # noqa: E402
from planner.schema import Plan  # noqa: E402
from runtime_bridge import model as gpt  # noqa: E402
from runtime_bridge.offload import DeviceStreams, OffloadedTrainer, Visit, offload_layout  # noqa: E402
from runtime_bridge.stages import full_model  # noqa: E402
from tests.runtime_bridge.plans import tiny_plan  # noqa: E402

SEED, STEPS, LR = 3, 3, 1e-2
HOST = {"host_link_bytes_per_s": 1e10}


@pytest.fixture(scope="module")
def problem():
    return api.make_problem("gpt-tiny", "cpu:2", microbatch_size=2, global_batch_size=8)


@pytest.fixture(scope="module")
def plans(problem) -> dict[str, Plan]:
    return {
        f"spipe {v}/2": solvers.solve(problem, solver="spipe", options={"forward_per_gpu": v, "backward_per_gpu": 2, **HOST})
        for v in (1, 2)
    } | {
        "mobius": solvers.solve(problem, solver="mobius", options=HOST),
        "zero-offload": solvers.solve(problem, solver="zero-offload", options=HOST),
    }


def _adam(params):
    return torch.optim.Adam(params, lr=LR)


def _reference(plan: Plan, device: torch.device):
    """Plain single-process training: the whole model, one Adam, gradient accumulation over the
    microbatches of the mean loss (the order the offload runtime accumulates in)."""
    cfg = plan.transformer
    model = full_model(gpt.num_model_layers(cfg), lambda i: gpt.build_layer(cfg, i), device=device,
                       init=lambda layer, i: gpt.init_layer(layer, i, seed=SEED))
    optimizer = _adam(model.parameters())
    m = plan.degrees.data * plan.num_microbatches
    all_losses = []
    for step in range(STEPS):
        tokens, targets = gpt.sample_batch(cfg, batch_size=plan.global_batch_size, step=step, seed=SEED)
        losses = []
        for x, y in zip(tokens.chunk(m), targets.chunk(m)):
            loss = gpt.lm_loss(model(x.to(device)), y.to(device))
            (loss / m).backward()
            losses.append(float(loss.detach()))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        all_losses.append(losses)
    return all_losses, {n: p.detach() for n, p in model.named_parameters()}


def _offloaded(plan: Plan, device: torch.device):
    cfg = plan.transformer
    losses, stats, live = [], [], []
    with OffloadedTrainer.for_gpt(plan, cfg, seed=SEED, optimizer_factory=_adam, device=device) as trainer:
        for step in range(STEPS):
            tokens, targets = gpt.sample_batch(cfg, batch_size=plan.global_batch_size, step=step, seed=SEED)
            step_losses, step_stats = trainer.train_step(tokens, targets)
            losses.append(step_losses)
            stats.append(step_stats)
            live.append(trainer.live_working_params())
        return losses, trainer.master_state(), stats, live, trainer


def _max_diff(losses, ref_losses, params, ref_params) -> tuple[float, float]:
    assert set(params) == set(ref_params)
    loss = max(abs(a - b) for row, ref in zip(losses, ref_losses, strict=True) for a, b in zip(row, ref, strict=True))
    param = max(float((params[n] - ref_params[n].cpu()).abs().max()) for n in ref_params)
    return loss, param


@pytest.mark.parametrize("name", ["spipe 1/2", "spipe 2/2", "mobius", "zero-offload"])
def test_offloaded_training_equals_plain_training(plans, name):
    plan = plans[name]
    losses, params, _, live, _ = _offloaded(plan, torch.device("cpu"))
    ref_losses, ref_params = _reference(plan, torch.device("cpu"))
    loss_diff, param_diff = _max_diff(losses, ref_losses, params, ref_params)
    assert loss_diff <= 1e-6 and param_diff <= 1e-6, (loss_diff, param_diff)
    assert losses[-1] != losses[0]  # the optimizer did move the weights
    assert live == [0] * STEPS  # no working copy survives a step


def _layer_params(plan: Plan) -> list[int]:
    cfg = plan.transformer
    return [gpt.num_layer_params(gpt.build_layer(cfg, i)) for i in range(gpt.num_model_layers(cfg))]


def test_transfers_and_working_copies_follow_the_plan(plans):
    plan = plans["spipe 1/2"]
    layout = offload_layout(plan)
    # Placement of seed 003 (reading B.3): forward i on GPU i mod 2, backward n on (G - 1 - n) mod G.
    assert layout.visits() == (
        Visit("F", 0, (0, 3), 0), Visit("F", 1, (3, 6), 1), Visit("B", 3, (4, 6), 0),
        Visit("B", 2, (3, 4), 1), Visit("B", 1, (2, 3), 0), Visit("B", 0, (0, 2), 1),
    )
    _, _, stats, _, trainer = _offloaded(plan, torch.device("cpu"))
    sizes = _layer_params(plan)
    visit_params = [sum(sizes[slice(*v.layers)]) for v in layout.visits()]
    for st in stats:
        # Every layer goes to a GPU twice (forward, backward) and its gradient comes back once, fp32.
        assert st.h2d_bytes == 2 * 4 * sum(sizes) and st.d2h_bytes == 4 * sum(sizes)
        # Double buffering: the running stage and the prefetched next one, never a third.
        assert st.peak_working_params == max(a + b for a, b in zip(visit_params, visit_params[1:]))
    # SPipe's asynchronous optimizer: each stage steps right after its own gradient offload.
    trace = trainer.trace
    for n in range(4):
        assert trace[trace.index(("G", n)) + 1] == ("O", n)
    assert trace.index(("O", 3)) < trace.index(("B", 0))


def test_synchronous_optimizer_steps_after_every_offload(plans):
    plan = plans["mobius"]
    assert not offload_layout(plan).async_optimizer
    *_, trainer = _offloaded(plan, torch.device("cpu"))
    last_offload = max(k for k, (kind, _) in enumerate(trainer.trace) if kind == "G")
    steps = [k for k, (kind, _) in enumerate(trainer.trace) if kind == "O"]
    assert len(steps) == 2 and min(steps) > last_offload


def test_bf16_working_copies_keep_fp32_masters(plans):
    """Mixed precision as SPipe streams it: 2-byte copies and gradients, fp32 master weights and Adam."""
    plan = plans["spipe 1/2"]
    cfg = plan.transformer
    tokens, targets = gpt.sample_batch(cfg, batch_size=plan.global_batch_size, step=0, seed=SEED)
    runs = {}
    for dtype in (torch.float32, torch.bfloat16):
        with OffloadedTrainer.for_gpt(plan, cfg, seed=SEED, optimizer_factory=_adam, dtype=dtype) as trainer:
            runs[dtype] = trainer.train_step(tokens, targets)
            assert all(p.dtype == torch.float32 for p in trainer.master_state().values())
    (losses32, stats32), (losses16, stats16) = runs[torch.float32], runs[torch.bfloat16]
    assert stats16.h2d_bytes * 2 == stats32.h2d_bytes and stats16.d2h_bytes * 2 == stats32.d2h_bytes
    # bf16 keeps 8 mantissa bits: per-microbatch losses near 4.85 agree to a few 1e-3.
    assert max(abs(a - b) for a, b in zip(losses32, losses16)) < 2e-2
    assert losses32 != losses16


def test_plans_without_offload_section_or_recompute_are_rejected(plans):
    with pytest.raises(InvalidProblemError, match="no 'offload' section"):
        offload_layout(tiny_plan("gpipe"))
    data = plans["spipe 1/2"].model_dump(mode="json")
    data["offload"]["recompute"] = "none"
    with pytest.raises(InvalidProblemError, match="recompute='none'"):
        offload_layout(Plan.from_dict(data))
    data["offload"]["recompute"] = "full"
    data["offload"]["backward_stages"] = [[0, 2], [3, 4], [3, 4], [4, 6]]
    with pytest.raises(InvalidProblemError, match="tile layers"):
        offload_layout(Plan.from_dict(data))


def test_batch_that_does_not_split_is_rejected(plans):
    plan = plans["spipe 1/2"]
    with OffloadedTrainer.for_gpt(plan, plan.transformer, seed=SEED, optimizer_factory=_adam) as trainer:
        tokens = torch.zeros((7, plan.transformer.seq_length), dtype=torch.long)
        with pytest.raises(InvalidProblemError, match="7 samples"):
            trainer.train_step(tokens, tokens)


def test_cpu_streams_are_no_ops():
    streams = DeviceStreams(torch.device("cpu"))
    assert streams.record("h2d") is None
    with streams.on("d2h"):
        streams.wait("compute", None)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.cuda
@cuda
def test_cuda_offloaded_training_equals_plain_training(plans):
    plan = plans["spipe 1/2"]
    device = torch.device("cuda")
    before = torch.cuda.memory_allocated()
    losses, params, _, live, _ = _offloaded(plan, device)
    ref_losses, ref_params = _reference(plan, device)
    loss_diff, param_diff = _max_diff(losses, ref_losses, params, ref_params)
    assert loss_diff <= 1e-5 and param_diff <= 1e-5, (loss_diff, param_diff)
    assert live == [0] * STEPS
    del ref_params
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before  # working copies and checkpoints left the GPU


@pytest.mark.cuda
@cuda
def test_cuda_copies_use_their_own_streams():
    streams = DeviceStreams(torch.device("cuda"))
    compute, h2d, d2h = (streams.streams[k] for k in ("compute", "h2d", "d2h"))
    assert len({compute.stream_id, h2d.stream_id, d2h.stream_id}) == 3
    host = torch.ones(1024, pin_memory=True)
    with streams.on("h2d"):
        work = torch.empty(1024, device="cuda")
        work.copy_(host, non_blocking=True)
        event = streams.record("h2d")
    streams.wait("compute", event)
    assert float(work.sum()) == 1024.0
