"""Runs on a Ray cluster: submitted as a Ray Job (examples/cluster/submit.py) to a real head node started with
`ray start`, and the KubeRay RayJob manifest (examples/cluster/rayjob.yaml) that reruns a failed job."""
import contextlib
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from examples.cluster import submit

ROOT = Path(__file__).resolve().parents[1]


def test_the_job_entrypoint_joins_the_cluster_and_is_supervised():
    command = shlex.split(submit.entrypoint("/shared/run.yaml", ["--steps", "3"], relaunches=2))
    assert command[1:] == ["-m", "grpo", "train", "/shared/run.yaml", "--cluster.address", "auto", "--supervise", "2",
                           "--steps", "3"]


def test_the_rayjob_manifest_reruns_a_failed_job_with_a_supervised_driver():
    job = yaml.safe_load((ROOT / "examples" / "cluster" / "rayjob.yaml").read_text())
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    spec = job["spec"]
    assert spec["backoffLimit"] >= 1 and spec["shutdownAfterJobFinishes"] is True
    entry = shlex.split(spec["entrypoint"])
    assert entry[:3] == ["python", "-m", "grpo"] and "--supervise" in entry
    assert entry[entry.index("--cluster.address") + 1] == "auto"
    # Every pod mounts the shared volume that holds the run folder, at the same path.
    pods = [spec["rayClusterSpec"]["headGroupSpec"]] + spec["rayClusterSpec"]["workerGroupSpecs"]
    mounts = [{m["mountPath"] for c in p["template"]["spec"]["containers"] for m in c["volumeMounts"]} for p in pods]
    assert all(m == {"/shared"} for m in mounts) and entry[4].startswith("/shared/")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_run_submitted_as_a_ray_job_trains_on_the_cluster(tmp_path, tiny_vl):
    import psutil

    config = {"model": str(tiny_vl), "output_dir": str(tmp_path / "run"), "steps": 1, "tasks_per_step": 2,
              "env": {"name": "maze", "options": {"size": 7, "max_turns": 3}}, "algorithm": {"group_size": 2},
              "lora": {"rank": 8, "alpha": 16.0}, "rollout": {"max_tokens_per_turn": 10, "history": "none"},
              "engine": {"max_model_len": 2048}, "eval": {"seeds": "0-1", "every": 0},
              "cluster": {"train_ranks": 1}, "metrics": {"plots": False, "tensorboard": False}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    dashboard = _free_port()
    ray_tmp = tempfile.mkdtemp(prefix="grpo-ray-", dir="/tmp")  # Unix socket paths must stay short
    head = subprocess.Popen([str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", "--num-cpus", "4",
                             "--port", str(_free_port()), "--dashboard-port", str(dashboard), "--temp-dir", ray_tmp,
                             "--dashboard-agent-listen-port", str(_free_port()),
                             "--include-dashboard", "true", "--disable-usage-stats"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        address = f"http://127.0.0.1:{dashboard}"
        deadline = time.monotonic() + 120
        while True:  # the job server answers once the dashboard is up
            try:
                from ray.job_submission import JobSubmissionClient

                JobSubmissionClient(address).list_jobs()
                break
            except Exception:
                assert head.poll() is None, head.stderr.read()[-2000:]
                assert time.monotonic() < deadline, "the head node's job server never answered"
                time.sleep(1)
        result = submit.submit(address, str(tmp_path / "run.yaml"), [], timeout_s=900)
        assert result["status"] == "SUCCEEDED", result
        assert result["summary"]["steps"] == 1 and result["summary"]["adapter_version"] == 2
    finally:
        processes = [head, *psutil.Process(head.pid).children(recursive=True)] if head.poll() is None else []
        for p in processes:
            # A child may exit between the listing and the kill (it did once, in a `make test`): that is the goal.
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        head.wait()
        subprocess.run(["rm", "-rf", ray_tmp])
