"""The per-operation compute model, collectives and memory arithmetic, on hand-checked cases."""

from __future__ import annotations

import math

import pytest

from cost_models import collectives as coll
from cost_models import compute, hardware, layer_ops, memory
from cost_models.transformer import decoder_forward_flops
from planner.errors import InvalidProblemError
from planner.schema import ComputeModel, Device, Plan, TransformerConfig

GIB = 2**30
# one SM, one 128 x 128 tile size (halvings are slower), no overheads: easy to count by hand
TOY = Device(name="toy", memory_bytes=GIB, peak_flops=1e12, memory_bandwidth_bytes_per_s=1e11,
             compute=ComputeModel(num_sms=4, gemm_tile_m=128, gemm_tile_n=128, gemm_max_fraction=0.5,
                                  gemm_k_overhead=0, memory_bandwidth_fraction=0.5, kernel_launch_s=0))
A100 = hardware.device_preset("a100-80gb")


def test_gemm_waves_by_hand() -> None:
    # 256 x 256 output = 4 tiles of 128 x 128 = one wave on 4 SMs: 2 * 128 * 128 * K flops per SM
    # at 1e12 / 4 * 0.5 FLOP/s per SM
    k = 1024
    one_wave = 2 * 128 * 128 * k / (1e12 / 4 * 0.5)
    assert compute.gemm_compute_s(256, 256, k, TOY) == pytest.approx(one_wave)
    # 5 tiles: the largest tile needs 2 waves, half tiles (64 x 128, rate 0.9) 10 tiles = 3 waves
    five = compute.gemm_compute_s(640, 128, k, TOY)
    assert five == pytest.approx(min(2 * one_wave, 3 * one_wave / 2 / 0.9, 5 * one_wave / 4 / 0.81))


def test_roofline_bounds_thin_gemms() -> None:
    # a matrix-vector product is memory-bound: bytes (MK + K + M) * 2 over 0.5 x 1e11 B/s
    m, k = 4096, 4096
    expected = 2 * (m * k + k + m) / (0.5 * 1e11)
    fast = TOY.model_copy(update={"peak_flops": 1e18})  # compute negligible: the memory bound shows
    assert compute.gemm_time_s(m, 1, k, fast) == pytest.approx(expected)
    assert compute.gemm_time_s(m, 1, k, TOY) >= expected


def test_efficiency_rises_with_size_and_is_below_the_cap() -> None:
    sizes = [256, 512, 1024, 2048, 4096, 8192]
    eff = [compute.gemm_efficiency(s, s, s, A100) for s in sizes]
    assert eff == sorted(eff) and eff[-1] <= 0.72 and eff[0] < 0.3


def test_tensor_parallelism_lowers_efficiency_and_microbatch_raises_it() -> None:
    cfg = TransformerConfig(name="g", hidden_size=4096, num_layers=1, num_heads=32, seq_length=2048, vocab_size=51200)

    def rate(b: int, t: int) -> float:
        ops = layer_ops.decoder_op_times(cfg, A100, microbatch_size=b, tensor_parallel=t)
        return decoder_forward_flops(cfg, microbatch_size=b, tensor_parallel=t) / (ops.forward_gemm_s * A100.peak_flops)

    assert rate(1, 1) > rate(1, 8)
    small = TransformerConfig(name="s", hidden_size=1024, num_layers=1, num_heads=16, seq_length=256, vocab_size=1000)
    per_sample = [layer_ops.decoder_op_times(small, A100, microbatch_size=b).forward_s / b for b in (1, 4, 16)]
    assert per_sample == sorted(per_sample, reverse=True) and per_sample[0] > 1.2 * per_sample[-1]


def test_unfused_attention_costs_score_traffic() -> None:
    cfg = TransformerConfig(name="g", hidden_size=2048, num_layers=1, num_heads=16, seq_length=2048, vocab_size=1000)
    flash = layer_ops.decoder_op_times(cfg, A100, microbatch_size=1, attention="flash")
    unfused = layer_ops.decoder_op_times(cfg, A100, microbatch_size=1, attention="unfused")
    assert unfused.forward_s > flash.forward_s and unfused.selective_s > flash.selective_s


def test_memory_op_and_optimizer_step() -> None:
    assert compute.memory_op_s(1e9, TOY) == pytest.approx(1e9 / 0.5e11)
    assert compute.optimizer_step_s(1e9, TOY) == pytest.approx(36e9 / 0.5e11)


def test_deepspeed_bf16_gradient_accumulation_pass() -> None:
    """DeepSpeed's BF16 optimizer: cast (2 + 4 B) and add (8 + 4 B) per parameter per microbatch, two
    kernels; none at 0 bytes (Megatron-LM's accumulation inside the weight-gradient GEMM)."""
    assert compute.DEEPSPEED_BF16_ACCUM_BYTES_PER_PARAM == 2 + 4 + 8 + 4
    launch = compute.compute_constants(TOY).kernel_launch_s
    assert compute.grad_accum_pass_s(1e9, TOY, bytes_per_param=18.0) == pytest.approx(18e9 / 0.5e11 + 2 * launch)
    assert compute.grad_accum_pass_s(1e9, TOY, bytes_per_param=0.0) == 0.0


def test_deepspeed_bf16_sync() -> None:
    """fp32 all-reduce (twice a 16-bit one) and, at ZeRO-1, the weights' all-gather (half of one)."""
    assert coll.deepspeed_bf16_sync_s(2.0, 1) == 2 * 2.0 + 1.0
    assert coll.deepspeed_bf16_sync_s(2.0, 0) == 4.0


def test_preset_compute_constants_and_device_override() -> None:
    assert compute.compute_constants(A100).num_sms == 108
    assert compute.compute_constants(hardware.device_preset("h100")).num_sms == 132
    assert compute.compute_constants(Device(name="x", memory_bytes=1, peak_flops=1)).num_sms == 64
    assert compute.peak_flops_per_s(A100, "fp32") == 19.5e12


def test_cluster_file_naming_a_preset_gets_its_bandwidths() -> None:
    # a cluster JSON written with only the contract's device fields, naming a preset: its HBM and
    # host-link bandwidths are the preset's (before, memory-bound kernels ran at 1 byte per FLOP,
    # 153x the HBM rate, and GPT 1.7B came out 35 % faster than on the preset spec)
    bare = Device(name="A100", memory_bytes=A100.memory_bytes, peak_flops=A100.peak_flops)
    assert compute.memory_bandwidth_bytes_per_s(bare) == A100.memory_bandwidth_bytes_per_s
    assert compute.host_link_bytes_per_s(bare) == A100.host_link_bytes_per_s
    assert compute.memory_op_s(1e9, bare) == compute.memory_op_s(1e9, A100)
    # a toy device keeps the flat model's floor; a custom device with per-op constants must say
    toy = Device(name="gpu", memory_bytes=GIB, peak_flops=1e12)
    assert compute.memory_bandwidth_bytes_per_s(toy) == 1e12
    assert compute.host_link_bytes_per_s(toy) is None
    custom = Device(name="mi300x", memory_bytes=GIB, peak_flops=1.3e15, compute=ComputeModel(num_sms=304))
    with pytest.raises(InvalidProblemError, match="memory_bandwidth_bytes_per_s"):
        compute.memory_bandwidth_bytes_per_s(custom)


# ------------------------------------------------------------------------------------------
# Collectives
# ------------------------------------------------------------------------------------------


def test_ring_collectives_by_hand() -> None:
    assert coll.ring_allgather_s(8e9, 8, 1e11, 1e-5) == pytest.approx(7 / 8 * 8e9 / 1e11 + 7e-5)
    assert coll.ring_allreduce_s(8e9, 8, 1e11) == pytest.approx(2 * 7 / 8 * 8e9 / 1e11)
    assert coll.tree_allreduce_s(1e3, 1024, 1e11, 1e-5) == pytest.approx(2e3 / 1e11 + 20e-5)
    # small messages on many ranks: the tree wins; large: the ring
    assert coll.allreduce_s(1e3, 1024, 1e11, 1e-5) < coll.ring_allreduce_s(1e3, 1024, 1e11, 1e-5)
    assert coll.allreduce_s(1e10, 8, 1e11, 1e-5) == coll.ring_allreduce_s(1e10, 8, 1e11, 1e-5)
    assert coll.ring_allreduce_s(1e9, 1, 1e11) == 0.0


def test_hierarchical_allreduce_by_hand() -> None:
    s, g, n = 8e9, 8, 4
    inside = 2 * (7 / 8 * s / 2e11 + 7 * 1e-6)
    across = min(2 * 3 / 4 * (s / 8) / 2e10 + 6e-5, 2 * (s / 8) / 2e10 + 2 * 2 * 1e-5)
    assert coll.hierarchical_allreduce_s(s, g, n, 2e11, 2e10, 1e-6, 1e-5) == pytest.approx(inside + across)


def test_group_allreduce_uses_nvlink_inside_a_node() -> None:
    cluster = hardware.cluster_preset("a100-80gb:16")
    inside = coll.group_allreduce_s(cluster, 1e9, 8)
    assert inside == pytest.approx(coll.allreduce_s(1e9, 8, 300e9 * 0.8, 5e-6))
    assert coll.group_allreduce_s(cluster, 1e9, 16) > inside


def test_group_allgather_runs_one_flat_ring_by_hand() -> None:
    """128 A100s (16 nodes of 8): the bytes move as the two-level split (1/16 of S over an NVLink
    ring of 8, 1/8 of S over a ring of the 16 nodes at 25 GB/s per rail, both at 0.8), the latency
    is NCCL's flat ring's: 127 steps, 15 across nodes (10 us) and 112 inside (5 us)."""
    cluster = hardware.cluster_preset("a100-80gb:128")
    s = 1e9
    moved = 7 / 8 * (s / 16) / (300e9 * 0.8) + 15 / 16 * (s / 8) / (25e9 * 0.8)
    assert coll.group_allgather_s(cluster, s, 128) == pytest.approx(moved + 112 * 5e-6 + 15 * 1e-5)
    assert coll.group_allgather_s(cluster, 0.0, 128) == 0.0  # nothing to gather: no ring runs (dense layers' experts)
    # inside one node: a plain ring of 8
    assert coll.group_allgather_s(cluster, s, 8) == pytest.approx(7 / 8 * s / (300e9 * 0.8) + 7 * 5e-6)
    # a small gather at scale is latency-bound: 128 ranks take about 9x the time of 16
    small = [coll.group_allgather_s(cluster, 1e5, n) for n in (16, 128)]
    assert small[1] / small[0] == pytest.approx((112 * 5e-6 + 15e-5 + 1e5 / 16 * (7 / 8) / 240e9
                                                 + 1e5 / 8 * (15 / 16) / 20e9)
                                                / (14 * 5e-6 + 1e-5 + 1e5 / 2 * (7 / 8) / 240e9
                                                   + 1e5 / 8 * (1 / 2) / 20e9), rel=1e-9)


def test_exposed_dp_allreduce() -> None:
    assert coll.exposed_dp_allreduce_s(4.0, 10.0, num_buckets=4) == pytest.approx(1.0)
    assert coll.exposed_dp_allreduce_s(4.0, 1.0, num_buckets=4) == pytest.approx(1.0 + 2.0)
    assert coll.exposed_dp_allreduce_s(4.0, 10.0, overlap=False) == 4.0


# ------------------------------------------------------------------------------------------
# Memory
# ------------------------------------------------------------------------------------------


def test_default_headroom_and_usable_memory() -> None:
    assert memory.usable_memory_bytes(A100) == pytest.approx(80 * GIB - 1 * GIB - 4 * GIB)
    v100_16 = A100.model_copy(update={"memory_bytes": 16 * GIB})
    assert memory.headroom_bytes(v100_16) == pytest.approx(0.8 * GIB + 0.8 * GIB)
    assert memory.usable_memory_bytes(A100.model_copy(update={"memory_headroom_bytes": 0})) == 80 * GIB


@pytest.mark.parametrize("text,expected", [("0.1", 8 * GIB), ("6GiB", 6 * GIB), ("512MiB", 0.5 * GIB),
                                           ("2", 2 * GIB), ("0", 0.0)])
def test_parse_headroom(text: str, expected: float) -> None:
    assert memory.parse_headroom(text, 80 * GIB) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["lots", "-1", "80GiB", "0.1 TiB"])
def test_parse_headroom_rejects(text: str) -> None:
    with pytest.raises(InvalidProblemError, match="memory-headroom"):
        memory.parse_headroom(text, 80 * GIB)


def test_zero_stages_shard_model_states() -> None:
    assert memory.model_state_bytes_per_param() == 16
    assert memory.model_state_bytes_per_param(zero_stage=1, data_parallel=4) == 2 + 2 + 3
    assert memory.model_state_bytes_per_param(zero_stage=2, data_parallel=4) == 2 + 0.5 + 3
    assert memory.model_state_bytes_per_param(zero_stage=3, data_parallel=4) == 4
    assert memory.model_state_bytes_per_param(optimizer="sgd") == 12
    assert memory.zero_static_scale(3, 4) == pytest.approx(0.25)
    with pytest.raises(InvalidProblemError):
        memory.model_state_bytes_per_param(optimizer="lion")


def test_simulator_honours_zero_stage() -> None:
    from cost_models.simulate import simulate
    from planner import api

    plan = api.plan(api.make_problem("gpt-tiny", "a100-80gb:8", global_batch_size=8, num_stages=2), solver="even")
    sharded = Plan.from_dict({**plan.model_dump(), "zero_stage": 3})
    d = plan.degrees.data
    base, zero = simulate(plan, include_events=False), simulate(sharded, include_events=False)
    static = [math.fsum(plan.model.layers[i].static_bytes for c in s.chunks for i in range(*c.layers))
              for s in plan.stages]
    # ZeRO-3 shards the states over d but holds the running and the prefetched layer unsharded
    gathered = [2 * max(plan.model.layers[i].param_bytes for c in s.chunks for i in range(*c.layers))
                for s in plan.stages]
    for a, b, st, g in zip(base.stages, zero.stages, static, gathered):
        assert a.peak_memory_bytes - b.peak_memory_bytes == pytest.approx(st * (1 - 1 / d) - g)


def test_backward_tensor_parallel_collectives_hide_behind_weight_gradients() -> None:
    """Megatron-LM's async TP all-reduce (Korthikanti et al. Sec. 6.2): with overlap each of the two
    backward collectives exposes only what exceeds half the layer's weight-gradient time."""
    from cost_models.layer_ops import decoder_op_times
    from planner import api

    cfg = api.load_model("gpt3-175b")
    device = api.load_cluster("a100-80gb:8").device
    kw = {"microbatch_size": 1, "tensor_parallel": 8, "tp_link_bytes_per_s": 300e9}
    plain = decoder_op_times(cfg, device, **kw)
    hidden = decoder_op_times(cfg, device, **kw, overlap_tp_backward=True)
    assert plain.backward_comm_s == plain.forward_comm_s > 0
    assert hidden.backward_comm_s == 2 * max(0.0, plain.backward_comm_s / 2 - plain.backward_weight_s / 2)
    assert hidden.backward_input_s == pytest.approx(plain.backward_input_s - plain.backward_comm_s + hidden.backward_comm_s)
    assert hidden.backward_comm_s < plain.backward_comm_s
    assert hidden.forward_s == plain.forward_s and hidden.backward_weight_s == plain.backward_weight_s
