"""Profile loading: paraplan profile JSON and the bundled PipeDream graphs (data README Sec. 1)."""

from __future__ import annotations

import hashlib
from importlib import resources
from pathlib import Path

import pytest

from cost_models import profiles
from planner.errors import InvalidProblemError

ALL_PROFILES = (
    "alexnet", "densenet121", "gnmt", "gnmt_large", "inception_v3", "nasnetalarge", "nasnetamobile",
    "resnet101", "resnet18", "resnet50", "resnext101", "resnext50", "squeezenet1_0", "vgg16",
)
# shared/data/README.md Sec. 1: sum of (fwd + bwd) over non-Input nodes in seconds, sum of parameter bytes.
README_TOTALS = {
    "vgg16": (0.672535, 553_430_176), "alexnet": (0.085321, 244_403_360), "resnet18": (0.259742, 46_758_048),
    "resnet50": (0.443419, 102_228_128), "resnet101": (0.411092, 178_196_640),
    "squeezenet1_0": (0.285366, 4_993_696), "densenet121": (0.326155, 31_915_424),
    "gnmt": (0.089416, 775_063_808), "gnmt_large": (0.520453, 1_110_870_272),
}
# Minibatch sizes inferred in the README from the Input node (GNMT's cannot be inferred).
README_MINIBATCH = {
    "alexnet": 256, "resnet18": 256, "squeezenet1_0": 256, "vgg16": 128, "resnet50": 128, "resnext50": 128,
    "nasnetamobile": 128, "resnet101": 64, "resnext101": 64, "densenet121": 64, "nasnetalarge": 16,
    "inception_v3": 128, "gnmt": 1, "gnmt_large": 1,
}
# Git blob ids (first 12 hex digits) of the origin files, from the data README.
README_BLOBS = {
    "alexnet": "914a9cbe3412", "densenet121": "5729f6a14a77", "inception_v3": "379faf4b0af1",
    "nasnetalarge": "cb6f46079ed1", "nasnetamobile": "5e50759bf897", "resnet101": "21bac9aa6775",
    "resnet18": "a81984d4bf58", "resnet50": "29f4cf72698a", "resnext101": "7a951334709d",
    "resnext50": "14531e84eefd", "squeezenet1_0": "dacba47928c2", "vgg16": "59a8e966d5f9",
    "gnmt": "19a783e0339a", "gnmt_large": "2d89c8cb81d4",
}

# A tiny branchy graph, node lines deliberately out of order. node2 fans out to node3, node4 and
# (skipping ahead) node6; node5 is a zero-time Add joining node3 and node4.
TINY = """node5 -- Add -- forward_compute_time=0.000, backward_compute_time=0.000, activation_size=40.0, parameter_size=0.000
node1 -- Input -- forward_compute_time=9.000, backward_compute_time=0.000, activation_size=99.0, parameter_size=0.000
node3 -- Conv2d(1, 1) -- forward_compute_time=1.000, backward_compute_time=1.000, activation_size=20.0, parameter_size=0.000
node2 -- LSTM(1, 1) -- forward_compute_time=1.000, backward_compute_time=2.000, activation_size=[5.0; 5.0], parameter_size=4.000
node6 -- Linear(in_features=1) -- forward_compute_time=2.000, backward_compute_time=2.000, activation_size=50.0, parameter_size=8.000 -- stage_id=1
node4 -- ReLU -- forward_compute_time=1.000, backward_compute_time=1.000, activation_size=30.0, parameter_size=0.000
\tnode1 -- node2
\tnode2 -- node3
\tnode2 -- node4
\tnode3 -- node5
\tnode4 -- node5
\tnode5 -- node6
\tnode2 -- node6
"""


def _bundled(name: str) -> Path:
    return Path(str(resources.files("cost_models").joinpath(f"data/pipedream/{name}/graph.txt")))


def test_all_fourteen_profiles_are_bundled_byte_for_byte() -> None:
    assert profiles.list_pipedream_profiles() == tuple(sorted(ALL_PROFILES))
    for name, blob in README_BLOBS.items():
        data = _bundled(name).read_bytes()
        assert hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()[:12] == blob, name


@pytest.mark.parametrize("name", sorted(README_TOTALS))
def test_totals_match_the_data_readme(name: str) -> None:
    seconds, param_bytes = README_TOTALS[name]
    prof = profiles.pipedream_profile(name)
    assert sum(x.forward_s + x.backward_s for x in prof.layers) == pytest.approx(seconds, rel=1e-9)
    assert sum(x.param_bytes for x in prof.layers) == param_bytes


@pytest.mark.parametrize("name", ALL_PROFILES)
def test_every_profile_loads_with_valid_layers(name: str) -> None:
    prof = profiles.pipedream_profile(name)
    graph = profiles.pipedream_graph(name)
    assert prof.name == name and prof.source == f"pipedream:{name}/graph.txt"
    assert prof.microbatch_size == README_MINIBATCH[name]
    assert len({x.name for x in prof.layers}) == prof.num_layers
    for layer in prof.layers:
        assert layer.forward_s > 0 and layer.backward_s > 0 and layer.output_bytes >= 0
        assert layer.static_bytes == profiles.PIPEDREAM_STATIC_MULTIPLIER * layer.param_bytes
    assert prof.layers[-1].output_bytes == 0
    kept = [n for n in graph.nodes if not n.is_input]
    assert sum(x.activation_bytes or 0 for x in prof.layers) == pytest.approx(sum(n.activation_bytes for n in kept))


@pytest.mark.parametrize("name", ["inception_v3", "nasnetalarge"])
def test_branchy_graphs_load(name: str) -> None:
    prof = profiles.load_pipedream_graph(_bundled(name))  # its speed: bench/speed_targets.py
    assert prof.num_layers > 1


@pytest.mark.parametrize("name", ["resnet18", "gnmt", "inception_v3"])
def test_order_is_topological_and_cuts_match_brute_force(name: str) -> None:
    graph = profiles.pipedream_graph(name)
    order = graph.topological_order()
    position = {node_id: i for i, node_id in enumerate(order)}
    for src, dst in graph.edges:
        if src in position and dst in position:
            assert position[src] < position[dst]
    cuts = graph.cut_bytes(order)
    for i in range(0, len(order), 7):
        live = sum(
            graph.by_id[u].activation_bytes
            for u in order[: i + 1]
            if any(position.get(v, -1) > i for v in graph.successors[u])
        )
        assert cuts[i] == pytest.approx(live)


def test_tiny_branchy_graph_cut_sizes_by_hand() -> None:
    prof = profiles.pipedream_to_profile(profiles.parse_pipedream_graph(TINY), name="tiny")
    assert [x.name for x in prof.layers] == ["node2:LSTM", "node3:Conv2d", "node4:ReLU+node5:Add", "node6:Linear"]
    # after node2: its output (10) is still needed by 3, 4, 6; after node3: node2 (10) + node3 (20);
    # after node5: node2 (10, for node6) + node5 (40); after the last layer: nothing.
    assert [x.output_bytes for x in prof.layers] == [10.0, 30.0, 50.0, 0.0]
    assert [x.activation_bytes for x in prof.layers] == [10.0, 20.0, 70.0, 50.0]
    assert [x.forward_s for x in prof.layers] == [0.001, 0.001, 0.001, 0.002]
    assert [x.param_bytes for x in prof.layers] == [4.0, 0.0, 0.0, 8.0]
    assert prof.microbatch_size == 1  # 99 bytes is no known image batch


def test_parse_keeps_lists_stage_ids_and_edges() -> None:
    graph = profiles.parse_pipedream_graph(TINY)
    assert graph.by_id["node2"].activation_sizes == (5.0, 5.0)
    assert graph.by_id["node6"].stage_id == 1 and graph.by_id["node2"].stage_id is None
    assert graph.successors["node2"] == ("node3", "node4", "node6")
    assert graph.layer_groups() == (("node2",), ("node3",), ("node4", "node5"), ("node6",))


def _node(node_id: str, desc: str, fwd: float, bwd: float, act: float = 1.0) -> str:
    return (
        f"{node_id} -- {desc} -- forward_compute_time={fwd}, backward_compute_time={bwd}, "
        f"activation_size={act}, parameter_size=0.0\n"
    )


def test_leading_zero_time_nodes_join_the_first_layer() -> None:
    text = (
        _node("node1", "View", 0, 0) + _node("node2", "A", 1, 0) + _node("node3", "B", 0, 1) + _node("node4", "C", 1, 1)
        + "\tnode1 -- node2\n\tnode2 -- node3\n\tnode3 -- node4\n"
    )
    graph = profiles.parse_pipedream_graph(text)
    assert graph.layer_groups() == (("node1", "node2", "node3"), ("node4",))


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (_node("node1", "A", 1, 1).replace(", parameter_size=0.0", ""), "missing metric 'parameter_size'"),
        (_node("node1", "A", 1, 1).replace("forward_compute_time=1", "forward_compute_time=x"), "bad number"),
        ("node1 A\n", "expected '<node_id> -- <description> -- <metrics>'"),
        (TINY + "\tnode6 -- node9\n", "names a node that has no node line"),
        (TINY + "\tnode6 -- node2\n", "cycle"),
        ("node1 -- Input -- forward_compute_time=1, backward_compute_time=0, activation_size=1, parameter_size=0\n",
         "no layer with both a forward and a backward"),
    ],
)
def test_malformed_graphs_are_rejected(text: str, match: str) -> None:
    with pytest.raises(InvalidProblemError, match=match):
        profiles.pipedream_to_profile(profiles.parse_pipedream_graph(text), name="bad")


def test_unknown_bundled_profile_lists_the_names() -> None:
    with pytest.raises(InvalidProblemError, match=r"unknown PipeDream profile 'vgg19'.*vgg16"):
        profiles.pipedream_profile("vgg19")


def test_load_from_path_and_explicit_minibatch(tmp_path: Path) -> None:
    model_dir = tmp_path / "tiny"
    model_dir.mkdir()
    (model_dir / "graph.txt").write_text(TINY)
    prof = profiles.load_pipedream_graph(model_dir / "graph.txt", microbatch_size=32)
    assert (prof.name, prof.microbatch_size, prof.source) == ("tiny", 32, "pipedream:tiny/graph.txt")
    with pytest.raises(InvalidProblemError, match="PipeDream graph file .* does not exist"):
        profiles.load_pipedream_graph(tmp_path / "missing.txt")


def test_load_profile_json_from_text_and_file(tmp_path: Path) -> None:
    text = '{"name": "toy", "layers": [{"name": "a", "forward_s": 1.0, "backward_s": 2.0}]}'
    assert profiles.load_profile_json(text).layers[0].backward_s == 2.0
    path = tmp_path / "p.json"
    path.write_text(text)
    assert profiles.load_profile_json(path).name == "toy"
    assert profiles.load_profile_json(str(path)).name == "toy"
    with pytest.raises(InvalidProblemError, match="forward_s"):
        profiles.load_profile_json('{"name": "toy", "layers": [{"name": "a", "forward_s": 0, "backward_s": 2.0}]}')
    with pytest.raises(InvalidProblemError, match="profile file .* does not exist"):
        profiles.load_profile_json(tmp_path / "nope.json")
