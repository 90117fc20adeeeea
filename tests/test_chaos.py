"""Faults change nothing but time: one supervised run of 10 steps through six faults of six kinds ends with the
adapter of the same run without faults, bit for bit, having sampled the same episodes step for step."""
import glob
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_recovery import _check_finished_run, _ray_leftovers

import grpo
from examples.maze import maze_config

ROOT = Path(__file__).resolve().parents[1]
STEPS = 10
# Six kinds at six steps. The corrupted checkpoint of step 5 is found when the hang of step 6 restarts the run:
# it resumes from step 4's and replays 5 and 6.
FAULTS = ["kill:rollout@step=2", "corrupt:adapter@step=3", "kill:train_rank=1@step=4", "corrupt:checkpoint@step=5",
          "hang:rollout@step=6", "kill:driver@step=8"]


def _config(out: Path, faults=()) -> dict:
    # The maze warm start: its episodes differ within a group (progress shaping), so every step trains and a
    # replay that sampled anything else would end with another adapter.
    return {"model": str(maze_config.WARMSTART), "output_dir": str(out), "steps": STEPS, "tasks_per_step": 2,
            "env": {"name": "maze", "options": dict(maze_config.ENV_OPTIONS, max_turns=8, progress_reward=0.1)},
            "algorithm": {"group_size": 4}, "lora": {"rank": 8, "alpha": 16.0},
            "train": {"lr": 2e-2, "micro_batch_size": 64},
            "rollout": {"temperature": 0.7, "max_tokens_per_turn": maze_config.MAX_TOKENS_PER_TURN,
                        "history": maze_config.HISTORY},
            "engine": {"max_model_len": 1024}, "eval": {"seeds": "0-3", "every": 0},
            "checkpoint": {"every": 1, "keep": 2}, "cluster": {"train_ranks": 2},
            "fault": {"inject": list(faults), "call_timeout_s": 30, "max_restarts": 4},
            "metrics": {"plots": False, "tensorboard": False}}


def _steps(out: Path) -> list[tuple]:
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["rollout"]["generated_tokens"], r["rollout"]["mean_reward"], r["train"]["loss"],
             r["train"]["grad_norm"]) for r in lines if "event" not in r]


def _replies(out: Path) -> dict:
    lines = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    return {(e["step"], e["seed"], i): [t["reply"] for t in e["turns"]] for i, e in enumerate(lines)}


def _final_adapter(out: Path) -> bytes:
    summary = json.loads((out / "summary.json").read_text())
    return (Path(summary["adapter_path"]) / "adapter_model.safetensors").read_bytes()


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_six_faults_of_six_kinds_change_nothing_but_time(tmp_path):
    before = set(glob.glob("/tmp/grpo-ray-*"))
    chaos = tmp_path / "chaos"
    (tmp_path / "chaos.yaml").write_text(yaml.safe_dump(_config(chaos, FAULTS)))
    done = subprocess.run([sys.executable, "-m", "grpo", "train", str(tmp_path / "chaos.yaml"), "--supervise", "2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=1700)
    assert done.returncode == 0, done.stderr[-4000:]
    err = done.stderr
    assert "failed verification as the rollout workers loaded it" in err  # step 3's adapter, published again
    assert "__0_0.distcp fails its sha256" in err and "resuming from step 4" in err
    assert "[grpo] the driver died of SIGKILL" in err and "relaunch 1 of 2" in err
    # One line a step, the replayed steps' episodes in place of the first attempts', every adapter verified.
    restarts = _check_finished_run(chaos, STEPS, ["rollout-0", "train_rank-1", "rollout-0"])
    assert [(e["step"], e["resumed_step"]) for e in restarts] == [(2, 1), (4, 3), (6, 4)]
    assert "ActorDiedError" in restarts[0]["cause"] and "ActorDiedError" in restarts[1]["cause"]
    assert "no answer to rollout within 30 s" in restarts[2]["cause"] and restarts[2]["detect_s"] == 30
    events = [json.loads(x) for x in (chaos / "metrics.jsonl").read_text().splitlines() if '"event"' in x]
    assert [e["signal"] for e in events if e["event"] == "relaunch"] == ["SIGKILL"]

    calm = tmp_path / "calm"
    summary = grpo.Trainer(grpo.RunConfig.from_dict(_config(calm))).fit()
    assert summary["steps"] == STEPS
    assert _steps(chaos) == _steps(calm) and len(_steps(calm)) == STEPS
    assert any(loss != 0 for *_, loss, _ in _steps(calm))  # it trained: equal adapters mean something
    assert _replies(chaos) == _replies(calm)
    assert _final_adapter(chaos) == _final_adapter(calm)
    # Nothing of the runs is left: not the killed driver's Ray, not its temp folder.
    assert _ray_leftovers(before) == []
    print(json.dumps({"faults": [{k: e.get(k) for k in ("event", "step", "actor", "signal", "detect_s", "recovery_s",
                                                          "ran_s", "backoff_s")} for e in events]}))
