"""grpo.Trainer end to end on the tiny Qwen3-VL: real vLLM, real Ray, real FSDP on 2 ranks."""
import json
import re

import pytest
import yaml

import grpo
from grpo.algo.config import ConfigError


def _config(model, out, steps):
    return grpo.RunConfig(
        model=str(model), output_dir=str(out), steps=steps, tasks_per_step=2,
        env={"name": "maze", "options": {"size": 7, "max_turns": 4}},
        algorithm={"group_size": 4, "kl_coef": 0.001, "step_weight": 1.0},
        lora={"rank": 8, "alpha": 16.0}, train={"lr": 1e-3, "micro_batch_size": 16},
        rollout={"max_tokens_per_turn": 10, "history": "none"}, engine={"max_model_len": 2048},
        eval={"seeds": "0-3", "test_seeds": "10000-10003", "every": 1},
        checkpoint={"every": 1, "keep": 2}, cluster={"train_ranks": 2})


@pytest.mark.slow
def test_fit_writes_everything_and_resumes(tmp_path, tiny_vl):
    import ray

    class Hooks(grpo.Callback):
        def __init__(self):
            self.calls = []

        def on_train_begin(self, trainer):
            self.calls.append("begin")

        def on_phase_end(self, trainer, phase, seconds):
            self.calls.append(phase)

        def on_eval(self, trainer, label, result):
            self.calls.append(f"eval {label}")

        def on_step_end(self, trainer, record):
            self.calls.append(f"step {record['step']}")

        def on_train_end(self, trainer, summary):
            self.calls.append("end")

    out = tmp_path / "run"
    hooks = Hooks()
    summary = grpo.Trainer(_config(tiny_vl, out, steps=2), callbacks=[hooks]).fit()
    assert not ray.is_initialized()
    step = ["rollout", "advantages", "sleep", "train", "publish", "wake_up", "hotload", "eval"]
    assert hooks.calls == (["begin", "start", "actors_start", "eval", "eval before", "eval", "eval test before"]
                           + step + ["eval step 1", "step 1", "checkpoint"]
                           + step + ["eval step 2", "step 2", "checkpoint"]
                           + ["eval", "eval after", "eval", "eval test", "end"])
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2]
    for r in lines:
        for key in ("mean_reward", "success_rate", "mean_turns", "generated_tokens", "tokens_per_s"):
            assert key in r["rollout"]
        for key in ("loss", "kl", "clip_fraction", "grad_norm", "lr", "sampler_abs_diff"):
            assert key in r["train"], key
        assert set(r["time"]) == {"rollout_s", "train_s", "sync_s", "step_s"}
        # Every episode of a group starts in the same block: at least those first turns are anchored.
        assert 0 < r["step_anchored_share"] <= 1 and r["step_adv_abs_mean"] >= 0
        # The trainer scores exactly what vLLM sampled, with the adapter vLLM sampled with.
        assert r["train"]["sampler_abs_diff_max"] <= 1e-4
    # Each step's rollout used the version the previous step published (v1: the fresh adapter).
    assert [r["rollout_adapter_version"] for r in lines] == [1, 2]
    assert [r["adapter_version"] for r in lines] == [2, 3]
    assert summary["steps"] == 2 and summary["adapter_version"] == 3
    for key in ("eval_before", "eval_after", "test_before", "test_after", "grpo_wall_s"):
        assert summary[key] is not None
    assert json.loads((out / "summary.json").read_text())["eval_after"] == summary["eval_after"]
    assert (out / "curves.png").stat().st_size > 0
    assert any((out / "tensorboard").iterdir())
    assert (out / "config.yaml").read_text().startswith("model:")
    assert json.loads((out / "checkpoints" / "latest.json").read_text())["step"] == 2
    adapters = out / "store" / "adapters"
    assert (adapters / "v000003" / "adapter_config.json").is_file()
    # The workers are gone and so are their leases: nothing pins a version once the run ended.
    assert list((adapters / "readers").iterdir()) == []

    assert summary["stopped"] == "ran all 2 steps"

    # Same folder, more steps and checkpoints further apart (fields a resume may change): resumes after step 2
    # and publishes a fresh version before rolling out; a callback's Stop after step 3 ends the run there,
    # with a checkpoint that checkpoint.every (10) would not have saved.
    class StopAt3(grpo.Callback):
        def on_step_end(self, trainer, record):
            return grpo.Stop("enough") if record["step"] == 3 else None

    longer = _config(tiny_vl, out, steps=4)
    longer = grpo.RunConfig.from_dict({**longer.to_dict(), "checkpoint": {"every": 10, "keep": 2}})
    resumed = grpo.Trainer(longer, callbacks=[StopAt3()]).fit()
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if "event" not in r] == [1, 2, 3]
    assert lines[-1]["rollout_adapter_version"] == 4 and lines[-1]["adapter_version"] == 5
    assert resumed["steps"] == 3 and resumed["eval_before"] == summary["eval_before"]
    assert resumed["stopped"] == "StopAt3.on_step_end: enough"
    assert json.loads((out / "checkpoints" / "latest.json").read_text())["step"] == 3
    changed = [r for r in lines if r.get("event") == "config_change"]
    assert changed == [{"event": "config_change", "changes": [{"field": "checkpoint.every", "old": 1, "new": 10},
                                                              {"field": "steps", "old": 2, "new": 4}]}]
    assert yaml.safe_load((out / "config.yaml").read_text())["steps"] == 4  # rewritten for the resumed run

    # A run that stopped at its target is done: run again (a target step 3's eval met), it trains no more.
    again = _config(tiny_vl, out, steps=5)
    again = grpo.RunConfig.from_dict({**again.to_dict(), "eval": {**again.to_dict()["eval"], "target_success": 0.0}})
    done = grpo.Trainer(again).fit()
    steps = [json.loads(x).get("step") for x in (out / "metrics.jsonl").read_text().splitlines()
             if "event" not in json.loads(x)]
    assert steps == [1, 2, 3] and done["steps"] == 3
    assert done["stopped"] == "eval.target_success=0.0 reached at step 3"


def test_bad_config_fails_before_ray_starts(tmp_path, tiny_vl):
    import ray

    with pytest.raises(ConfigError, match=r"AlgorithmConfig\.clip_low=-0\.1"):
        grpo.RunConfig(model=str(tiny_vl), algorithm={"clip_low": -0.1})
    with pytest.raises(ConfigError, match="group_size"):
        grpo.RunConfig(model=str(tiny_vl), algorithm={"group_size": 1})
    with pytest.raises(ConfigError, match="known fields"):
        grpo.RunConfig(model=str(tiny_vl), rollout={"temprature": 0.7})
    with pytest.raises(ConfigError, match=r"train\.temperature=0\.7 .*one temperature, rollout\.temperature"):
        grpo.RunConfig(model=str(tiny_vl), train={"temperature": 0.7})
    with pytest.raises(FileNotFoundError, match="does not exist"):
        grpo.Trainer(grpo.RunConfig(model=str(tmp_path / "missing")))
    with pytest.raises(Exception, match="size"):
        grpo.Trainer(grpo.RunConfig(model=str(tiny_vl), env={"name": "maze", "options": {"size": 4}}))
    assert not ray.is_initialized()


def test_yaml_overrides_and_dry_run(tmp_path, tiny_vl, capsys):
    import subprocess
    import sys

    from grpo import train
    from grpo.cli import main
    from grpo.config import RunConfig

    path = tmp_path / "c.yaml"
    path.write_text(f"model: {tiny_vl}\nalgorithm: {{group_size: 4}}\nsteps: 5\ntrain: {{lr: 2e-4}}\n")
    cfg = RunConfig.from_yaml(path, ["--algo.clip_high", "0.3", "--steps=7", "--rollout.history", "none"])
    assert cfg.algorithm.clip_high == 0.3 and cfg.steps == 7 and cfg.rollout.history == "none"
    # Exponents without a dot are numbers, in the file and on the command line (YAML 1.1 says strings).
    assert cfg.train.lr == 2e-4
    assert RunConfig.from_yaml(path, ["--train.lr", "1e-3"]).train.lr == 1e-3
    assert cfg.algorithm.group_size == 4
    assert main(["train", str(path), "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["valid"] is True
    assert main(["train", str(path), "--algo.clip_low", "-1", "--dry-run"]) == 2
    assert "clip_low" in capsys.readouterr().err
    # The dry run builds the env as the trainer's pre-flight check does.
    assert main(["train", str(path), "--env.options", "{size: 4}", "--dry-run"]) == 2
    assert "size" in capsys.readouterr().err
    # `python -m grpo.train` is `grpo train`; so is `python -m grpo train`.
    assert train.main([str(path), "--dry-run"]) == 0
    capsys.readouterr()
    done = subprocess.run([sys.executable, "-m", "grpo", "train", str(path), "--dry-run"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and json.loads(done.stdout.strip().splitlines()[-1])["valid"] is True, done.stderr


# A user's script, run as a file; with one train rank (every value validation accepts must run).
_KILLED_RUN = """
import dataclasses
import grpo
from test_trainer import _config
config = _config({model!r}, {out!r}, steps=50)
grpo.Trainer(dataclasses.replace(config, cluster={{"train_ranks": 1}})).fit()
"""


@pytest.mark.slow
def test_sigterm_mid_run_shuts_ray_down_and_keeps_the_last_checkpoint_and_adapter(tmp_path, tiny_vl):
    """SIGTERM to `python train.py` in fit(): exit status 143, one line saying why, the last checkpoint and
    how to resume; Ray's processes and folder gone. (It was status 1 and silent when the signal came while
    ray.init ran: Ray's own handlers exit 15 or 1 then.)"""
    import glob
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from sync import AdapterStore

    out = tmp_path / "run"
    before = set(glob.glob("/tmp/grpo-ray-*"))
    script = tmp_path / "train.py"
    script.write_text(_KILLED_RUN.format(model=str(tiny_vl), out=str(out)))
    log = tmp_path / "stderr.txt"
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, str(script)], cwd=Path(__file__).parents[1],
                                env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)},  # it imports test_trainer
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.time() + 600
        while not (out / "checkpoints" / "latest.json").is_file():
            assert proc.poll() is None and time.time() < deadline, "the run ended before its first checkpoint"
            time.sleep(0.5)
        run_tmp = set(glob.glob("/tmp/grpo-ray-*")) - before
        assert len(run_tmp) == 1  # the run's own Ray session folder, present while it runs
        proc.send_signal(signal.SIGTERM)  # in step 2 (rollout, train, publish, eval or checkpoint)
        assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not any(os.path.exists(d) for d in run_tmp)
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert not any(d in ps for d in run_tmp), "a Ray process of the killed run is still alive"
    latest = json.loads((out / "checkpoints" / "latest.json").read_text())
    assert latest["step"] >= 1
    last = [line for line in log.read_text().splitlines() if line.startswith("[grpo]")][-1]
    where = re.escape(str(out / "checkpoints" / latest["dir"]))
    stopped = re.fullmatch(rf"\[grpo\] stopped by SIGTERM in step (\d+); last checkpoint: step {latest['step']} at "
                           rf"{where}; run the same command to resume", last)
    assert stopped and int(stopped[1]) in (latest["step"], latest["step"] + 1), last
    assert yaml.safe_load((out / "config.yaml").read_text())["cluster"]["train_ranks"] == 1
    served = AdapterStore(str(out / "store")).latest_verified()
    assert served is not None and served.version >= 2  # step 1 published v2; whatever followed verifies too
