"""Chrome/Perfetto trace export (planner.trace, ``paraplan simulate --trace``)."""

from __future__ import annotations

import functools
import glob
import json
import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from planner import api
from planner.cli import main
from planner.trace import stage_rank_ranges


@pytest.fixture(scope="module")
def plain():
    return api.plan(api.make_problem("gpt-1.7b", "a100-80gb:1x8", num_stages=4, global_batch_size=32))


def _slices(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if e["ph"] == "X"]


def test_trace_has_a_track_per_stage_stream_and_link(plain) -> None:
    sim = api.simulate(plain, include_events=True)
    doc = api.trace(plain, sim)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    processes = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    # 8 GPUs, 4 stages, data 2: stage x runs on ranks 2x, 2x + 1.
    assert [processes[x + 1] for x in range(4)] == [f"stage {x} (ranks {2 * x}-{2 * x + 1})" for x in range(4)]
    links = sorted(name for (pid, _), name in names.items() if processes[pid] == "links")
    assert links == sorted(f"link {a}->{b}" for a, b in ((0, 1), (1, 0), (1, 2), (2, 1), (2, 3), (3, 2)))
    slices = _slices(doc)
    assert all((e["pid"], e["tid"]) in names and e["ts"] >= 0 and e["dur"] >= 0 for e in slices)
    compute = [e for e in slices if e["cat"] == "compute"]
    assert len(compute) == sum(1 for e in sim.events if e.kind != "AR")
    # One activation and one gradient transfer per stage boundary and microbatch.
    m = plain.num_microbatches
    assert sum(1 for e in slices if e["cat"] == "transfer") == 2 * 3 * m
    end_us = max(e["ts"] + e["dur"] for e in slices)
    assert end_us == pytest.approx(sim.iteration_time_s * 1e6)


def test_transfers_follow_their_producer(plain) -> None:
    doc = api.trace(plain)
    slices = _slices(doc)
    forward = {(e["pid"] - 1, e["args"]["microbatch"]): e for e in slices if e["cat"] == "compute" and e["name"][0] == "F"}
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    for e in slices:
        if e["cat"] == "transfer" and e["name"].startswith("SF"):
            src, dst = map(int, names[(e["pid"], e["tid"])].split()[1].split("->"))
            producer, consumer = forward[(src, e["args"]["microbatch"])], forward[(dst, e["args"]["microbatch"])]
            assert e["ts"] >= producer["ts"] + producer["dur"] - 2e-3  # ns rounding
            assert consumer["ts"] >= e["ts"] + e["dur"] - 2e-3


def test_offloaded_and_bpipe_plans_show_host_rows_and_pair_links() -> None:
    spipe = api.plan(api.make_problem("spipe-10b", "v100:1x2", global_batch_size=8), solver="spipe")
    doc = api.trace(spipe)
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert {"h2d:0:0", "d2h:0:0", "cpu:0", "link 0->1", "link 1->0"} <= names
    assert {e["name"] for e in _slices(doc) if e["cat"] == "host"} == {"P", "G", "O"}
    named = {(e["pid"], e["tid"]) for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert all((e["pid"], e["tid"]) in named for e in _slices(doc))
    processes = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert {"GPU 0", "GPU 1", "links", "host"} <= processes
    bpipe = api.plan(api.make_problem("gpt-1.7b", "a100-80gb:1x8", num_stages=4, global_batch_size=32, bpipe=True))
    kinds = {e["name"][:2] for e in _slices(api.trace(bpipe)) if e["cat"] == "transfer"}
    assert kinds == {"SF", "SB", "EV", "LD"}


def test_cli_writes_the_trace(plain, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan_path = tmp_path / "plan.json"
    api.save(plain, plan_path)
    out = tmp_path / "t" / "trace.json"
    assert main(["simulate", str(plan_path), "--trace", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert len(_slices(doc)) > 0 and "wrote" in capsys.readouterr().err


def test_rank_ranges_follow_explicit_ranks(plain) -> None:
    assert stage_rank_ranges(plain) == ["0-1", "2-3", "4-5", "6-7"]
    odd = plain.model_copy(update={"stages": tuple(s.model_copy(update={"ranks": (x, x + 4)})
                                                   for x, s in enumerate(plain.stages))})
    assert stage_rank_ranges(odd) == ["0,4", "1,5", "2,6", "3,7"]


# Run in a child process: the perfetto package's own download path (get_perfetto_prebuilt: curl into
# ~/.local/share/perfetto/prebuilts, SHA-256 checked), after a 10 s reachability probe of its host.
_FETCH = """
import socket, sys
from urllib.parse import urlparse
from perfetto.prebuilts.manifests.trace_processor_shell import TRACE_PROCESSOR_SHELL_MANIFEST as MANIFEST
from perfetto.prebuilts.perfetto_prebuilts import get_perfetto_prebuilt
host = urlparse(next(e["url"] for e in MANIFEST if e.get("url"))).hostname
try:
    socket.create_connection((host, 443), timeout=10).close()
except OSError as e:
    sys.exit(f"cannot reach {host}: {e}")
print(get_perfetto_prebuilt(MANIFEST))
"""
_FETCH_LIMIT_S = 180  # the whole child: probe and download (about 30 MB); under pytest-timeout's 300 s


@functools.lru_cache(maxsize=None)
def _trace_processor_binary() -> tuple[str | None, str]:
    """(Perfetto's trace_processor_shell, or None and why): $PERFETTO_TRACE_PROCESSOR, the perfetto
    package's cache, or one download attempt per session through the package's own path, with a
    10 s network probe and a hard limit on the child process (never hangs the suite)."""
    given = os.environ.get("PERFETTO_TRACE_PROCESSOR")
    if given:
        return given, ""
    cached = sorted(glob.glob(os.path.expanduser("~/.local/share/perfetto/prebuilts/trace_processor_shell*")))
    found = next((path for path in cached if not path.endswith(".tmp") and os.access(path, os.X_OK)), None)
    if found:
        return found, ""
    if shutil.which("curl") is None:
        return None, "the perfetto package downloads trace_processor_shell with curl, which is not installed"
    child = subprocess.Popen([sys.executable, "-c", _FETCH], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        out, err = child.communicate(timeout=_FETCH_LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)  # the child and its curl
        child.communicate()
        return None, f"downloading trace_processor_shell took over {_FETCH_LIMIT_S} s"
    lines = out.strip().splitlines()
    if child.returncode != 0 or not lines or not os.access(lines[-1], os.X_OK):
        reason = (err.strip().splitlines() or ["no output"])[-1]
        return None, f"could not download trace_processor_shell ({reason})"
    return lines[-1], ""


def test_perfettos_trace_processor_loads_the_trace(plain, tmp_path: Path) -> None:
    # The perfetto package (PyPI) drives trace_processor_shell, a native binary it downloads on first
    # use from Google's artifact storage; offline (no binary, no network) this test skips, saying why.
    tp_module = pytest.importorskip("perfetto.trace_processor")
    binary, why = _trace_processor_binary()
    if binary is None:
        pytest.skip(f"{why}; set PERFETTO_TRACE_PROCESSOR to a trace_processor_shell binary to run this test")
    from planner.trace import write_trace

    sim = api.simulate(plain, include_events=True)
    doc = api.trace(plain, sim)
    path = write_trace(doc, tmp_path / "trace.json")
    config = tp_module.TraceProcessorConfig(bin_path=binary)
    with tp_module.TraceProcessor(trace=str(path), config=config) as tp:
        count = next(iter(tp.query("select count(*) as n from slice"))).n
        threads = {row.name for row in tp.query("select name from thread")}
        processes = {row.name for row in tp.query("select name from process")}
    assert count == len(_slices(doc))
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert names <= threads and {"compute", "link 0->1"} <= threads
    assert {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"} <= processes


def test_cli_timeline_window_and_labels(plain, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan_path = tmp_path / "plan.json"
    api.save(plain, plan_path)
    out = tmp_path / "t.svg"
    assert main(["simulate", str(plan_path), "--timeline", str(out), "--window", "0:0.05"]) == 0
    text = out.read_text()
    assert "stage 3 (ranks 6-7)" in text and "memory (GiB)" in text
    for bad in ("3:1", "abc"):
        assert main(["simulate", str(plan_path), "--timeline", str(out), "--window", bad]) == 2
        assert "window" in capsys.readouterr().err


_METADATA = {"process_name": "name", "thread_name": "name", "process_sort_index": "sort_index",
             "thread_sort_index": "sort_index"}


def check_json_trace_format(doc: dict) -> None:
    """The rules of the JSON trace event format that Perfetto's JSON importer relies on.

    - a JSON object with a ``traceEvents`` list, ``displayTimeUnit`` "ms" or "ns" (the format's
      two values), no NaN or infinity anywhere (strict JSON);
    - every event has a string ``name``, a ``ph`` this exporter uses (X complete slices, M
      metadata) and integer ``pid`` / ``tid``; metadata events carry their one argument
      (``name`` string or integer ``sort_index``);
    - complete events have finite ``ts`` >= 0 and ``dur`` >= 0 in microseconds, a string
      ``cat`` and an ``args`` object, and sit on a thread and process that have names;
    - on each thread, slices nest in whole nanoseconds as Perfetto reads them (round(ts x 1000),
      round(dur x 1000)): sorted by start (then longer first), each one either starts at or
      after the end of the enclosing one or ends within it. Perfetto's importer builds its
      slice stacks per thread this way and drops or truncates slices that overlap without
      nesting.
    """
    json.dumps(doc, allow_nan=False)
    assert set(doc) >= {"traceEvents"} and doc.get("displayTimeUnit", "ms") in ("ms", "ns")
    assert isinstance(doc["traceEvents"], list) and doc["traceEvents"], "no events"
    names: dict[tuple[int, int], str] = {}
    processes: set[int] = set()
    per_thread: dict[tuple[int, int], list[tuple[int, int, str]]] = {}
    for e in doc["traceEvents"]:
        assert {"name", "ph", "pid", "tid"} <= set(e), f"an event lacks name/ph/pid/tid: {e}"
        assert isinstance(e["name"], str) and e["name"] and e["ph"] in ("X", "M"), e
        assert all(type(e[k]) is int for k in ("pid", "tid")), e  # integers, not bools or floats
        if e["ph"] == "M":
            assert e["name"] in _METADATA and isinstance(e.get("args"), dict), e
            value = e["args"][_METADATA[e["name"]]]
            assert type(value) is (str if _METADATA[e["name"]] == "name" else int), e
            if e["name"] == "thread_name":
                assert names.setdefault((e["pid"], e["tid"]), value) == value, f"thread renamed: {e}"
            elif e["name"] == "process_name":
                processes.add(e["pid"])
            continue
        assert {"ts", "dur", "cat", "args"} <= set(e), f"a complete (X) event lacks ts/dur/cat/args: {e}"
        assert isinstance(e["cat"], str) and isinstance(e["args"], dict), e
        assert all(type(e[k]) in (int, float) and math.isfinite(e[k]) and e[k] >= 0 for k in ("ts", "dur")), e
        start_ns, dur_ns = round(e["ts"] * 1000), round(e["dur"] * 1000)
        per_thread.setdefault((e["pid"], e["tid"]), []).append((start_ns, start_ns + dur_ns, e["name"]))
    assert {pid for pid, _ in names} <= processes, "a named thread in a process without a process_name"
    for track, slices in per_thread.items():
        assert track in names and track[0] in processes, f"slices on unnamed track {track}"
        stack: list[tuple[int, int, str]] = []
        for start, end, name in sorted(slices, key=lambda s: (s[0], -s[1])):
            while stack and start >= stack[-1][1]:
                stack.pop()
            assert not stack or end <= stack[-1][1], (
                f"{names[track]}: {name} [{start}, {end}] overlaps {stack[-1][2]} [{stack[-1][0]}, {stack[-1][1]}] "
                "without nesting")
            stack.append((start, end, name))


def check_one_at_a_time(doc: dict) -> None:
    """Every track is one engine stream or resource (a compute or data-parallel stream, a link, a
    host link, a CPU), which runs one operation at a time: its slices never overlap, not even
    nested (whole nanoseconds, as Perfetto reads them)."""
    per_thread: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            start = round(e["ts"] * 1000)
            per_thread.setdefault((e["pid"], e["tid"]), []).append((start, start + round(e["dur"] * 1000)))
    for track, slices in per_thread.items():
        ordered = sorted(slices)
        for (_, end), (start, _) in zip(ordered, ordered[1:]):
            assert start >= end, f"track {track}: a slice starts at {start} ns before the previous ends at {end} ns"


def _overlapped_dp_plan():  # type: ignore[no-untyped-def]
    """2 stages x 8 replicas on 4 nodes of 4: gradient buckets under the backward share the NICs with
    the pipeline's sends between nodes (docs/simulator.md, "Collectives on the engine")."""
    plan = api.plan(api.make_problem("gpt-1.7b", "a100-80gb:4x4", num_stages=2, global_batch_size=32))
    return plan.model_copy(update={"options": {**plan.options, "overlap_grad_reduce": True}})


@pytest.mark.parametrize("kind", ["plain", "interleaved", "bpipe", "spipe", "dp-overlap"])
def test_trace_follows_the_json_trace_event_format(kind: str, plain, tmp_path: Path) -> None:
    from planner.trace import write_trace

    if kind == "plain":
        plan = plain
    elif kind == "dp-overlap":
        plan = _overlapped_dp_plan()
    elif kind == "interleaved":
        plan = api.plan(api.make_problem("gpt-1.7b", "a100-80gb:1x8", num_stages=4, global_batch_size=32,
                                         schedule="interleaved-1f1b", num_chunks=2))
    elif kind == "bpipe":
        plan = api.plan(api.make_problem("gpt-1.7b", "a100-80gb:1x8", num_stages=4, global_batch_size=32, bpipe=True))
    else:
        plan = api.plan(api.make_problem("spipe-10b", "v100:1x2", global_batch_size=8), solver="spipe")
    doc = api.trace(plan)
    check_json_trace_format(doc)
    check_one_at_a_time(doc)
    assert json.loads(write_trace(doc, tmp_path / "t.json").read_text()) == doc


def test_the_format_check_catches_overlapping_slices() -> None:
    meta = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "p"}},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "t"}}]

    def doc(*spans: tuple[float, float]) -> dict:
        return {"traceEvents": meta + [{"name": f"s{i}", "cat": "c", "ph": "X", "pid": 1, "tid": 1, "ts": a,
                                         "dur": b - a, "args": {}} for i, (a, b) in enumerate(spans)]}

    check_json_trace_format(doc((0, 2), (2, 3), (0.5, 1)))  # adjacent and nested: fine
    with pytest.raises(AssertionError, match="without nesting"):
        check_json_trace_format(doc((0, 2), (1.999, 3)))
    check_one_at_a_time(doc((0, 2), (2, 3)))  # adjacent: one at a time
    with pytest.raises(AssertionError, match="before the previous ends"):
        check_one_at_a_time(doc((0, 2), (2, 3), (0.5, 1)))  # nested: two at once on one stream


def test_the_format_check_catches_missing_fields_and_unnamed_tracks() -> None:
    meta = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "p"}},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "t"}}]
    good = {"name": "s", "cat": "c", "ph": "X", "pid": 1, "tid": 1, "ts": 0.0, "dur": 1.0, "args": {}}
    check_json_trace_format({"traceEvents": [*meta, good]})
    for key in ("dur", "ts", "pid", "name"):
        with pytest.raises(AssertionError, match="lacks"):
            check_json_trace_format({"traceEvents": [*meta, {k: v for k, v in good.items() if k != key}]})
    with pytest.raises(AssertionError, match="unnamed track"):
        check_json_trace_format({"traceEvents": [*meta, {**good, "tid": 2}]})
    with pytest.raises(AssertionError, match="process_name"):
        check_json_trace_format({"traceEvents": [meta[1], good]})
    with pytest.raises(AssertionError):
        check_json_trace_format({"traceEvents": [*meta, {**good, "ts": True}]})
