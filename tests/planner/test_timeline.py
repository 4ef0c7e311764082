"""Tests of planner.timeline: files are written as valid PNG / SVG, bad suffixes and empty
results are rejected, and a 16-rank x 64-microbatch 1F1B picture renders quickly."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from cost_models.schedules import build_actions
from planner.errors import InvalidProblemError
from planner.schema import SimResult, StageResult, TimelineEvent
from planner.timeline import draw_timeline

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _sim_result(schedule: str, p: int, m: int, *, v: int = 1, allreduce_s: float = 0.0) -> SimResult:
    """A SimResult built by hand: the schedule run dependency-driven with F = 1, B = 2 (I = W = 1)
    per chunk, then one all-reduce per rank."""
    duration = {"F": 1.0 / v, "B": 2.0 / v, "I": 1.0 / v, "W": 1.0 / v}
    actions = build_actions(schedule, num_stages=p, num_chunks=v, num_microbatches=m)
    end: dict[tuple[int, str, int], float] = {}
    free, position, events = [0.0] * p, [0] * p, []
    while any(position[r] < len(actions[r]) for r in range(p)):
        for r in range(p):
            while position[r] < len(actions[r]):
                s, kind, mb = actions[r][position[r]]
                if kind == "F":
                    deps = [(s - 1, "F", mb)] if s else []
                elif kind == "W":
                    deps = [(s, "I", mb)]
                else:
                    nxt = (s + 1, "B", mb) if (s + 1, "B", mb) in end else (s + 1, "I", mb)
                    deps = [(s, "F", mb)] + ([nxt] if s < p * v - 1 else [])
                if any(d not in end for d in deps):
                    break
                start = max([free[r]] + [end[d] for d in deps])
                free[r] = end[(s, kind, mb)] = start + duration[kind]
                events.append(TimelineEvent(r, kind, s, mb, start, free[r]))
                position[r] += 1
    makespan = max(free)
    if allreduce_s:
        events += [TimelineEvent(r, "AR", -1, -1, free[r], free[r] + allreduce_s) for r in range(p)]
        makespan = max(free) + allreduce_s
    busy = [sum(e.end_s - e.start_s for e in events if e.rank == r) for r in range(p)]
    stages = tuple(StageResult(index=r, busy_s=busy[r], idle_s=makespan - busy[r], peak_memory_bytes=0.0,
                               peak_inflight_microbatches=0) for r in range(p))
    return SimResult(iteration_time_s=makespan, bubble_fraction=sum(makespan - b for b in busy) / (makespan * p),
                     throughput_samples_per_s=m / makespan, memory_capacity_bytes=1.0, fits_memory=True,
                     stages=stages, events=tuple(events))


def test_png_is_written(tmp_path: Path) -> None:
    out = draw_timeline(_sim_result("1f1b", 4, 8, allreduce_s=0.5), tmp_path / "t.png", title="1F1B p=4 m=8")
    assert out == tmp_path / "t.png"
    data = out.read_bytes()
    assert data[:8] == _PNG_MAGIC and len(data) > 5_000


def test_svg_is_valid_xml_with_labels(tmp_path: Path) -> None:
    out = draw_timeline(_sim_result("zb-h1", 3, 6), tmp_path / "sub" / "t.svg")
    root = ET.parse(out).getroot()
    assert root.tag.endswith("svg")
    text = out.read_text()
    # boxes are 1 s wide on a ~10-inch axis of ~25 s: the microbatch numbers fit and are drawn
    assert "W weight grad" in text and "I input grad" in text


def test_interleaved_picture(tmp_path: Path) -> None:
    out = draw_timeline(_sim_result("interleaved-1f1b", 4, 8, v=2), tmp_path / "i.png")
    assert out.read_bytes()[:8] == _PNG_MAGIC


@pytest.mark.parametrize("name", ["t.pdf", "t.jpg", "timeline"])
def test_bad_suffix_is_rejected(tmp_path: Path, name: str) -> None:
    with pytest.raises(InvalidProblemError, match=r"use \.png or \.svg"):
        draw_timeline(_sim_result("1f1b", 2, 2), tmp_path / name)
    assert not (tmp_path / name).exists()


def test_result_without_events_is_rejected(tmp_path: Path) -> None:
    sim = _sim_result("1f1b", 2, 2).model_copy(update={"events": ()})
    with pytest.raises(InvalidProblemError, match=r"no timeline events"):
        draw_timeline(sim, tmp_path / "t.png")


def test_16_ranks_64_microbatches_render(tmp_path: Path) -> None:
    sim = _sim_result("1f1b", 16, 64)
    assert len(sim.events) == 16 * 128
    out = draw_timeline(sim, tmp_path / "big.png")  # its speed: bench/speed_targets.py
    data = out.read_bytes()
    assert data[:8] == _PNG_MAGIC
    width = int.from_bytes(data[16:20], "big")  # IHDR width
    assert 1500 <= width <= 8000


def test_65k_events_render(tmp_path: Path) -> None:
    sim = _sim_result("1f1b", 16, 2048)
    assert len(sim.events) == 65_536
    out = draw_timeline(sim, tmp_path / "huge.png", window="all")  # its speed: bench/speed_targets.py
    data = out.read_bytes()
    assert data[:8] == _PNG_MAGIC
    assert int.from_bytes(data[16:20], "big") == 8000  # capped width: 80 in at 100 dpi


def test_resource_rows_of_offloaded_and_bpipe_plans(tmp_path) -> None:
    from planner import api
    from planner.timeline import draw_timeline

    spipe = api.plan(api.make_problem("spipe-10b", "v100:1x2", global_batch_size=8), solver="spipe")
    rows = api.resource_timelines(spipe)
    kinds = {label.split(":")[0]: {k for k, _, _ in spans} for label, spans in rows.items()}
    assert kinds == {"cpu": {"O"}, "h2d": {"P"}, "d2h": {"G"}}
    assert all(0 <= start <= end for spans in rows.values() for _, start, end in spans)
    out = draw_timeline(api.simulate(spipe, include_events=True), tmp_path / "spipe.svg", resources=rows)
    assert "CPU optimizer step" in out.read_text() and "h2d:0:0" in out.read_text()

    bpipe = api.plan(api.make_problem("gpt-1.7b", "a100-80gb:1x8", num_stages=4, global_batch_size=32, bpipe=True))
    rows = api.resource_timelines(bpipe)
    assert list(rows) == ["link 0<->3"] and {k for k, _, _ in rows["link 0<->3"]} == {"EV", "LD"}
    plain = api.plan(api.make_problem("gpt-1.7b", "a100-80gb:1x8", num_stages=4, global_batch_size=32))
    assert api.resource_timelines(plain) == {}


def test_large_plans_are_drawn_as_fill_and_drain_windows(tmp_path: Path) -> None:
    from planner.timeline import AUTO_MICROBATCHES, _windows

    sim = _sim_result("interleaved-1f1b", 8, 768, v=6)  # the README plan's shape: 768 microbatches x 6 chunks
    (head, tail) = _windows(sim, "auto", sim.iteration_time_s)
    assert head[0] == 0.0 and head[1] < tail[0] < tail[1] == sim.iteration_time_s
    # Every event of the first and last k microbatches' forwards / backwards is inside a window.
    k = AUTO_MICROBATCHES
    assert all(e.end_s <= head[1] for e in sim.events if e.kind == "F" and e.microbatch < k)
    assert all(e.start_s >= tail[0] for e in sim.events if e.kind == "B" and e.microbatch >= 768 - k)
    # Individual operations stay readable: at most a few hundred per rank and window.
    for lo, hi in (head, tail):
        per_rank = [sum(1 for e in sim.events if e.rank == r and e.end_s > lo and e.start_s < hi) for r in range(8)]
        assert 0 < max(per_rank) <= 300
    out = draw_timeline(sim, tmp_path / "readme.svg", row_labels=[f"stage {x} (ranks {16 * x}-{16 * x + 15})"
                                                                   for x in range(8)])
    text = out.read_text()
    assert "stage 1 (ranks 16-31)" in text and "shown" in text and "idle" in text
    assert _windows(sim, "all", 10.0) == [(0.0, 10.0)] and _windows(sim, (1.0, 2.0), 10.0) == [(1.0, 2.0)]
    with pytest.raises(InvalidProblemError, match="window"):
        _windows(sim, (3.0, 2.0), 10.0)


def test_small_plans_are_drawn_whole_with_a_memory_panel(tmp_path: Path) -> None:
    from planner.timeline import _windows

    sim = _sim_result("1f1b", 4, 8)
    assert _windows(sim, "auto", sim.iteration_time_s) == [(0.0, sim.iteration_time_s)]
    memory = {r: [(0.0, 2**30), (1.0 + r, 2 * 2**30), (20.0, 2**30)] for r in range(4)}
    text = draw_timeline(sim, tmp_path / "m.svg", memory=memory).read_text()
    assert "memory (GiB)" in text


def test_memory_timeline_of_a_plan_by_hand() -> None:
    from cost_models.simulate import memory_timelines, simulate
    from tests.cost_models.sim_helpers import plan, uniform_layers

    # GPipe, 2 stages x 1 layer, F = 1, B = 2, 10 activation bytes and 5 static bytes per layer.
    # Rank 1 runs F0 [1, 2], F1 [2, 3], B0 [3, 5], B1 [5, 7]; rank 0 F0 [0, 1], F1 [1, 2], B0 [5, 7], B1 [7, 9].
    p = plan(uniform_layers(2, 1.0, 2.0, activation_bytes=10.0, static_bytes=5.0), num_stages=2,
             num_microbatches=2, schedule="gpipe")
    steps = memory_timelines(p, simulate(p))
    assert steps[0] == [(0.0, 15.0), (1.0, 25.0), (7.0, 15.0), (9.0, 5.0)]
    assert steps[1] == [(0.0, 5.0), (1.0, 15.0), (2.0, 25.0), (5.0, 15.0), (7.0, 5.0)]
