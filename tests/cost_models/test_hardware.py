"""Hardware presets: devices, node types, cluster specs, errors."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from cost_models import hardware
from planner.errors import InvalidProblemError
from planner.schema import Cluster, Device

REQUIRED_DEVICES = ("a100-40gb", "a100-80gb", "h100", "h200", "v100", "p100", "k80", "ascend-910", "cpu", "h800", "a800",
                    "h100-pcie", "h100-nvl", "l40s")


def _raw() -> dict:
    return json.loads(resources.files("cost_models").joinpath("data/hardware.json").read_text())


@pytest.mark.parametrize("name", REQUIRED_DEVICES)
def test_every_required_device_builds_with_a_source_and_a_node_type(name: str) -> None:
    device = hardware.device_preset(name)
    assert isinstance(device, Device)
    assert device.name == name
    assert device.memory_bytes > 0 and device.peak_flops > 0
    assert device.memory_bandwidth_bytes_per_s is not None
    raw = _raw()
    assert raw["devices"][name]["source"]
    assert raw["nodes"][name]["devices_per_node"] >= 1


def test_a100_peak_is_the_dissertations_312_tflops() -> None:
    # seed 001 L4093-4094: "peak device throughput of an A100 GPU with 16-bit precision is 312 teraFLOP/s"
    assert hardware.device_preset("a100-80gb").peak_flops == 312e12
    assert hardware.device_preset("a100-40gb").peak_flops == 312e12


def test_pre_volta_devices_say_which_precision_their_peak_is() -> None:
    raw = _raw()
    assert "fp16" in raw["devices"]["p100"]["note"]
    assert "fp32" in raw["devices"]["k80"]["note"]


def test_names_are_case_insensitive_and_aliases_resolve() -> None:
    assert hardware.device_preset("A100-80GB") == hardware.device_preset("a100-80gb")
    assert hardware.device_preset("A100").name == "a100-80gb"


def test_unknown_device_lists_valid_names() -> None:
    with pytest.raises(InvalidProblemError, match=r"unknown device preset 'tpu-v9'.*a100-80gb.*h100"):
        hardware.device_preset("tpu-v9")
    with pytest.raises(InvalidProblemError, match="choose from"):
        hardware.cluster_preset("tpu-v9:4")


@pytest.mark.parametrize(
    ("spec", "num_nodes", "per_node"),
    [
        ("a100-80gb", 1, 8),
        ("h100:32", 4, 8),
        ("h100:4", 1, 4),
        ("a100-80gb:1", 1, 1),
        ("a100-80gb:8", 1, 8),
        ("V100:8x4", 8, 4),
        ("cpu", 1, 2),
        ("cpu:3", 1, 3),
        ("cpu:2x2", 2, 2),
        ("ascend-910:16384", 2048, 8),
        ("ascend-910:2048x8", 2048, 8),
    ],
)
def test_cluster_specs(spec: str, num_nodes: int, per_node: int) -> None:
    cluster = hardware.cluster_preset(spec)
    assert isinstance(cluster, Cluster)
    assert (cluster.num_nodes, cluster.devices_per_node) == (num_nodes, per_node)
    assert cluster.num_devices == num_nodes * per_node
    assert cluster.name == f"{cluster.device.name}:{num_nodes}x{per_node}"  # type: ignore[union-attr]


def test_selene_links_intra_nvlink_inter_one_hdr_hca_per_gpu() -> None:
    # seed 001 L4081-4086: 8 A100 per node on NVLink; 8 x 200 Gb/s HDR HCAs per node.
    cluster = hardware.cluster_preset("a100-80gb:16")
    assert cluster.link(0, 7) == (300e9, 5e-6)
    assert cluster.link(0, 8)[0] == pytest.approx(200e9 / 8)


def test_h100_and_h200_nvlink_450_per_direction_and_ndr_400_gbit() -> None:
    for name in ("h100", "h200"):
        cluster = hardware.cluster_preset(f"{name}:16")
        assert cluster.intra_node_bytes_per_s == 450e9
        assert cluster.inter_node_bytes_per_s == pytest.approx(400e9 / 8)


def test_export_and_pcie_variants_differ_from_their_sxm_parts_only_where_the_datasheets_do() -> None:
    """H800 / A800: the H100 / A100 SXM die with NVLink cut to 400 GB/s bidirectional, so a GEMM costs
    the same and a tensor-parallel all-reduce inside the node 2.25x / 1.5x longer; the PCIe parts
    run their own peaks (756 and 835.5 TF/s) at Hopper's constants, and their GPUs talk over PCIe."""
    from cost_models import compute
    from cost_models.collectives import group_allreduce_s

    h100, h800 = hardware.device_preset("h100"), hardware.device_preset("h800")
    assert compute.gemm_time_s(8192, 8192, 8192, h800) == compute.gemm_time_s(8192, 8192, 8192, h100)
    sxm, cut = hardware.cluster_preset("h100:8"), hardware.cluster_preset("h800:8")
    assert group_allreduce_s(cut, 1e9, 8) / group_allreduce_s(sxm, 1e9, 8) == pytest.approx(2.25, rel=0.01)
    a100, a800 = hardware.cluster_preset("a100-80gb:8"), hardware.cluster_preset("a800:8")
    assert group_allreduce_s(a800, 1e9, 8) / group_allreduce_s(a100, 1e9, 8) == pytest.approx(1.5, rel=0.01)
    pcie = hardware.device_preset("h100-pcie")
    big = (16384, 16384, 16384)
    assert compute.gemm_efficiency(*big, pcie) == pytest.approx(compute.gemm_efficiency(*big, h100), rel=0.02)
    assert hardware.cluster_preset("h100-pcie:8").intra_node_bytes_per_s == 63e9
    assert hardware.cluster_preset("l40s:16").num_nodes == 2
    assert hardware.device_preset("H800-SXM").name == "h800"


def test_a_device_count_that_is_not_whole_nodes_is_refused_with_the_nearest_fits() -> None:
    # TYPE:N counts devices; 12 A100s are neither one 8-GPU node nor whole nodes.
    with pytest.raises(InvalidProblemError) as err:
        hardware.cluster_preset("a100-80gb:12")
    message = str(err.value)
    for fit in ("a100-80gb:8", "a100-80gb:16", "a100-80gb:2x6", "a100-80gb:3x4"):
        assert fit in message
    for fit in ("a100-80gb:8", "a100-80gb:16", "a100-80gb:2x6", "a100-80gb:3x4"):
        assert hardware.cluster_preset(fit).num_devices in (8, 12, 16)


def test_every_example_spec_counts_devices() -> None:
    # the listing's descriptions start with NODES x PER_NODE; a bare count there is devices
    for spec, description in hardware.list_cluster_presets().items():
        name, count, per_node = hardware.parse_spec(spec)
        cluster = hardware.cluster_preset(spec)
        if count is not None and per_node is None:
            assert cluster.num_devices == count, spec
        assert description.startswith(f"{cluster.num_nodes} x {cluster.devices_per_node} "), spec


@pytest.mark.parametrize("spec", ["a100:0", "a100:2x0", "a100:", "a100:x4", "a100:2x", ":4", "a100 4", ""])
def test_malformed_specs_are_rejected_with_the_syntax(spec: str) -> None:
    with pytest.raises(InvalidProblemError, match=r"cluster spec|count of 0"):
        hardware.cluster_preset(spec)


def test_listings_cover_every_device_and_every_example_parses() -> None:
    devices = hardware.list_device_presets()
    assert set(REQUIRED_DEVICES) <= set(devices)
    assert "312 TFLOP/s" in devices["a100-80gb"]
    clusters = hardware.list_cluster_presets()
    assert len(clusters) >= 5
    for spec in clusters:
        hardware.cluster_preset(spec)
    assert "312" in hardware.device_note("a100-80gb")
