"""Hand-checked parallel-dimension formulas (cost_models.parallelism)."""

from __future__ import annotations

import pytest

from cost_models import moe, parallelism as par
from cost_models.models import model_preset
from cost_models.transformer import allreduce_time_s
from planner.errors import InvalidProblemError

GB = 1e9


def test_zero_figure_1() -> None:
    """ZeRO Fig. 1: Psi = 7.5B, N = 64, K = 12: 120, 31.4, 16.6 and 1.9 GB per device."""
    expected = {0: 120.0, 1: 31.4, 2: 16.6, 3: 1.9}
    for stage, gb in expected.items():
        got = par.zero_state_bytes_per_rank(7.5e9, data_parallel=64, zero_stage=stage) / GB
        assert got == pytest.approx(gb, abs=0.05), stage


def test_zero_llama2_7b_on_8_gpus() -> None:
    """The issue's case: 6.74B parameters, d = 8. DDP needs 107.8 GB of states (more than an 80 GB H100);
    ZeRO-1 needs 2 x 2 x 6.74 + 12 x 6.74 / 8 = 37.1 GB."""
    psi = moe.num_parameters(model_preset("llama2-7b"))
    assert par.zero_state_bytes_per_rank(psi, data_parallel=8, zero_stage=0) == 16 * psi
    assert par.zero_state_bytes_per_rank(psi, data_parallel=8, zero_stage=1) == pytest.approx(4 * psi + 1.5 * psi)
    assert par.zero_state_bytes_per_rank(psi, data_parallel=8, zero_stage=3) == pytest.approx(2 * psi)


def test_zero_communication_volumes() -> None:
    """ZeRO Sec. 7.2: stages 0-2 move 2 Psi, stage 3 moves 3 Psi (1.5x), times (N-1)/N per rank."""
    psi = 1e9
    for stage in (0, 1, 2):
        assert par.zero_comm_bytes_per_rank(psi, data_parallel=4, zero_stage=stage) == 2 * 2 * psi * 3 / 4
    assert par.zero_comm_bytes_per_rank(psi, data_parallel=4, zero_stage=3) == 3 * 2 * psi * 3 / 4
    # the DDP volume is exactly the ring all-reduce's bytes: time at 1 B/s equals the volume
    assert allreduce_time_s(2 * psi, 4, 1.0) == par.zero_comm_bytes_per_rank(psi, data_parallel=4, zero_stage=0)
    assert par.zero_comm_bytes_per_rank(psi, data_parallel=1, zero_stage=3) == 0
    with pytest.raises(InvalidProblemError, match="zero_stage=4"):
        par.zero_state_bytes_per_rank(psi, data_parallel=2, zero_stage=4)


def test_fsdp_prefetch_overlap() -> None:
    # first all-gather exposed (2); then 3 vs compute 5 -> 0; 6 vs compute 1 -> 5; 1 vs 4 -> 0
    assert par.fsdp_exposed_comm_s([2, 3, 6, 1], [5, 1, 4, 9]) == 2 + 0 + 5 + 0
    assert par.fsdp_exposed_comm_s([], []) == 0
    with pytest.raises(InvalidProblemError):
        par.fsdp_exposed_comm_s([1.0], [])


def test_fsdp_sm_contention() -> None:
    """A collective holding a quarter of the SMs lengthens the compute it runs under by a quarter of
    each overlapped stretch min(t_ag[i], t_compute[i-1]): 3 under 5 -> 0.75, 6 under 1 -> 0.25,
    1 under 4 -> 0.25; the first gather overlaps nothing."""
    # pairs (ag, c) = (3, 5), (6, 1), (1, 4): the compute under a gather runs at 0.75 of its speed, so
    # it grows by 0.25 min(ag, c / 0.75) and the next unit waits for the later of it and the gather
    assert par.fsdp_exposed_comm_s([2, 3, 6, 1], [5, 1, 4, 9], sm_share=0.25) == pytest.approx(2 + 0.75 + 5 + 0.25)
    # a gather a little longer than the compute (c < ag < c / 0.75): the slowed compute ends last
    assert par.fsdp_exposed_comm_s([0, 1.2], [1, 1], sm_share=0.25) == pytest.approx(0.25 * 1.2)
    assert par.fsdp_exposed_comm_s([2, 3], [5, 1], sm_share=0.0) == 2
    with pytest.raises(InvalidProblemError, match="sm_share"):
        par.fsdp_exposed_comm_s([1.0, 1.0], [1.0, 1.0], sm_share=1.0)


def test_collective_sm_share_of_the_presets() -> None:
    """NCCL's 24 CTAs ([nccl-a100-channels], [nccl-overlap-trace]) of the A100's 108 and the H100's
    132 SMs; devices without compute constants (the nominal cpu preset) have none to share."""
    from cost_models.compute import NCCL_COLLECTIVE_CTAS, collective_sm_share
    from cost_models.hardware import device_preset

    assert NCCL_COLLECTIVE_CTAS == 24
    assert collective_sm_share(device_preset("a100-80gb")) == 24 / 108
    assert collective_sm_share(device_preset("h100")) == 24 / 132
    assert collective_sm_share(device_preset("cpu")) == 0.0


def test_ring_attention_volumes_llama3_8b() -> None:
    """Llama 3 8B at 128K tokens on c = 8: K/V width 8 x 128 = 1024, blocks of 16384 tokens, bf16:
    7 steps x 2 (K, V) x 16384 x 1024 x 2 bytes = 469.8 MB forward, twice that backward."""
    cfg = model_preset("llama3-8b")
    kv_width = cfg.kv_heads * cfg.head_size
    fwd, bwd = par.ring_attention_kv_bytes_per_rank(
        microbatch_size=1, seq_length=131072, kv_width=kv_width, context_parallel=8
    )
    assert fwd == 7 * 2 * 16384 * 1024 * 2 == 469_762_048
    assert bwd == 2 * fwd
    assert par.ring_attention_kv_bytes_per_rank(microbatch_size=1, seq_length=8, kv_width=4, context_parallel=1) == (
        0,
        0,
    )
    assert par.ring_attention_exposed_s(block_compute_s=1.0, block_transfer_s=1.5, context_parallel=8) == 3.5
    assert par.ring_attention_exposed_s(block_compute_s=2.0, block_transfer_s=1.5, context_parallel=8) == 0
    assert par.context_parallel_activation_bytes(8e9, context_parallel=8) == 1e9
    with pytest.raises(InvalidProblemError, match=r"seq_length=100 is not divisible by 2 x context_parallel = 16"):
        par.check_context_split(100, 8)


def test_expert_parallel_volumes_and_weights() -> None:
    """Mixtral 8x7B, e = 8: 4096 tokens per rank x top-2 x h 4096 x 2 bytes x 7/8 = 58.7 MB per dispatch."""
    cfg = model_preset("mixtral-8x7b")
    sent = par.expert_alltoall_bytes_per_rank(
        tokens_per_rank=4096, hidden_size=cfg.hidden_size, experts_per_token=2, expert_parallel=8
    )
    assert sent == 4096 * 2 * 4096 * 2 * 7 / 8 == 58_720_256
    assert (
        par.expert_alltoall_bytes_per_rank(tokens_per_rank=10, hidden_size=4, experts_per_token=2, expert_parallel=1)
        == 0
    )
    # DeepSeek-V3 on EP64: 4 experts per rank, 3 x 7168 x 2048 weights each
    ds = model_preset("deepseek-v3")
    per_expert = moe.expert_params(ds)
    assert per_expert == 3 * 7168 * 2048
    assert (
        par.expert_params_per_rank(num_experts=256, params_per_expert=per_expert, expert_parallel=64) == 4 * per_expert
    )
    assert (
        par.expert_params_per_rank(num_experts=8, params_per_expert=10.0, expert_parallel=4, expert_tensor_parallel=2)
        == 10.0
    )
    with pytest.raises(InvalidProblemError, match="num_experts=8 is not divisible by expert_parallel=3"):
        par.expert_params_per_rank(num_experts=8, params_per_expert=1.0, expert_parallel=3)
    assert (
        par.expert_tensor_parallel_bytes_per_rank(routed_tokens_per_rank=100, hidden_size=8, expert_tensor_parallel=4)
        == 2 * 100 * 8 * 2 * 3 / 4
    )


def test_expert_load_factor() -> None:
    assert par.expert_load_time_factor(load_balance_factor=1.3) == 1.3
    assert par.expert_load_time_factor(load_balance_factor=1.3, capacity_factor=1.25) == 1.25
    assert par.expert_load_time_factor(load_balance_factor=1.0, capacity_factor=1.25) == 1.25
    with pytest.raises(InvalidProblemError, match="at least 1"):
        par.expert_load_time_factor(load_balance_factor=0.9)


def test_llama3_405b_uneven_ends() -> None:
    """Llama 3 Sec. 3.3.2: 126 layers on 16 stages, one layer fewer on the first and the last."""
    assert par.end_stage_layers(126, 16, first=7, last=7) == [7] + [8] * 14 + [7]
    assert par.balanced_end_stage_layers(126, 16, embedding_layers=1.0, head_layers=1.0) == [7] + [8] * 14 + [7]
    # a head worth 2 layers: loads [7, 9, 9, 7 + 2] peak at 9, the least possible ([8, 8, 8, 8] peaks at
    # 10); [9, 8, 8, 7] also peaks at 9 with the same spread, and the smaller first stage is kept
    assert par.balanced_end_stage_layers(32, 4, embedding_layers=0.0, head_layers=2.0) == [7, 9, 9, 7]
    with pytest.raises(InvalidProblemError, match="divisible by num_stages - 2"):
        par.end_stage_layers(126, 16, first=6, last=7)
    assert par.layers_equivalent(3.0, 1.5) == 2.0


def test_deepseek_v3_states_on_its_published_layout() -> None:
    """DeepSeek-V3's PP16 x EP64 x ZeRO-1 on 2048 GPUs (V3 report Sec. 3.2): 58 MoE layers x 256 experts
    x 3 x 7168 x 2048 = 653.9B expert weights over p e = 1024 ranks, sharded over 2 expert-DP ranks;
    17.1B dense weights over 16 stages, sharded over d = 128: 4.37 + 6.39 = 10.8 GB per GPU (the main
    model; its multi-token-prediction module adds a 59th MoE block's experts, below)."""
    with_mtp = model_preset("deepseek-v3")
    cfg = with_mtp.model_copy(update={"mtp_layers": 0})
    experts = 58 * 256 * 3 * 7168 * 2048
    dense = moe.num_parameters(cfg) - experts
    got = par.model_state_bytes_per_rank(cfg, pipeline=16, data=128, expert=64, zero_stage=1)
    assert got["expert_bytes"] == pytest.approx((4 + 12 / 2) * experts / 1024)
    assert got["dense_bytes"] == pytest.approx((4 + 12 / 128) * dense / 16)
    assert got["total_bytes"] / GB == pytest.approx(10.76, abs=0.01)
    mtp = par.model_state_bytes_per_rank(with_mtp, pipeline=16, data=128, expert=64, zero_stage=1)
    assert mtp["expert_bytes"] == pytest.approx(got["expert_bytes"] * 59 / 58)
    assert mtp["dense_bytes"] == pytest.approx(
        (4 + 12 / 128) * (moe.num_parameters(with_mtp) - experts * 59 / 58) / 16)
    # without expert parallelism and ZeRO, a stage's states alone need 16 x 671B / 16 = 671 GB
    assert par.model_state_bytes_per_rank(cfg, pipeline=16, data=128)["total_bytes"] == pytest.approx(
        16 * moe.num_parameters(cfg) / 16
    )
    with pytest.raises(InvalidProblemError, match="num_experts=256 is not divisible by expert=3"):
        par.model_state_bytes_per_rank(cfg, pipeline=16, data=3, expert=3)
    with pytest.raises(InvalidProblemError, match="carved out of the t d c / etp ranks of a stage"):
        par.model_state_bytes_per_rank(cfg, pipeline=16, data=2, expert=8)


def test_ring_volume_of_mla_uses_the_expanded_heads() -> None:
    """DeepSeek-V3 under context parallelism: K is 128 x (128 + 64) wide, V 128 x 128 per token."""
    cfg = model_preset("deepseek-v3")
    k, v = moe.attention_kv_widths(cfg)
    assert (k, v) == (128 * 192, 128 * 128)
    fwd, _ = par.ring_attention_kv_bytes_per_rank(
        microbatch_size=1, seq_length=4096, kv_width=(k + v) // 2, context_parallel=4
    )
    assert fwd == 3 * 1024 * (k + v) * 2
    assert moe.attention_kv_widths(model_preset("llama3-8b")) == (1024, 1024)
