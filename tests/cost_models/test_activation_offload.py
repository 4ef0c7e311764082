"""Activation offloading (``cost_models.activation_offload``): the exposed copy time by hand, the
device memory it frees, no host link = exit 2, and the ptdp search taking it where the host link
hides the copies (GB200's NVLink-C2C) and not where it does not (a PCIe H100 at b = 4)."""

from __future__ import annotations

import pytest

from cost_models import activation_offload as ao
from cost_models import hardware
from cost_models.offload import DEFAULT_PINNED_EFFICIENCY
from cost_models.transformer import transformer_profile
from planner import api
from planner.errors import InvalidProblemError
from planner.schema import Device, LayerProfile, RecomputeOption
from solvers import ptdp

GIB = 2**30


def test_exposed_copy_time_by_hand() -> None:
    """A layer keeping 10 GB, 0.1 s forward and 0.3 s backward, over a 100 GB/s link at 0.8:
    each copy takes 10 / 80 = 0.125 s, 0.025 s more than the forward and hidden under the backward."""
    layer = LayerProfile(name="decoder0", kind="decoder", forward_s=0.1, backward_s=0.3,
                         recompute={"none": RecomputeOption(activation_bytes=10e9, extra_s=0.0),
                                    "full": RecomputeOption(activation_bytes=0.5e9, extra_s=0.1)})
    option = ao.offload_option(layer, 100e9 * DEFAULT_PINNED_EFFICIENCY)
    assert option.extra_s == pytest.approx(0.025)
    assert option.activation_bytes == 0.5e9  # the layer input, as full recompute keeps
    fast = ao.offload_option(layer, 1e12)
    assert fast.extra_s == 0.0


def test_profile_offers_offload_on_decoders_only() -> None:
    gb200 = hardware.device_preset("gb200")
    profile = transformer_profile(api.load_model("llama3-70b"), device=gb200, microbatch_size=1,
                                  activation_offload=True)
    assert all((ao.OFFLOAD in layer.strategies()) == (layer.kind == "decoder") for layer in profile.layers)
    decoder = profile.layers[1].strategies()
    # NVLink-C2C (450 GB/s) hides a 70B layer's copies under its own compute; the bytes leave the GPU
    assert decoder[ao.OFFLOAD].extra_s == 0.0
    assert decoder[ao.OFFLOAD].activation_bytes < decoder["none"].activation_bytes / 10


def test_host_memory_bounds_what_is_offloaded() -> None:
    """H100s with a C2C-class host link (900 GB/s), so that offloading hides its copies and wins over
    full recompute: with 256 GiB of host memory per GPU ptdp offloads Llama 3 8B's 32 layers (about
    1 GiB each at b = 1); with 8 GiB it cannot, and recomputes instead."""
    cluster = api.load_cluster("h100:8")

    def chosen(host_gib: float) -> str:
        device = cluster.device.model_copy(update={"host_memory_bytes": host_gib * GIB, "host_link_bytes_per_s": 900e9})
        problem = api.make_problem("llama3-8b", cluster.model_copy(update={"device": device}), global_batch_size=64)
        return ptdp.solve(problem, options={"recompute": "offload,full", "tensor_parallel": 1, "pipeline_parallel": 1,
                                            "microbatch_size": 1, "num_simulated": 1}).candidates[0]["recompute"]

    assert chosen(256) == ao.OFFLOAD
    assert chosen(8) == "full"


def test_no_host_link_is_refused_naming_the_field() -> None:
    toy = Device(name="gpu", memory_bytes=80 * GIB, peak_flops=1e15, memory_bandwidth_bytes_per_s=3e12)
    with pytest.raises(InvalidProblemError, match="host_link_bytes_per_s"):
        ao.offload_bandwidth_bytes_per_s(toy)


def test_ptdp_offloads_where_the_copies_hide() -> None:
    """Llama 3 70B on 64 GB200 (FSDP, as Megatron-Bridge's recipes run it with activations in Grace
    memory): offloading is listed, chosen, and faster than the best plan without it; on 8 H100s at
    b = 4 over PCIe the copies cost more than recomputing, so listing it changes nothing."""
    problem = api.make_problem("llama3-70b", "gb200:64", global_batch_size=512)
    kept = ptdp.solve(problem, options={"recompute": "none,selective,modules,full", "num_simulated": 2}).candidates[0]
    offloaded = ptdp.solve(problem, options={"recompute": "none,selective,modules,full,offload",
                                             "num_simulated": 2}).candidates[0]
    assert offloaded["recompute"] == ao.OFFLOAD
    assert float(offloaded["iteration_s"]) < float(kept["iteration_s"])
    assert float(offloaded["peak_memory_gib"]) < float(kept["peak_memory_gib"])
    # what goes to host memory fits the Grace memory behind each GPU (240 GiB); at b = 8 without a
    # pipeline (1.5 TB per GPU) it would not, and that configuration is not offered
    assert ao.host_memory_bytes(problem.cluster.device) == 240 * GIB
    assert not (offloaded["p"] == 1 and offloaded["b"] == 8)
    h100 = api.make_problem("llama3-8b", "h100:8", global_batch_size=64)
    options = {"microbatch_size": 4, "tensor_parallel": 1, "pipeline_parallel": 1, "num_simulated": 1}
    without = ptdp.solve(h100, options={**options, "recompute": "none,full"}).candidates[0]
    listed = ptdp.solve(h100, options={**options, "recompute": "none,full,offload"}).candidates[0]
    assert listed["recompute"] == without["recompute"] == "full"
