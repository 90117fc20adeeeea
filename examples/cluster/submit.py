"""Submit a run to a Ray cluster as a Ray Job, and follow it to the end.

    python -m examples.cluster.submit --address http://HEAD:8265 CONFIG.yaml [--section.field VALUE ...]

The job's entrypoint is `python -m grpo train CONFIG --cluster.address auto --supervise`: the driver runs on
the head node, joins the cluster the job runs in, and is relaunched (resuming from its last checkpoint) if it
dies of a signal. `output_dir`, the model and the config must sit on storage every node reads at the same path
(the adapter store and the checkpoints live in output_dir). A Ray Job itself is never retried by Ray; on
Kubernetes the RayJob's `backoffLimit` (examples/cluster/rayjob.yaml) reruns a job that failed as a whole.
Prints the job's log as it comes, then one JSON line: the job id, its final status and the run's summary.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def entrypoint(config: str, overrides: list[str], relaunches: int = 3) -> str:
    import shlex

    return shlex.join([sys.executable, "-m", "grpo", "train", config, "--cluster.address", "auto",
                       "--supervise", str(relaunches), *overrides])


def submit(address: str, config: str, overrides: list[str], timeout_s: float = 24 * 3600,
           working_dir: str | None = None) -> dict:
    """Submit, stream the log, wait for the end; returns {"job_id", "status", "summary"}."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    import grpo

    run = grpo.RunConfig.from_yaml(config, overrides)  # refused here, before the cluster sees it
    client = JobSubmissionClient(address)
    ready_by = time.monotonic() + 120
    while True:
        try:
            job_id = client.submit_job(entrypoint=entrypoint(str(Path(config).resolve()), overrides),
                                       runtime_env={"working_dir": working_dir} if working_dir else None)
            break
        except RuntimeError as e:  # a cluster that just started: its node's job agent is not up yet
            if "No available agent" not in str(e) or time.monotonic() > ready_by:
                raise
            time.sleep(2)
    print(f"[grpo] submitted {job_id} to {address}", file=sys.stderr, flush=True)
    shown, deadline = 0, time.monotonic() + timeout_s
    while True:
        status = client.get_job_status(job_id)
        log = client.get_job_logs(job_id)
        sys.stderr.write(log[shown:])
        shown = len(log)
        if status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
            break
        if time.monotonic() > deadline:
            client.stop_job(job_id)
            raise TimeoutError(f"job {job_id} ran past {timeout_s:g} s: stopped")
        time.sleep(2)
    summary_file = Path(run.output_dir) / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else None
    return {"job_id": job_id, "status": str(status.value), "summary": summary}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m examples.cluster.submit", description=__doc__.split("\n\n")[0])
    ap.add_argument("config", help="the run's YAML, on storage the head node reads at the same path")
    ap.add_argument("--address", default="http://127.0.0.1:8265", help="the cluster's dashboard (job server)")
    ap.add_argument("--working-dir", help="ship this folder to the job (runtime_env working_dir)")
    args, overrides = ap.parse_known_args(argv)
    result = submit(args.address, args.config, overrides, working_dir=args.working_dir)
    keys = ("eval_before", "eval_after", "steps", "restarts")
    print(json.dumps({**result, "summary": {k: result["summary"][k] for k in keys} if result["summary"] else None}))
    return 0 if result["status"] == "SUCCEEDED" else 1


if __name__ == "__main__":
    raise SystemExit(main())
