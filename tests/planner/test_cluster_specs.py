"""One cluster shorthand in every command: ``TYPE:N`` is N devices, ``TYPE:NxM`` N nodes of M
(docs/input-formats.md, Cluster specs); each command prints what its spec expanded to."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from planner import api
from planner.cli_gavel import load_worker_types
from planner.errors import InvalidProblemError
from tests.planner.contract_helpers import refused, run_cli


@pytest.mark.parametrize(("spec", "nodes", "per_node"), [
    ("v100:1", 1, 1), ("v100:8", 1, 8), ("v100:64", 8, 8), ("v100:2x4", 2, 4), ("v100", 1, 8), ("cpu:6", 1, 6)])
def test_plan_and_scheduling_commands_read_a_spec_as_the_same_device_count(spec: str, nodes: int, per_node: int) -> None:
    cluster = api.load_cluster(spec)
    assert (cluster.num_nodes, cluster.devices_per_node) == (nodes, per_node)
    name = spec.split(":")[0]
    assert load_worker_types(spec) == {name: nodes * per_node}


def test_scheduling_lists_sum_repeated_types_and_read_nodes_x_per_node() -> None:
    assert load_worker_types("v100:2x4,k80:3,v100:1") == {"v100": 9, "k80": 3}


def test_plan_prints_the_expansion() -> None:
    outcome = run_cli(["plan", "--model", "gpt-tiny", "--cluster", "a100-80gb:16", "--pipeline", "2", "--global-batch", "16"])
    assert outcome.code == 0, outcome.err
    assert "cluster a100-80gb:16 -> 2 nodes x 8 a100-80gb = 16 devices" in outcome.err


def test_scheduling_commands_print_the_expansion() -> None:
    outcome = run_cli(["schedule", "--jobs", "small_test", "--cluster", "v100:2x2,k80:1", "--policy", "fifo"])
    assert outcome.code == 0, outcome.err
    assert "cluster v100:2x2,k80:1 -> 4 v100 + 1 k80 = 5 accelerators" in outcome.err


def test_a_count_that_is_not_whole_nodes_is_refused_with_fits_in_plan() -> None:
    refused(["plan", "--model", "gpt-tiny", "--cluster", "a100-80gb:12"], "a100-80gb:12", "a100-80gb:16", "a100-80gb:2x6")


def test_a_type_without_count_or_preset_is_refused_in_scheduling() -> None:
    with pytest.raises(InvalidProblemError, match="tpu-x:N"):
        load_worker_types("v100:2,tpu-x")
    assert load_worker_types("v100") == {"v100": 8}  # one standard node, as in plan


def test_every_cluster_spec_in_the_readme_and_docs_parses() -> None:
    root = Path(__file__).parents[2]
    texts = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    specs = {m.group(1).strip("`'\")") for path in texts for m in re.finditer(r"--cluster[ =](\S+)", path.read_text())}
    checked = 0
    for spec in sorted(specs):
        if spec.endswith(".json") or not re.match(r"^[a-z0-9-]+(:[0-9x]+)?(,[a-z0-9-]+:[0-9x]+)*$", spec):
            continue  # files and placeholders (C, FILE)
        if "," in spec:
            load_worker_types(spec)
        else:
            api.load_cluster(spec)
        checked += 1
    assert checked >= 10, specs
