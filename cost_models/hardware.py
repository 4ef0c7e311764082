"""Hardware presets: devices and homogeneous clusters of nodes.

Every number lives in ``cost_models/data/hardware.json`` with its source (vendor datasheets;
the PTD-P dissertation, seed 001 L4081-4098, for Selene's A100 nodes: 312 TF/s per GPU, 8 GPUs
per node on NVLink/NVSwitch, one 200 Gb/s HDR HCA per GPU). This module only looks them up
and assembles ``planner.schema.Device`` and ``Cluster`` objects.

Cluster specs (case-insensitive), one convention for every command (docs/input-formats.md,
Cluster specs):

- ``<device>``: one node of the device's usual size (8 GPUs);
- ``<device>:<N>``: N devices: one node of N when N fits a node, else N / node-size whole
  nodes (a count that is not a whole number of nodes is refused with the nearest fits);
- ``<device>:<num_nodes>x<devices_per_node>``: explicit node size;
- ``cpu:<N>``: one host with N CPU workers (gloo-like links), for the runtime bridge.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from importlib import resources
from typing import Any

from planner.errors import InvalidProblemError
from planner.schema import Cluster, ComputeModel, Device

# Documentation keys kept in the JSON next to the numbers but not part of the schema types.
_DOC_KEYS = frozenset({"description", "note", "source"})
_SPEC_RE = re.compile(r"^(?P<device>[a-z0-9][a-z0-9._-]*)(?::(?P<a>\d+)(?:x(?P<b>\d+))?)?$")


@lru_cache(maxsize=1)
def _presets() -> dict[str, Any]:
    text = resources.files("cost_models").joinpath("data/hardware.json").read_text(encoding="utf-8")
    return json.loads(text)


def _canonical_device(name: str) -> str:
    """Lower-case, resolve aliases, and reject unknown names with the list of valid ones."""
    data = _presets()
    key = name.strip().lower()
    key = data["aliases"].get(key, key)
    if key not in data["devices"]:
        valid = sorted(data["devices"]) + sorted(data["aliases"])
        raise InvalidProblemError(f"unknown device preset {name!r}; choose from {valid}")
    return key


def device_preset(name: str) -> Device:
    """The ``Device`` of a hardware preset.

    Args:
        name: a preset name such as ``a100-80gb``, ``h100`` or ``cpu`` (case-insensitive;
            aliases such as ``a100`` are accepted).

    Returns:
        The device with its memory, dense 16-bit peak and bandwidths.

    Raises:
        InvalidProblemError: the name is not a preset; the message lists the valid names.
    """
    key = _canonical_device(name)
    entry = _presets()["devices"][key]
    fields = {k: v for k, v in entry.items() if k not in _DOC_KEYS and k != "compute"}
    return Device.from_dict({"name": key, **fields})


def preset_compute(name: str) -> ComputeModel | None:
    """The per-operation compute constants of a device preset (None for an unknown name).

    Presets do not embed them in their ``Device`` (plans stay small); ``cost_models.compute``
    looks them up by the device's name when the device carries none of its own."""
    key = _presets()["aliases"].get(name.strip().lower(), name.strip().lower())
    entry = _presets()["devices"].get(key, {}).get("compute")
    if entry is None:
        return None
    return ComputeModel.from_dict({k: v for k, v in entry.items() if k not in _DOC_KEYS})


def preset_device_field(name: str, field: str) -> Any:
    """A field of the device preset called ``name`` (aliases resolved, case-insensitive); None when
    the name is not a preset or the preset leaves the field unset. A cluster file whose device
    names a preset but omits, say, its HBM bandwidth gets the preset's (``cost_models.compute``)."""
    key = _presets()["aliases"].get(name.strip().lower(), name.strip().lower())
    return _presets()["devices"].get(key, {}).get(field)


def parse_spec(spec: str) -> tuple[str, int | None, int | None]:
    """``(name, count, per_node)`` of ``<name>[:<count>[x<per_node>]]`` (lower-cased, counts >= 1).

    The one parser of cluster shorthand: ``cluster_preset`` (``plan`` and the Python API) and
    the Gavel commands' ``type:count`` lists both read their parts with it. ``count`` is
    devices when ``per_node`` is None, else nodes. The name is not checked against presets.

    Raises:
        InvalidProblemError: malformed spec or a count of zero.
    """
    match = _SPEC_RE.match(spec.strip().lower())
    if match is None:
        raise InvalidProblemError(
            f"cannot parse cluster spec {spec!r}; write <device>, <device>:<num_devices> or "
            f"<device>:<num_nodes>x<devices_per_node> (e.g. 'a100-80gb:64', 'h100:2x8', 'cpu:2')"
        )
    a = int(match.group("a")) if match.group("a") else None
    b = int(match.group("b")) if match.group("b") else None
    for value in (a, b):
        if value is not None and value < 1:
            raise InvalidProblemError(f"cluster spec {spec!r} has a count of 0; counts must be at least 1")
    return match.group("device"), a, b


def node_shape(spec: str, device: str, num_devices: int, node_size: int) -> tuple[int, int]:
    """``(num_nodes, devices_per_node)`` of ``num_devices`` devices on nodes of ``node_size``.

    Up to one node: one node of ``num_devices``; a multiple of the node size: whole nodes;
    anything else is refused with the nearest counts that fit and the explicit form.
    """
    from planner.schema_io import MAX_DEVICES, bounded

    bounded(f"devices in cluster spec {spec!r}", num_devices, MAX_DEVICES, "set above the largest published training clusters")
    if num_devices <= node_size:
        return 1, num_devices
    if num_devices % node_size == 0:
        return num_devices // node_size, node_size
    lower, upper = num_devices // node_size * node_size, -(-num_devices // node_size) * node_size
    shapes = [f"{device}:{n}x{num_devices // n}" for n in range(2, min(num_devices, 64) + 1)
              if num_devices % n == 0 and num_devices // n <= node_size][:2]
    alternatives = ", ".join([f"{device}:{lower}", f"{device}:{upper}", *shapes])
    raise InvalidProblemError(
        f"cluster spec {spec!r} asks for {num_devices:,} devices, which is not a whole number of "
        f"{node_size}-device {device} nodes; write {alternatives} (NODESxPER_NODE sets the node size)"
    )


def cluster_preset(spec: str) -> Cluster:
    """A homogeneous cluster from a preset spec.

    Args:
        spec: ``<device>`` (one node), ``<device>:<num_devices>``,
            ``<device>:<num_nodes>x<devices_per_node>`` or ``cpu:<N>`` (one host with N CPU
            workers).

    Returns:
        The cluster, named by its normalized spec (e.g. ``a100-80gb:2x8``), with per-device,
        per-direction intra- and inter-node bandwidths and latencies of the device's node type.

    Raises:
        InvalidProblemError: malformed spec, zero count, a device count that is not a whole
            number of nodes, or unknown device (the message lists the valid device names).
    """
    device_name, a, b = parse_spec(spec)
    key = _canonical_device(device_name)
    node = _presets()["nodes"][key]
    if b is not None:
        num_nodes, per_node = a or 1, b
    elif a is None:
        num_nodes, per_node = 1, int(node["devices_per_node"])
    elif key == "cpu":
        num_nodes, per_node = 1, a  # cpu:N counts workers on one host
    else:
        num_nodes, per_node = node_shape(spec, key, a, int(node["devices_per_node"]))
    link = {k: v for k, v in node.items() if k not in _DOC_KEYS and k != "devices_per_node"}
    return Cluster.from_dict(
        {
            "name": f"{key}:{num_nodes}x{per_node}",
            "device": device_preset(key).model_dump(),
            "num_nodes": num_nodes,
            "devices_per_node": per_node,
            **link,
        }
    )


def list_device_presets() -> dict[str, str]:
    """Device preset names with a one-line description (memory, peak, links)."""
    data = _presets()
    out: dict[str, str] = {}
    for key, entry in data["devices"].items():
        node = data["nodes"][key]
        out[key] = (
            f"{entry['description']}: {entry['memory_bytes'] / 2**30:.0f} GiB, "
            f"{entry['peak_flops'] / 1e12:g} TFLOP/s, {node['devices_per_node']} per node, "
            f"{node['intra_node_bytes_per_s'] / 1e9:g} GB/s intra-node, "
            f"{node['inter_node_bytes_per_s'] / 1e9:g} GB/s inter-node per device"
        )
    return out


def list_cluster_presets() -> dict[str, str]:
    """Example cluster specs with a description; any ``<device>:<devices>`` or ``<device>:<nodes>x<per node>`` works."""
    out: dict[str, str] = {}
    for spec, why in _presets()["cluster_examples"].items():
        cluster = cluster_preset(spec)
        device = _canonical_device(spec.split(":", 1)[0])
        out[spec] = f"{cluster.num_nodes} x {cluster.devices_per_node} {device}: {why}"
    return out


def device_note(name: str) -> str:
    """The documentation kept with a device preset (source and caveats), for docs and ``presets``."""
    entry = _presets()["devices"][_canonical_device(name)]
    return "; ".join(str(entry[k]) for k in ("note", "source") if k in entry)
