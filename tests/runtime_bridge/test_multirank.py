"""Plans executed on CPU with gloo under torchrun, each checked against single-process training.

One launch runs many plans (one process group), so the whole file costs about six spawns:
2 ranks (every schedule, uneven splits, recompute, custom actions, a Mixtral-style MoE model,
expert parallelism EP2, context parallelism CP2), 4 ranks (4 stages; the meshes tensor x
pipeline, pipeline x FSDP, tensor x data, data x pipeline with DDP, the README's ptdp plan scaled
to t = 2, p = 2, v = 2; zero-bubble and V schedules with data parallelism; expert and context
parallelism combined with pipeline, data, tensor parallelism and ZeRO), a dead rank, the CLI, and
two "nodes" on localhost. Tolerance: ``check.TOLERANCE`` (1e-5, fp32; why: its docstring).
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from planner import api  # noqa: E402
from planner.cli import main  # noqa: E402
from planner.schema import Plan  # noqa: E402
from runtime_bridge.check import TOLERANCE  # noqa: E402
from runtime_bridge.launch import RunJob, LaunchOptions, RunFailedError, launch, summarize  # noqa: E402
from runtime_bridge.validate import resolve_config  # noqa: E402
from tests.runtime_bridge.plans import (  # noqa: E402
    LLAMA_TINY, MIXTRAL_TINY, NEOX_TINY, tiny_plan, torchtitan_custom_plan,
)

MIXTRAL_SHARED = MIXTRAL_TINY.model_copy(update={"name": "mixtral-shared-tiny", "num_shared_experts": 1})
# A hang guard only: every collective has a 30 s process-group timeout and each launch its own
# deadline, which catch a broken plan long before this. The bound is wide because the 29-plan
# four-rank launch took over 240 s on a 2-core machine at load average 6-10 (147 s idle).
pytestmark = [pytest.mark.multirank, pytest.mark.timeout(900)]

_TWO_RANK_PLANS = {
    "gpipe uneven": tiny_plan("gpipe", splits=[[(0, 2)], [(2, 6)]]),
    "1f1b uneven + full/selective recompute": tiny_plan(
        "1f1b", splits=[[(0, 4)], [(4, 6)]], recompute={0: {"full": [1], "selective": [2, 3]}}),
    "interleaved-1f1b uneven chunks + selective": tiny_plan(
        "interleaved-1f1b", v=2, splits=[[(0, 1), (3, 5)], [(1, 3), (5, 6)]], recompute={1: {"selective": 1}}),
    "zb-h1 + full recompute": tiny_plan("zb-h1", recompute={0: {"full": [1, 2]}}),
    "zb-h2": tiny_plan("zb-h2", m=4),
    "custom actions (torchtitan CSV)": torchtitan_custom_plan(),
    "1f1b through the plan's action list": tiny_plan("1f1b", splits=[[(0, 3)], [(3, 6)]]),
    "mixtral-style MoE, 1f1b p=2": tiny_plan("1f1b", model=MIXTRAL_TINY),
    "zb-v (ScheduleZBVZeroBubble, V placement)": tiny_plan("zb-v", m=4),
    "dualpipe-v (ScheduleDualPipeV, V placement)": tiny_plan("dualpipe-v", m=4),
    "dualpipe-v through the plan's action list": tiny_plan("dualpipe-v", m=6),
    # 6 layers on 4 virtual stages: the unequal V chunks ptdp plans where 2p does not divide the layers
    "zb-v, 6 layers in unequal V chunks (2, 2, 1, 1)": tiny_plan(
        "zb-v", m=4, model=LLAMA_TINY.model_copy(update={"name": "llama-tiny-6", "num_layers": 6})),
    "mixtral EP2 (experts split over 2 replicas, all-to-all)": tiny_plan(
        "gpipe", p=1, d=2, expert=2, model=MIXTRAL_TINY),
    # one ZeroRedundancyOptimizer over both replicas broadcast one rank's experts over the other's (5e-3)
    "mixtral EP2, ZeRO-1 (experts' optimizer apart)": tiny_plan(
        "1f1b", p=1, d=2, expert=2, zero_stage=1, model=MIXTRAL_TINY),
    "llama CP2 (load-balanced split, all-gathered K/V), selective recompute": tiny_plan(
        "gpipe", p=1, context=2, model=LLAMA_TINY, recompute={0: {"selective": [1, 2]}}),
    "gemma-style GeGLU, 1f1b p=2": tiny_plan("1f1b", model=LLAMA_TINY.model_copy(
        update={"name": "gemma-tiny", "mlp": "geglu"})),
    "activation offload (save_on_cpu) on both stages, 1f1b": tiny_plan(
        "1f1b", module_strategy="offload", recompute={0: {"offload": [1, 2]}, 1: {"offload": [3, 4]}}),
}
# Megatron-Core recompute modules (runtime_bridge.recompute), launched apart so that each launch stays
# within the per-test timeout on a loaded machine
_MODULE_PLANS = {
    "llama, recompute modules core_attn+layernorm+mlp": tiny_plan(
        "1f1b", model=LLAMA_TINY, module_strategy="core_attn+layernorm+mlp",
        recompute={0: {"core_attn+layernorm+mlp": [1, 2]}, 1: {"core_attn+layernorm+mlp": [3]}}),
    "mixtral + shared expert, recompute modules layernorm+moe_act+shared_experts": tiny_plan(
        "1f1b", model=MIXTRAL_SHARED, module_strategy="moe_act+layernorm+shared_experts",
        recompute={0: {"moe_act+layernorm+shared_experts": [1, 2]}, 1: {"moe_act+layernorm+shared_experts": [3, 4]}}),
    "neox-style parallel block + ALiBi + ReLU, recompute modules core_attn+layernorm+mlp": tiny_plan(
        "1f1b", model=NEOX_TINY, module_strategy="core_attn+layernorm+mlp",
        recompute={0: {"core_attn+layernorm+mlp": [1, 2]}, 1: {"core_attn+layernorm+mlp": [3]}}),
    "mixtral, recompute module moe": tiny_plan(
        "1f1b", model=MIXTRAL_TINY, module_strategy="moe", recompute={0: {"moe": [1, 2]}}),
}
_EXECUTOR = {"1f1b through the plan's action list": "actions", "dualpipe-v through the plan's action list": "actions"}


def _jobs(plans: dict, steps: int = 2) -> list[RunJob]:
    return [RunJob(plan=plan, config=resolve_config(plan), steps=steps, check=True, executor=_EXECUTOR.get(name, "auto"),
                   name=name) for name, plan in plans.items()]


def _reports(plans: dict) -> dict[str, dict]:
    """Launch every plan on gloo (one launch, 30 s per-operation timeout) and summarize each against
    single-process training."""
    jobs = _jobs(plans)
    results = launch(jobs, LaunchOptions(timeout_s=30))
    assert results is not None
    return {name: summarize(job, recs) for name, job, recs in zip(plans, jobs, results)}


@pytest.fixture(scope="module")
def two_rank_reports() -> dict[str, dict]:
    return _reports(_TWO_RANK_PLANS)


@pytest.mark.parametrize("name", list(_TWO_RANK_PLANS))
def test_two_ranks_match_single_process(two_rank_reports: dict[str, dict], name: str) -> None:
    report = two_rank_reports[name]
    assert report["max_loss_diff"] <= TOLERANCE
    assert report["max_grad_diff"] <= TOLERANCE
    assert report["check_passed"]
    assert len(report["loss"]) == 2 and all(4.0 < x < 6.0 for x in report["loss"])  # ~ln(128) = 4.85


@pytest.fixture(scope="module")
def module_recompute_reports() -> dict[str, dict]:
    return _reports(_MODULE_PLANS)


@pytest.mark.parametrize("name", list(_MODULE_PLANS))
def test_recompute_modules_match_single_process(module_recompute_reports: dict[str, dict], name: str) -> None:
    report = module_recompute_reports[name]
    assert report["max_loss_diff"] <= TOLERANCE and report["max_grad_diff"] <= TOLERANCE
    assert report["check_passed"] and len(report["loss"]) == 2


@pytest.mark.parametrize("name", ["zb-v (ScheduleZBVZeroBubble, V placement)",
                                  "dualpipe-v (ScheduleDualPipeV, V placement)"])
def test_v_schedules_run_in_v_placement(two_rank_reports: dict[str, dict], name: str) -> None:
    # rank 0 holds the first and the last virtual stage, rank 1 the turn of the V
    assert two_rank_reports[name]["rank_virtual_stages"] == [[0, 3], [1, 2]]


def test_expert_parallel_ranks_hold_half_the_experts(two_rank_reports: dict[str, dict]) -> None:
    from runtime_bridge import model as gpt

    cfg = MIXTRAL_TINY
    params = [(n, q.numel()) for i in range(cfg.num_layers + 2) for n, q in gpt.build_layer(cfg, i).named_parameters()]
    experts = sum(k for n, k in params if ".experts." in n)
    dense = sum(k for n, k in params) - experts
    report = two_rank_reports["mixtral EP2 (experts split over 2 replicas, all-to-all)"]
    assert report["rank_param_bytes"] == [4 * (dense + experts // 2)] * 2


def test_two_ranks_measurements(two_rank_reports: dict[str, dict]) -> None:
    report = two_rank_reports["gpipe uneven"]
    assert report["step_time_s"] > 0 and len(report["step_times_s"]) == 2
    assert 0 < report["step_cpu_time_s"]  # process CPU time of the slowest rank (docs: closing the loop)
    assert report["tokens_per_s"] == pytest.approx(4 * 16 / report["step_time_s"])
    assert len(report["peak_memory_bytes"]) == 2 and min(report["peak_memory_bytes"]) > 0
    assert report["rank_stage"] == [0, 1]


def _readme_ptdp_plan(tmp_path, *, sequence_parallel: bool) -> Plan:
    """The README's ptdp command scaled to 4 CPU ranks with the README plan's shape: t = 2, p = 2,
    v = 2 (interleaved), as the CLI writes it."""
    path = tmp_path / "ptdp.json"
    assert main(["plan", "--solver", "ptdp", "--model", "gpt-tiny", "--cluster", "cpu:4", "--global-batch", "8",
                 "--tensor-parallel", "2", "--pipeline", "2", "--chunks", "2", "--schedule", "interleaved-1f1b",
                 "-o", str(path)]) == 0
    plan = api.load_plan(path)
    assert (plan.degrees.tensor, plan.degrees.pipeline, plan.degrees.virtual) == (2, 2, 2)
    return plan.model_copy(update={"sequence_parallel": sequence_parallel})


def _stage_numel(plan: Plan, stage: int) -> tuple[int, int]:
    """(elements of matrices, of vectors) of one stage of the plan's model, built whole."""
    from runtime_bridge import model as gpt

    cfg = resolve_config(plan)
    first, last = plan.stages[stage].chunks[0].layers
    params = [q for i in range(first, last) for q in gpt.build_layer(cfg, i).parameters()]
    return sum(q.numel() for q in params if q.dim() == 2), sum(q.numel() for q in params if q.dim() == 1)


def test_four_ranks_meshes(tmp_path) -> None:
    plans = {
        "1f1b p=4 uneven + recompute": tiny_plan(
            "1f1b", p=4, m=4, splits=[[(0, 1)], [(1, 3)], [(3, 4)], [(4, 6)]], recompute={1: {"full": 1}}),
        "2 x 2 data x pipeline (DDP)": tiny_plan("1f1b", p=2, d=2, m=4, splits=[[(0, 2)], [(2, 6)]]),
        "llama TP2 x PP2, sequence parallel, selective recompute": tiny_plan(
            "1f1b", t=2, sequence_parallel=True, model=LLAMA_TINY, recompute={1: {"selective": 1}}),
        "llama PP2 x FSDP2 (zero 3)": tiny_plan("1f1b", d=2, zero_stage=3, model=LLAMA_TINY),
        "llama PP2 x DP2, ZeRO-1 (DDP + ZeroRedundancyOptimizer)": tiny_plan("1f1b", d=2, zero_stage=1, model=LLAMA_TINY),
        "llama TP2 x DP2 (zero 0)": tiny_plan("gpipe", p=1, d=2, t=2, model=LLAMA_TINY),
        "README ptdp scaled: t=2 p=2 v=2, sequence parallel": _readme_ptdp_plan(tmp_path, sequence_parallel=True),
        "llama TP2 x DP2, ZeRO-2 (FSDP2 over (dp, tp)), sequence parallel": tiny_plan(
            "gpipe", p=1, d=2, t=2, zero_stage=2, sequence_parallel=True, model=LLAMA_TINY),
        "llama ZB-H1 (action list, I/W split) on TP2 x PP2": tiny_plan("zb-h1", t=2, model=LLAMA_TINY),
        "llama interleaved v=2 x FSDP2": tiny_plan("interleaved-1f1b", v=2, d=2, zero_stage=3, model=LLAMA_TINY),
        "mixtral TP2 x PP2, experts split, sequence parallel": tiny_plan(
            "1f1b", t=2, sequence_parallel=True, model=MIXTRAL_TINY),
        # I/W split with data parallelism: gradients all-reduced after the step's last W (grad_sync)
        "zb-v PP2 x DP2 (explicit all-reduce)": tiny_plan("zb-v", d=2, m=4),
        "llama zb-h1 PP2 x DP2, ZeRO-1 (explicit all-reduce)": tiny_plan("zb-h1", d=2, zero_stage=1, model=LLAMA_TINY),
        "llama zb-v PP2 x DP2, ZeRO-2 (FSDP2 reduce-scatter after the last W)": tiny_plan(
            "zb-v", d=2, zero_stage=2, model=LLAMA_TINY),
        # ZeRO-3: each backward of a stage first gathers its FSDP units (torch_pp.unshard_before_backward)
        "llama zb-h1 PP2 x DP2, ZeRO-3": tiny_plan("zb-h1", d=2, zero_stage=3, model=LLAMA_TINY),
        "llama dualpipe-v PP2 x DP2, ZeRO-3": tiny_plan("dualpipe-v", d=2, zero_stage=3, model=LLAMA_TINY),
        "llama zb-v TP2 x DP2 on one stage (explicit all-reduce of DTensor shards)": tiny_plan(
            "zb-v", p=1, d=2, t=2, model=LLAMA_TINY),
        "mixtral PP2 x EP2, FSDP2 (zero 3; experts over the expert-data-parallel mesh)": tiny_plan(
            "1f1b", d=2, expert=2, zero_stage=3, model=MIXTRAL_TINY),
        "mixtral PP2 x EP2 with zb-v": tiny_plan("zb-v", d=2, expert=2, model=MIXTRAL_TINY),
        "mixtral EP2 of DP4 (expert-data-parallel groups of 2), ZeRO-1": tiny_plan(
            "gpipe", p=1, d=4, expert=2, zero_stage=1, model=MIXTRAL_TINY),
        "mixtral TP2 x EP2 (experts split over replicas, each expert tensor-split), sequence parallel": tiny_plan(
            "gpipe", p=1, d=2, t=2, expert=2, sequence_parallel=True, model=MIXTRAL_TINY),
        "llama PP2 x CP2 with zb-h1": tiny_plan("zb-h1", context=2, model=LLAMA_TINY),
        "gpt CP2 x DP2 (learned positions)": tiny_plan("1f1b", p=1, d=2, context=2),
        "llama TP2 x CP2": tiny_plan("1f1b", p=1, t=2, context=2, model=LLAMA_TINY),
        "mixtral PP2 x CP2 x EP2 (experts over the context ranks), zb-h1": tiny_plan(
            "zb-h1", context=2, expert=2, model=MIXTRAL_TINY),
        "mixtral DP2 x CP2 x EP2, FSDP2 (zero 3)": tiny_plan(
            "gpipe", p=1, d=2, context=2, expert=2, zero_stage=3, model=MIXTRAL_TINY),
        "llama PP2 x CP2, FSDP2 over data x context (zero 3)": tiny_plan(
            "1f1b", context=2, zero_stage=3, model=LLAMA_TINY),
        "llama CP2 x DP2, ZeRO-1": tiny_plan("gpipe", p=1, d=2, context=2, zero_stage=1, model=LLAMA_TINY),
        "gpt TP2 x CP2, sequence parallel": tiny_plan("gpipe", p=1, t=2, context=2, sequence_parallel=True),
        "neox parallel block (RoPE) TP2 x PP2, sequence parallel": tiny_plan(
            "1f1b", t=2, sequence_parallel=True, model=NEOX_TINY.model_copy(update={"position_embedding": "rope"})),
        "neox parallel block + ALiBi PP2 x CP2": tiny_plan("1f1b", context=2, model=NEOX_TINY),
    }
    jobs = _jobs(plans)
    results = launch(jobs, LaunchOptions(timeout_s=30))
    assert results is not None
    reports = {name: summarize(job, records) for name, job, records in zip(plans, jobs, results)}
    for name, report in reports.items():
        assert report["max_loss_diff"] <= TOLERANCE, name
        assert report["max_grad_diff"] <= TOLERANCE, name
        assert all(4.0 < x < 6.0 for x in report["loss"]), name
    mesh = results[1]
    assert [(r["stage"], r["replica"]) for r in mesh] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # each replica's last stage computed its own half of the global batch's losses
    assert all(len(r["losses"][0]) == 4 for r in mesh if r["stage"] == 1)
    tp_pp = results[2]  # Megatron order: tensor ranks fastest
    assert [(r["stage"], r["replica"], r["tp_rank"]) for r in tp_pp] == [(0, 0, 0), (0, 0, 1), (1, 0, 0), (1, 0, 1)]
    # each tensor rank holds half of every matrix of its stage (projections, FFN, embedding and
    # head split by vocabulary) and the whole norm scales (replicated)
    matrices, vectors = _stage_numel(plans["llama TP2 x PP2, sequence parallel, selective recompute"], 0)
    assert [r["param_bytes"] for r in tp_pp[:2]] == [4 * (matrices // 2 + vectors)] * 2
    matrices, vectors = _stage_numel(plans["llama PP2 x FSDP2 (zero 3)"], 1)
    assert [r["param_bytes"] for r in results[3][2:]] == [4 * (matrices + vectors) // 2] * 2  # FSDP: dim-0 halves
    wrappers = {name: {(r["data_parallel"], r["optimizer"]) for r in res} for name, res in zip(plans, results)}
    assert wrappers["2 x 2 data x pipeline (DDP)"] == {("DistributedDataParallel", "SGD")}
    assert wrappers["llama PP2 x FSDP2 (zero 3)"] == {("FSDPChunkModule", "SGD")}
    assert wrappers["llama PP2 x DP2, ZeRO-1 (DDP + ZeroRedundancyOptimizer)"] == {
        ("DistributedDataParallel", "ZeroRedundancyOptimizer")}
    assert wrappers["llama TP2 x DP2 (zero 0)"] == {("FSDPChunkModule", "SGD")}  # DDP semantics via HSDP (d, 1)
    assert wrappers["zb-v PP2 x DP2 (explicit all-reduce)"] == {("ChunkModule", "SGD")}
    assert wrappers["llama zb-h1 PP2 x DP2, ZeRO-1 (explicit all-reduce)"] == {("ChunkModule", "ZeroRedundancyOptimizer")}
    assert wrappers["llama PP2 x CP2, FSDP2 over data x context (zero 3)"] == {("FSDPChunkModule", "SGD")}
    assert wrappers["llama CP2 x DP2, ZeRO-1"] == {("ChunkModule", "ZeroRedundancyOptimizer")}
    assert wrappers["mixtral EP2 of DP4 (expert-data-parallel groups of 2), ZeRO-1"] == {("ChunkModule", "JointOptimizer")}
    tp_dp = results[5]
    assert [(r["replica"], r["tp_rank"]) for r in tp_dp] == [(0, 0), (0, 1), (1, 0), (1, 1)]


@pytest.mark.timeout(240)  # a hang fails here; how fast the failure comes is bench/speed_targets.py's business
def test_dead_rank_fails_within_the_timeout() -> None:
    job = RunJob(plan=tiny_plan("1f1b"), config=resolve_config(tiny_plan("1f1b")), steps=3, fail_rank=1, fail_step=1)
    with pytest.raises(RunFailedError, match="run failed") as info:
        launch([job], LaunchOptions(timeout_s=5))
    assert info.value.exit_code == 3
    # torchrun's summary names the killed rank's exit status; the survivor reports its broken link
    assert "exitcode: 17" in str(info.value)
    assert "rank0:" in str(info.value)


@pytest.mark.parametrize("plan", [tiny_plan("1f1b", splits=[[(0, 2)], [(2, 6)]]), tiny_plan("zb-v", m=4)],
                         ids=["1f1b", "zb-v (last stage on pipeline rank 0)"])
def test_cli_run_check_json(tmp_path, capsys, plan) -> None:
    from planner import api

    path = tmp_path / "plan.json"
    api.save(plan, path)
    assert main(["run", str(path), "--steps", "2", "--check", "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)  # stdout holds the one JSON document; progress went to stderr
    assert [line.split(" loss")[0] for line in captured.err.splitlines() if " loss " in line] == [
        "gpt-tiny: step 1/2", "gpt-tiny: step 2/2"]
    assert report["max_loss_diff"] <= TOLERANCE and report["max_grad_diff"] <= TOLERANCE
    assert report["check_passed"] is True


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_nodes_on_localhost_with_the_documented_command(tmp_path) -> None:
    """docs/runtime-bridge.md's several-node command, run as two "nodes" of one rank each on this
    host (torchrun's c10d rendezvous; the node holding global rank 0 prints the report)."""
    import subprocess
    import sys

    from planner import api

    path = tmp_path / "plan.json"
    api.save(tiny_plan("1f1b"), path)
    endpoint = f"127.0.0.1:{_free_port()}"
    procs = [subprocess.Popen(
        [sys.executable, "-m", "planner.cli", "run", str(path), "--steps", "2", "--check", "--json", "--nnodes", "2",
         "--nproc-per-node", "1", "--node-rank", str(node), "--rdzv-endpoint", endpoint, "--rdzv-id", "two-nodes",
         "--timeout", "20"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for node in (0, 1)]
    outs = [proc.communicate(timeout=180) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], [err[-2000:] for _, err in outs]
    reports = [json.loads(out) for out, _ in outs if out.strip()]
    assert len(reports) == 1 and reports[0]["check_passed"] is True
    assert sum("the node holding global rank 0 prints the report" in err for _, err in outs) == 1
    # per-step progress reached the stderr of the node that holds the last rank
    assert sum("gpt-tiny: step 2/2 loss" in err for _, err in outs) == 1


@pytest.mark.cuda
def test_meshes_on_cuda_with_nccl() -> None:
    """TP2 x PP2 with sequence parallelism and PP2 x FSDP2 on 4 GPUs (NCCL), checked against one process."""
    if torch.cuda.device_count() < 4:
        pytest.skip("needs 4 CUDA devices")
    plans = {"tp2 x pp2 sp": tiny_plan("1f1b", t=2, sequence_parallel=True, model=LLAMA_TINY),
             "pp2 x fsdp2": tiny_plan("1f1b", d=2, zero_stage=3, model=LLAMA_TINY)}
    jobs = _jobs(plans)
    results = launch(jobs, LaunchOptions(device="cuda", timeout_s=60))
    assert results is not None
    for name, job, records in zip(plans, jobs, results):
        report = summarize(job, records)
        assert report["check_passed"], (name, report["max_loss_diff"], report["max_grad_diff"])
        assert report["memory_kind"] == "cuda_allocated" and min(report["peak_memory_bytes"]) > 0


@pytest.mark.cuda
def test_llama_and_mixtral_on_one_gpu() -> None:
    """The Llama- and Mixtral-style models on one GPU (NCCL, fp32 configs), checked against the
    single-process reference on the CPU; peak memory from the CUDA allocator."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    plans = {"llama gpipe": tiny_plan("gpipe", p=1, model=LLAMA_TINY),
             "mixtral gpipe": tiny_plan("gpipe", p=1, model=MIXTRAL_TINY)}
    jobs = _jobs(plans)
    results = launch(jobs, LaunchOptions(device="cuda", nproc_per_node=1, timeout_s=60))
    assert results is not None
    for name, job, records in zip(plans, jobs, results):
        report = summarize(job, records)
        assert report["check_passed"], (name, report["max_loss_diff"], report["max_grad_diff"])
        assert report["memory_kind"] == "cuda_allocated" and report["peak_memory_bytes"][0] > 0
