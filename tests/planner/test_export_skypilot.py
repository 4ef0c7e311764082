"""Cloud plans as SkyPilot tasks: the structure, and SkyPilot's own parser reading them."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import solvers.cloud as cloud
from planner.export_skypilot import skypilot_task, skypilot_yaml
from planner.schema_cloud import CloudJob, CloudProblem

# The SkyPilot catalogue rows the parser checks instance types against (it downloads them
# otherwise; tests run offline): InstanceType, AcceleratorName, AcceleratorCount, vCPUs,
# MemoryGiB, GpuInfo, Price, SpotPrice, Region, then AvailabilityZone (AWS, GCP) or Generation (Azure).
AWS_ROWS = ["p2.xlarge,K80,1,4,61,,0.9,0.3,us-east-1,us-east-1a", "p3.2xlarge,V100,1,8,61,,3.06,0.93,us-east-1,us-east-1a",
            "p3.8xlarge,V100,4,32,244,,12.24,3.67,us-east-1,us-east-1a"]
GCP_ROWS = ["n1-standard-8,,,8,30,,0.38,0.08,us-west1,us-west1-a", ",V100,1,,,V100,2.48,0.74,us-west1,us-west1-a"]
AZURE_ROWS = ["Standard_NC6,K80,1,6,56,,0.9,0.12,eastus,V1", "Standard_NC6s_v2,P100,1,6,112,,2.07,0.26,eastus,V1",
              "Standard_NC24s_v2,P100,4,24,448,,8.28,1.04,eastus,V1", "Standard_NC6s_v3,V100,1,6,112,,3.06,0.6,eastus,V1"]


def _plan(jobs: tuple[CloudJob, ...], **fields):
    return cloud.solve(CloudProblem(jobs=jobs, **fields))


def split_plan():
    """A3C under a deadline: 60 % K80, 40 % V100 on AWS on-demand (the chapter's switching example)."""
    job = CloudJob(id="a3c", throughputs={"k80": 1.0, "v100": 2.2}, num_steps=1.48 * 10 * 3600, slo_h=10)
    return _plan((job,), markets=("on-demand",), instances=("p2.xlarge", "p3.2xlarge"))


def single_plan():
    """Azure P100 spot: the 4-GPU type (fewer preemptions) at the same price per GPU as the 1-GPU type."""
    job = CloudJob(id="transformer", throughputs={"k80": 1.0, "p100": 3.3, "v100": 3.3}, num_steps=3.3 * 3600 * 20, restart_s=600)
    return _plan((job,), markets=("spot",), clouds=("azure",))


def gcp_plan():
    """A V100 attached to an n1 host on GCP (SkyPilot's instance_type is the host)."""
    job = CloudJob(id="resnet", throughputs={"v100": 9.6}, num_steps=9.6 * 3600)
    return _plan((job,), markets=("spot",), instances=("gcp/us-west1/n1-standard-8-v100x1",))


def test_single_option_is_a_plain_resources_block() -> None:
    task = skypilot_task(single_plan(), "transformer")
    assert task["resources"] == {"cloud": "azure", "region": "eastus", "instance_type": "Standard_NC24s_v2",
                                 "accelerators": "P100:4", "use_spot": True}


def test_time_split_becomes_ordered_candidates_largest_share_first() -> None:
    task = skypilot_task(split_plan(), "a3c")
    assert task["resources"]["cloud"] == "aws" and task["resources"]["use_spot"] is False
    assert [c["instance_type"] for c in task["resources"]["ordered"]] == ["p2.xlarge", "p3.2xlarge"]
    assert [c["accelerators"] for c in task["resources"]["ordered"]] == ["K80:1", "V100:1"]
    text = skypilot_yaml(split_plan(), "a3c")
    assert "#    60.0% of its time on aws/us-east-1/p2.xlarge on-demand" in text


def test_interchangeable_options_become_any_of() -> None:
    plan = split_plan()
    same = plan.options["aws/us-east-1/p2.xlarge:on-demand"]
    twin = same.model_copy(update={"region": "us-west-2", "instance": "aws/us-west-2/p2.xlarge"})
    jobs = dict(plan.jobs)
    jobs["a3c"] = jobs["a3c"].model_copy(update={"fractions": {"aws/us-east-1/p2.xlarge:on-demand": 0.5, "twin": 0.5}})
    plan = plan.model_copy(update={"options": {"aws/us-east-1/p2.xlarge:on-demand": same, "twin": twin}, "jobs": jobs})
    resources = skypilot_task(plan, "a3c")["resources"]
    assert resources["accelerators"] == "K80:1"
    assert resources["any_of"] == [{"region": "us-east-1"}, {"region": "us-west-2"}]


@pytest.mark.skipif(importlib.util.find_spec("sky") is None, reason="skypilot is not installed (the test extra has it)")
def test_skypilot_parses_the_exported_tasks(tmp_path: Path) -> None:
    files = {"a3c": split_plan(), "transformer": single_plan(), "resnet": gcp_plan()}
    for job, plan in files.items():
        (tmp_path / f"{job}.yaml").write_text(skypilot_yaml(plan, job, run="python train.py"))
    script = f"""
import json, os, sys
from sky.catalog import common
root = common._ABSOLUTE_VERSIONED_CATALOG_DIR
for cloud, header, rows in (("aws", "AvailabilityZone", {AWS_ROWS!r}), ("azure", "Generation", {AZURE_ROWS!r}),
                            ("gcp", "AvailabilityZone", {GCP_ROWS!r})):
    os.makedirs(os.path.join(root, cloud), exist_ok=True)
    with open(os.path.join(root, cloud, "vms.csv"), "w") as f:
        f.write("InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region," + header + "\\n")
        f.write("\\n".join(rows) + "\\n")
import sky
out = {{}}
for job in ("a3c", "transformer", "resnet"):
    task = sky.Task.from_yaml(os.path.join({str(tmp_path)!r}, job + ".yaml"))
    out[job] = {{"name": task.name, "run": task.run, "ordered": isinstance(task.resources, list),
                "resources": [[str(r.cloud), r.region, r.instance_type, r.accelerators, r.use_spot] for r in task.resources]}}
print(json.dumps(out))
"""
    env = {**os.environ, "HOME": str(tmp_path)}  # SkyPilot's catalogue and state live under ~/.sky
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["a3c"]["name"] == "a3c" and out["a3c"]["run"] == "python train.py"
    assert out["a3c"]["ordered"] is True  # SkyPilot keeps `ordered` candidates as a list, in order
    assert out["a3c"]["resources"] == [["AWS", "us-east-1", "p2.xlarge", {"K80": 1}, False],
                                       ["AWS", "us-east-1", "p3.2xlarge", {"V100": 1}, False]]
    assert out["transformer"]["resources"] == [["Azure", "eastus", "Standard_NC24s_v2", {"P100": 4}, True]]
    assert out["resnet"]["resources"] == [["GCP", "us-west1", "n1-standard-8", {"V100": 1}, True]]
