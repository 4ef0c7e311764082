"""Layer profiles from files: paraplan profile JSON and PipeDream ``graph.txt``.

PipeDream's profiler (Narayanan's dissertation Sec. 2.4.1, seed 001 L1137-1180; digest
``pipedream-2bw.md`` Sec. 2.1 and Sec. 8) records per layer the forward and backward time in
milliseconds, the output activation size and the weight size in bytes, all for the whole
profiled minibatch. The file format is described in ``shared/data/README.md`` Sec. 1.

A branchy graph becomes a chain without manual branch compression:

1. ``Input*`` nodes (data loading) are dropped, as PipeDream's optimizer does.
2. The remaining nodes are ordered topologically; ties go to the smaller numeric node id.
3. Nodes with a zero forward or backward time (``Add``, ``View``, ``__getitem__``...) are merged
   into the preceding layer (the first layer absorbs leading ones): the schema needs times > 0.
4. A layer's ``output_bytes`` is what a stage boundary after it would send: the activations of
   all earlier nodes that some later node consumes.

Per layer: ``activation_bytes`` = the sum of the layer's own outputs (kept for its backward);
``param_bytes`` = the weights (fp32, the gradient volume all-reduced); ``static_bytes`` = weights
x ``PIPEDREAM_STATIC_MULTIPLIER`` (fp32 weights, gradients and two Adam states).
"""

from __future__ import annotations

import heapq
import math
import re
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from pathlib import Path

from planner.errors import InvalidProblemError
from planner import schema_io
from planner.schema import LayerProfile, ModelProfile

PIPEDREAM_STATIC_MULTIPLIER = 4.0
"""Resident bytes per weight byte: fp32 weights + gradients + Adam m and v. PipeDream trained the
image models with SGD + momentum (3x would do); 4x is the conservative choice that also covers
GNMT's Adam."""
_MS_PER_S = 1000.0
# Bytes of one fp32 input sample, to infer the profiled minibatch from the Input node.
_INPUT_SAMPLE_BYTES = {"3x224x224": 4 * 3 * 224 * 224, "3x299x299": 4 * 3 * 299 * 299, "3x331x331": 4 * 3 * 331 * 331}
_METRIC_RE = re.compile(r"(\w+)=(\[[^\]]*\]|[^,\s]+)")
_NODE_NUMBER_RE = re.compile(r"^node(\d+)$")
_BUNDLED = "data/pipedream"


@dataclass(frozen=True, slots=True)
class PipedreamNode:
    """One operator of a PipeDream profile (times in ms, sizes in bytes, whole minibatch)."""

    node_id: str
    description: str
    forward_ms: float
    backward_ms: float
    activation_sizes: tuple[float, ...]
    parameter_bytes: float
    stage_id: int | None = None

    @property
    def activation_bytes(self) -> float:
        """Consumers read the sum of a multi-output layer's outputs (data README Sec. 1)."""
        return sum(self.activation_sizes)

    @property
    def is_input(self) -> bool:
        return self.description.startswith("Input")

    @property
    def label(self) -> str:
        """``node4:Conv2d``: the id and the operator name without its arguments."""
        return f"{self.node_id}:{self.description.split('(', 1)[0].strip()}"

    def sort_key(self) -> tuple[int, str]:
        match = _NODE_NUMBER_RE.match(self.node_id)
        return (int(match.group(1)) if match else 2**62, self.node_id)


@dataclass(frozen=True)
class PipedreamGraph:
    """A parsed ``graph.txt``: nodes in file order and edges ``(src, dst)`` (dst consumes src)."""

    nodes: tuple[PipedreamNode, ...]
    edges: tuple[tuple[str, str], ...]

    @cached_property
    def by_id(self) -> dict[str, PipedreamNode]:
        return {node.node_id: node for node in self.nodes}

    @cached_property
    def successors(self) -> dict[str, tuple[str, ...]]:
        out: dict[str, list[str]] = {node.node_id: [] for node in self.nodes}
        for src, dst in self.edges:
            out[src].append(dst)
        return {k: tuple(v) for k, v in out.items()}

    @cached_property
    def predecessors(self) -> dict[str, tuple[str, ...]]:
        out: dict[str, list[str]] = {node.node_id: [] for node in self.nodes}
        for src, dst in self.edges:
            out[dst].append(src)
        return {k: tuple(v) for k, v in out.items()}

    def topological_order(self) -> tuple[str, ...]:
        """Non-input node ids in a topological order, ties broken by the smaller numeric id.

        Raises:
            InvalidProblemError: the graph has a cycle.
        """
        kept = [n for n in self.nodes if not n.is_input]
        indegree = {n.node_id: 0 for n in kept}
        for src, dst in self.edges:
            if src in indegree and dst in indegree:
                indegree[dst] += 1
        ready = [self.by_id[k].sort_key() for k, d in indegree.items() if d == 0]
        heapq.heapify(ready)
        order: list[str] = []
        while ready:
            _, node_id = heapq.heappop(ready)
            order.append(node_id)
            for dst in self.successors[node_id]:
                if dst in indegree:
                    indegree[dst] -= 1
                    if indegree[dst] == 0:
                        heapq.heappush(ready, self.by_id[dst].sort_key())
        if len(order) != len(kept):
            stuck = sorted(k for k, d in indegree.items() if d > 0)[:5]
            raise InvalidProblemError(f"PipeDream graph has a cycle through nodes {stuck}; it must be a DAG")
        return tuple(order)

    def cut_bytes(self, order: tuple[str, ...]) -> tuple[float, ...]:
        """Bytes crossing a cut placed after each position of ``order``: the activations of nodes
        at or before the position that a node after it consumes."""
        position = {node_id: i for i, node_id in enumerate(order)}
        diff = [0.0] * (len(order) + 1)
        for node_id, i in position.items():
            last_use = max((position[d] for d in self.successors[node_id] if d in position), default=i)
            if last_use > i:  # the output is live on the cuts i, i+1, ..., last_use-1
                diff[i] += self.by_id[node_id].activation_bytes
                diff[last_use] -= self.by_id[node_id].activation_bytes
        cuts, running = [], 0.0
        for i in range(len(order)):
            running += diff[i]
            cuts.append(running)
        return tuple(cuts)

    def layer_groups(self) -> tuple[tuple[str, ...], ...]:
        """The topological order cut into layers: a node with zero forward or backward time joins
        the layer before it (leading ones join the first layer).

        Raises:
            InvalidProblemError: no node has both a forward and a backward time.
        """
        groups: list[list[str]] = []
        valid = False  # does the last group have forward > 0 and backward > 0?
        for node_id in self.topological_order():
            node = self.by_id[node_id]
            if node.forward_ms > 0 and node.backward_ms > 0 and (valid or not groups):
                groups.append([node_id])
            elif groups:
                groups[-1].append(node_id)
            else:
                groups.append([node_id])
            members = [self.by_id[m] for m in groups[-1]]
            valid = sum(m.forward_ms for m in members) > 0 and sum(m.backward_ms for m in members) > 0
        if not groups or not valid:
            raise InvalidProblemError(
                "PipeDream graph has no layer with both a forward and a backward time > 0; "
                "profile the model again (the times are in milliseconds per minibatch)"
            )
        return tuple(tuple(g) for g in groups)


def _parse_node(line: str, lineno: int) -> PipedreamNode:
    parts = line.split(" -- ")
    stage_id = None
    if len(parts) >= 4 and parts[-1].startswith("stage_id="):
        stage_id = int(parts.pop().split("=", 1)[1])
    if len(parts) < 3:
        raise InvalidProblemError(
            f"graph.txt line {lineno}: expected '<node_id> -- <description> -- <metrics>', got {line[:80]!r}"
        )
    metrics = dict(_METRIC_RE.findall(parts[-1]))
    try:
        sizes = metrics["activation_size"].strip("[]").split(";")
        return PipedreamNode(
            node_id=parts[0].strip(),
            description=" -- ".join(parts[1:-1]).strip(),
            forward_ms=_metric(metrics, "forward_compute_time", lineno),
            backward_ms=_metric(metrics, "backward_compute_time", lineno),
            activation_sizes=tuple(_number(x, "activation_size", lineno) for x in sizes if x.strip()),
            parameter_bytes=_metric(metrics, "parameter_size", lineno),
            stage_id=stage_id,
        )
    except KeyError as e:
        raise InvalidProblemError(f"graph.txt line {lineno}: missing metric {e.args[0]!r}") from None
    except ValueError as e:
        raise InvalidProblemError(f"graph.txt line {lineno}: bad number ({e})") from None


def _metric(metrics: dict[str, str], key: str, lineno: int) -> float:
    return _number(metrics[key], key, lineno)


def _number(text: str, key: str, lineno: int) -> float:
    """A finite, non-negative graph.txt metric (times in ms, sizes in bytes)."""
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise InvalidProblemError(
            f"graph.txt line {lineno}: {key}={text} must be a finite number >= 0 (times in ms, sizes in bytes)"
        )
    return value


def parse_pipedream_graph(text: str) -> PipedreamGraph:
    """Parse the text of a PipeDream ``graph.txt`` (node lines, then tab-indented edge lines).

    Raises:
        InvalidProblemError: malformed line, duplicate node, or an edge naming an unknown node.
    """
    nodes: list[PipedreamNode] = []
    edges: list[tuple[str, str]] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        if raw.startswith("\t"):
            ends = raw.strip().split(" -- ")
            if len(ends) != 2:
                raise InvalidProblemError(f"graph.txt line {lineno}: expected '\\t<src> -- <dst>', got {raw.strip()!r}")
            edges.append((ends[0].strip(), ends[1].strip()))
        else:
            nodes.append(_parse_node(raw, lineno))
    ids = [n.node_id for n in nodes]
    if len(set(ids)) != len(ids):
        seen: set[str] = set()
        dup = sorted({i for i in ids if i in seen or seen.add(i)})[:5]
        raise InvalidProblemError(f"graph.txt defines nodes {dup} more than once")
    known = set(ids)
    for src, dst in edges:
        if src not in known or dst not in known:
            raise InvalidProblemError(f"graph.txt edge {src} -- {dst} names a node that has no node line")
    return PipedreamGraph(nodes=tuple(nodes), edges=tuple(edges))


def infer_minibatch_size(graph: PipedreamGraph) -> int | None:
    """The profiled minibatch from the Input node's bytes for a known fp32 image shape, else None."""
    inputs = [n.activation_bytes for n in graph.nodes if n.is_input and n.activation_bytes > 0]
    if len(inputs) != 1:
        return None
    for sample_bytes in _INPUT_SAMPLE_BYTES.values():
        if inputs[0] % sample_bytes == 0:
            return int(inputs[0] // sample_bytes)
    return None


def _group_name(labels: list[str]) -> str:
    return "+".join(labels) if len(labels) <= 3 else f"{labels[0]}+{len(labels) - 1}more"


def pipedream_to_profile(
    graph: PipedreamGraph,
    *,
    name: str,
    microbatch_size: int | None = None,
    static_multiplier: float = PIPEDREAM_STATIC_MULTIPLIER,
    source: str = "pipedream",
) -> ModelProfile:
    """A ``ModelProfile`` chain from a parsed graph (see the module docstring for the rules).

    Args:
        graph: the parsed profile.
        name: the model name.
        microbatch_size: samples in the profiled minibatch; None infers it from the Input node
            (224x224, 299x299 or 331x331 fp32 images) and falls back to 1, i.e. one profiled
            minibatch as the unit.
        static_multiplier: resident bytes per weight byte.
        source: provenance string for the profile.
    """
    groups = graph.layer_groups()
    order = tuple(node_id for group in groups for node_id in group)
    cuts = graph.cut_bytes(order)
    layers, end = [], -1
    for group in groups:
        members = [graph.by_id[m] for m in group]
        end += len(group)
        layer_name = _group_name([m.label for m in members])
        weights = sum(m.parameter_bytes for m in members)
        layers.append(
            LayerProfile(
                name=layer_name, kind=layer_name,
                forward_s=sum(m.forward_ms for m in members) / _MS_PER_S,
                backward_s=sum(m.backward_ms for m in members) / _MS_PER_S,
                activation_bytes=sum(m.activation_bytes for m in members),
                static_bytes=static_multiplier * weights, param_bytes=weights, output_bytes=cuts[end],
            )
        )
    batch = microbatch_size or infer_minibatch_size(graph) or 1
    return ModelProfile(name=name, layers=tuple(layers), microbatch_size=batch, source=source)


def _read_text(path: Path, what: str) -> str:
    return schema_io.read_text(path, what=what)


def load_pipedream_graph(
    path: str | Path, *, microbatch_size: int | None = None, static_multiplier: float = PIPEDREAM_STATIC_MULTIPLIER
) -> ModelProfile:
    """Read a PipeDream ``graph.txt`` as a layer profile named after its folder (``vgg16/graph.txt``
    gives ``vgg16``).

    Raises:
        InvalidProblemError: unreadable or malformed file.
    """
    file = Path(path)
    try:
        graph = parse_pipedream_graph(_read_text(file, "PipeDream graph"))
    except InvalidProblemError as e:
        message = str(e)
        raise InvalidProblemError(message if str(file) in message else f"{file}: {message}") from None
    name = file.parent.name if file.stem == "graph" and file.parent.name else file.stem
    return pipedream_to_profile(
        graph, name=name, microbatch_size=microbatch_size, static_multiplier=static_multiplier,
        source=f"pipedream:{file.name if not file.parent.name else file.parent.name + '/' + file.name}",
    )


def list_pipedream_profiles() -> tuple[str, ...]:
    """Names of the bundled PipeDream profiles (msr-fiddle/pipedream, MIT)."""
    root = resources.files("cost_models").joinpath(_BUNDLED)
    return tuple(sorted(p.name for p in root.iterdir() if p.is_dir() and p.joinpath("graph.txt").is_file()))


def pipedream_graph(name: str) -> PipedreamGraph:
    """The parsed graph of a bundled PipeDream profile (for solvers that need the DAG).

    Raises:
        InvalidProblemError: unknown name; the message lists the bundled ones.
    """
    key = name.strip().lower()
    names = list_pipedream_profiles()
    if key not in names:
        raise InvalidProblemError(f"unknown PipeDream profile {name!r}; choose from {list(names)}")
    text = resources.files("cost_models").joinpath(f"{_BUNDLED}/{key}/graph.txt").read_text(encoding="utf-8")
    return parse_pipedream_graph(text)


def pipedream_profile(name: str, *, microbatch_size: int | None = None) -> ModelProfile:
    """A bundled PipeDream profile by model name (e.g. ``vgg16``) as a layer profile.

    Raises:
        InvalidProblemError: unknown name; the message lists the bundled ones.
    """
    key = name.strip().lower()
    return pipedream_to_profile(
        pipedream_graph(key), name=key, microbatch_size=microbatch_size, source=f"pipedream:{key}/graph.txt"
    )


def load_profile_json(text_or_path: str | Path) -> ModelProfile:
    """A layer profile from JSON text or a file path (validated by ``ModelProfile``).

    Raises:
        InvalidProblemError: unreadable file or invalid content (the message names the field).
    """
    if isinstance(text_or_path, str) and text_or_path.lstrip().startswith("{"):
        return ModelProfile.from_json(text_or_path)
    return ModelProfile.from_json(_read_text(Path(text_or_path), "profile"))
