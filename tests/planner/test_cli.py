"""The CLI end to end, in process: outputs, files, exit codes and error messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cli import build_parser, main

TOY_PROFILE = {
    "format": "paraplan.profile/v1",
    "name": "toy",
    "layers": [
        {"name": f"l{i}", "forward_s": 1.0, "backward_s": 2.0, "static_bytes": 8, "output_bytes": 0,
         "recompute": {"none": {"activation_bytes": 8}, "full": {"activation_bytes": 1, "extra_s": 1.0}}}
        for i in range(8)
    ],
}


def _cluster(memory_bytes: float) -> dict:
    return {
        "format": "paraplan.cluster/v1", "name": "toy2",
        "device": {"name": "gpu", "memory_bytes": memory_bytes, "peak_flops": 1e12},
        "num_nodes": 1, "devices_per_node": 2, "intra_node_bytes_per_s": 1e18, "inter_node_bytes_per_s": 1e18,
    }


@pytest.fixture()
def files(tmp_path: Path) -> dict[str, Path]:
    paths = {"model": tmp_path / "model.json", "cluster": tmp_path / "cluster.json", "small": tmp_path / "small.json"}
    paths["model"].write_text(json.dumps(TOY_PROFILE))
    paths["cluster"].write_text(json.dumps(_cluster(1e9)))
    paths["small"].write_text(json.dumps(_cluster(20)))
    return paths


def test_cli_flags_are_pinned() -> None:
    """The contract of architecture.md: adding a flag is fine, renaming one breaks users."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    plan_flags = {s for a in sub.choices["plan"]._actions for s in a.option_strings}
    assert {"--model", "--cluster", "--solver", "--schedule", "--pipeline", "--chunks", "--microbatches",
            "--global-batch", "--microbatch-size", "--bpipe", "--time-limit", "--option", "-o", "--json"} <= plan_flags
    assert {"plan", "simulate", "export", "model-info", "solvers", "presets"} <= set(sub.choices)
    # the architecture's other sub-commands, added by planner.cli_gavel / cli_runtime / cli_fill
    assert {"schedule", "cluster-sim", "policies", "run", "profile", "fill"} <= set(sub.choices)


def test_plan_simulate_export_round_trip(files: dict[str, Path], tmp_path: Path, capsys) -> None:
    out = tmp_path / "plan.json"
    code = main(["plan", "--model", str(files["model"]), "--cluster", str(files["cluster"]),
                 "--pipeline", "2", "--microbatches", "4", "-o", str(out), "--json"])
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["predicted"]["iteration_time_s"] == pytest.approx(60.0)
    assert json.loads(out.read_text()) == printed

    assert main(["simulate", str(out), "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["iteration_time_s"] == pytest.approx(60.0)
    assert sim["bubble_fraction"] == pytest.approx(1 / 5)
    assert [s["peak_inflight_microbatches"] for s in sim["stages"]] == [2, 1]
    assert "events" not in sim

    png = tmp_path / "t.png"
    assert main(["simulate", str(out), "--timeline", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "iteration 60 s" in capsys.readouterr().out

    assert main(["export", str(out), "--format", "torch-csv"]) == 0
    rows = capsys.readouterr().out.strip().splitlines()
    assert rows[0].split(",")[:3] == ["0F0", "0F1", "0B0"]


def test_plan_table_is_readable(files: dict[str, Path], capsys) -> None:
    assert main(["plan", "--model", str(files["model"]), "--cluster", str(files["cluster"]), "--pipeline", "2",
                 "--microbatches", "4"]) == 0
    text = capsys.readouterr().out
    assert "toy on toy2: even, 1f1b" in text
    assert "[0,4)" in text and "[4,8)" in text


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--pipeline", "9"], "need at least 9 layers but model 'toy' has 8; use at most 8 stages"),
        (["--pipeline", "2", "--data-parallel", "2"], "need 4 devices but cluster 'toy2' has 2; use at most 1 stages"),
        (["--pipeline", "1", "--global-batch", "5"], "use a multiple of 2 (4 or 6)"),
    ],
)
def test_infeasible_shapes_exit_3(files: dict[str, Path], extra: list[str], needle: str, capsys) -> None:
    code = main(["plan", "--model", str(files["model"]), "--cluster", str(files["cluster"]), *extra])
    err = capsys.readouterr().err
    assert code == 3, err
    assert needle in err and "Traceback" not in err


def test_infeasible_exits_3_with_needed_memory(files: dict[str, Path], capsys) -> None:
    code = main(["plan", "--model", str(files["model"]), "--cluster", str(files["small"]), "--pipeline", "2",
                 "--microbatches", "4"])
    assert code == 3
    err = capsys.readouterr().err
    assert "needs 40 B per device" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "content,needle",
    [
        ('{"name": "x", "layers": [', "not valid JSON"),
        (json.dumps({**TOY_PROFILE, "colour": "red"}), "unknown key 'colour'"),
        (json.dumps({**TOY_PROFILE, "layers": [{**TOY_PROFILE["layers"][0], "forward_s": -1}]}),
         "layers.0.forward_s = -1"),
        (json.dumps({**TOY_PROFILE, "layers": [{**TOY_PROFILE["layers"][0], "backward_s": 0}]}),
         "layers.0.backward_s = 0"),
    ],
)
def test_bad_model_file_exits_2(tmp_path: Path, files: dict[str, Path], content: str, needle: str, capsys) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    assert main(["plan", "--model", str(bad), "--cluster", str(files["cluster"])]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--schedule", "interleaved-1f1b", "--chunks", "2", "--pipeline", "2", "--microbatches", "3"],
         "multiple of num_stages=2"),
        (["--solver", "nope"], "unknown solver 'nope'"),
        (["--option", "recompute"], "must be KEY=VALUE"),
        (["--schedule", "zigzag"], "schedule"),
    ],
)
def test_bad_arguments_exit_2(files: dict[str, Path], extra: list[str], needle: str, capsys) -> None:
    code = main(["plan", "--model", str(files["model"]), "--cluster", str(files["cluster"]), *extra])
    assert code == 2
    assert needle in capsys.readouterr().err


def test_missing_files_and_unknown_presets_exit_2(capsys) -> None:
    assert main(["simulate", "/nonexistent/plan.json"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["plan", "--model", "gpt-9000", "--cluster", "a100-80gb:8"]) == 2
    assert "gpt3-175b" in capsys.readouterr().err  # lists valid names
    assert main(["plan", "--model", "gpt3-175b", "--cluster", "b200x:1"]) == 2
    assert "a100-80gb" in capsys.readouterr().err


def test_model_info_json(capsys) -> None:
    assert main(["model-info", "gpt3-175b", "--global-batch", "1536", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    # PTD-P Eq. 4.3: 174.6B parameters (Table 4.2)
    assert info["num_parameters"] == pytest.approx(174.6e9, rel=1e-3)
    # Eq. 4.2 with B = 1536, s = 2048, l = 96, h = 12288, V = 51200
    expected = 96 * 1536 * 2048 * 96 * 12288**2 * (1 + 2048 / (6 * 12288) + 51200 / (16 * 96 * 12288))
    assert info["flops_per_iteration"] == pytest.approx(expected, rel=1e-9)
    assert info["global_batch_size"] == 1536


def test_solvers_and_presets_list_names(capsys) -> None:
    assert main(["solvers"]) == 0
    assert "even" in capsys.readouterr().out
    assert main(["presets", "--json"]) == 0
    presets = json.loads(capsys.readouterr().out)
    assert "a100-80gb" in presets["devices"] and "gpt3-175b" in presets["models"]
    assert "pipedream:vgg16" in presets["pipedream_profiles"]


def test_transformer_plan_from_presets(tmp_path: Path, capsys) -> None:
    out = tmp_path / "gpt.json"
    code = main(["plan", "--model", "gpt3-175b", "--cluster", "a100-80gb:128", "--tensor-parallel", "8",
                 "--global-batch", "1536", "-o", str(out)])
    assert code == 0, capsys.readouterr().err
    plan = json.loads(out.read_text())
    d = plan["degrees"]
    assert d["tensor"] == 8 and d["tensor"] * d["pipeline"] * d["data"] == 128
    assert plan["global_batch_size"] == 1536
    assert max(plan["predicted"]["peak_memory_bytes"]) <= 80 * 10**9 * 1.1
    assert main(["export", str(out), "--format", "megatron"]) == 0
    args = capsys.readouterr().out
    assert "--tensor-model-parallel-size 8" in args
    assert f"--pipeline-model-parallel-size {d['pipeline']}" in args


def test_fresh_process_plan_and_export(tmp_path: Path) -> None:
    """The console entry point in a new interpreter (imports resolve as they do for users)."""
    import subprocess
    import sys

    plan_path = tmp_path / "plan.json"
    env_cmd = [sys.executable, "-m", "planner.cli"]
    done = subprocess.run(
        [*env_cmd, "plan", "--model", "gpt-1.7b", "--cluster", "a100-80gb:1x8", "--pipeline", "2", "-o", str(plan_path)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    done = subprocess.run([*env_cmd, "export", str(plan_path), "--format", "megatron"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--pipeline-model-parallel-size 2" in done.stdout


def test_offload_fallback_only_when_states_exceed_all_gpu_memory(capsys) -> None:
    # spipe-19b: 277 GiB of states on 4 x 32 GiB V100s; no GPU-resident plan can fit
    assert main(["plan", "--model", "spipe-19b", "--cluster", "v100:1x4", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["solver"] == "spipe"
    # usable: 4 x (32 GiB - 1 GiB runtime - 5 % of 32 GiB) = 4 x 29.4 GiB
    assert "found no GPU-resident plan: the model's states need 277.1 GiB but the cluster's GPUs hold 117.6 GiB usable" in plan["notes"][0]
    assert main(["plan", "--model", "spipe-19b", "--cluster", "v100:1x4", "--no-offload"]) == 3
    assert "does not fit in device memory" in capsys.readouterr().err


def test_no_offload_fallback_when_the_states_fit_in_all_gpus(tmp_path: Path, capsys) -> None:
    # 8 B of states, 2 x 20 B of GPU memory, but 8 x 8 B activations per microbatch: the even
    # planner's memory error stands (activations, not states, are the problem)
    model = tmp_path / "acts.json"
    model.write_text(json.dumps({**TOY_PROFILE, "layers": [
        {"name": f"l{i}", "forward_s": 1.0, "backward_s": 2.0, "static_bytes": 1, "output_bytes": 0,
         "recompute": {"none": {"activation_bytes": 8}}} for i in range(8)]}))
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps(_cluster(20)))
    assert main(["plan", "--model", str(model), "--cluster", str(cluster), "--pipeline", "2", "--microbatches", "4"]) == 3
    err = capsys.readouterr().err
    assert "does not fit" in err and "spipe" not in err


# ------------------------------------------------------------------------------------------
# Memory headroom and feasibility (issue 13)
# ------------------------------------------------------------------------------------------


def test_memory_headroom_flag_and_simulate_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    args = ["plan", "--model", "gpt-tiny", "--cluster", "a100-80gb:8", "--pipeline", "2", "--global-batch", "8"]
    assert main([*args, "--memory-headroom", "6GiB", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "usable 74.0 GiB, total 80.0 GiB" in text
    assert json.loads(out.read_text())["cluster"]["device"]["memory_headroom_bytes"] == 6 * 2**30
    assert main(["simulate", str(out)]) == 0
    # the same plan on a device with almost no usable memory: simulate says so in its exit status
    data = json.loads(out.read_text())
    data["cluster"]["device"]["memory_headroom_bytes"] = 80 * 2**30 - 1000
    tight = tmp_path / "tight.json"
    tight.write_text(json.dumps(data))
    assert main(["simulate", str(tight)]) == 3
    assert "does not fit" in capsys.readouterr().err
    assert main([*args, "--memory-headroom", "lots"]) == 2


def test_pipedream_checks_memory_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "--model", "gpt3-175b", "--cluster", "a100-80gb:32", "--solver", "pipedream", "--global-batch", "64",
            "--no-offload"]
    assert main(args) == 3
    assert main([*args, "--option", "memory=true"]) == 3  # its message used to raise IndexError
    assert "usable of 80.0 GiB" in capsys.readouterr().err
