"""Self-healing runs: faults injected into real actors (kill -9, hang, a lost node) and the run finishing anyway."""
import glob
import json
import subprocess
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

import grpo
from grpo.algo.config import ConfigError
from grpo.driver.fault import ActorFault, ActorStartError, FaultConfig, InjectionPlan, parse_fault
from grpo.report.metrics import drop_steps_after


def test_fault_specs_parse_and_fire_once():
    assert parse_fault("kill:rollout@step=2").spec == "kill:rollout=0@step=2"
    f = parse_fault(" hang:train_rank=1@step=4 ")
    assert (f.kind, f.target, f.index, f.step, f.actor) == ("hang", "train_rank", 1, 4, "train_rank-1")
    for bad in ("kill:rollout", "explode:rollout@step=1", "kill:gpu@step=1", "kill:rollout@step=0", 3):
        with pytest.raises(ValueError, match="KIND:TARGET"):
            parse_fault(bad)
    plan = InjectionPlan([parse_fault("kill:rollout@step=2"), parse_fault("kill:train_rank=1@step=2")],
                         fired=["kill:train_rank=1@step=2"])  # fired before the checkpoint it resumed from
    assert plan.take(1, "rollout") == []
    assert [x.spec for x in plan.take(2, "rollout")] == ["kill:rollout=0@step=2"]
    assert plan.take(2, "rollout") == []  # the replayed step after the restart: not again
    assert plan.take(2, "train_rank") == []


def test_fault_section_is_validated():
    assert FaultConfig().max_restarts == 3
    assert FaultConfig(inject="kill:rollout@step=1").inject == ("kill:rollout@step=1",)
    with pytest.raises(ConfigError, match=r"FaultConfig\.inject=.*KIND:TARGET"):
        FaultConfig(inject=("kill:rollout@2",))
    with pytest.raises(ConfigError, match=r"FaultConfig\.call_timeout_s=0"):
        FaultConfig(call_timeout_s=0)
    cfg = grpo.RunConfig.from_dict({"model": "m", "fault": {"inject": ["hang:rollout@step=3"], "max_restarts": 1}})
    assert cfg.fault.faults == [parse_fault("hang:rollout@step=3")]
    assert "hang:rollout@step=3" in cfg.to_yaml()


def test_a_fault_that_cannot_fire_is_refused_before_ray_starts(tmp_path, tiny_vl):
    import ray

    for spec, match in (("kill:train_rank=2@step=1", "index below 2"), ("kill:rollout@step=9", "at most steps")):
        cfg = grpo.RunConfig(model=str(tiny_vl), output_dir=str(tmp_path), steps=3, algorithm={"group_size": 2},
                             fault={"inject": [spec]}, cluster={"train_ranks": 2})
        with pytest.raises(ConfigError, match=match):
            grpo.Trainer(cfg)
    assert not ray.is_initialized()


def test_drop_steps_after_keeps_events_and_earlier_steps(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [{"step": 1, "x": 1}, {"step": 2, "x": 2}, {"event": "restart", "step": 3}, {"step": 3, "x": 3}]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert drop_steps_after(path, 3) == 0
    assert drop_steps_after(path, 1) == 2
    assert [json.loads(x) for x in path.read_text().splitlines()] == [lines[0], lines[2]]
    assert drop_steps_after(tmp_path / "none.jsonl", 0) == 0


@pytest.mark.slow
def test_gather_names_the_dead_and_the_hung_actor_and_lets_a_bug_through(tmp_path):
    import ray

    from grpo.driver.fault import arm, gather

    class _Echo:  # defined here: Ray ships it by value (the tests folder is not importable in a worker)
        def echo(self, x):
            return x

        def fail(self):
            raise ValueError("a bug, not a fault")

    class _Broken:
        def __init__(self):
            raise ImportError("No module named 'user_envs'")

    ray_tmp = tempfile.mkdtemp(prefix="grpo-ray-", dir="/tmp")
    ray.init(num_cpus=2, _temp_dir=ray_tmp, include_dashboard=False, log_to_driver=False)
    try:
        a, b = ray.remote(_Echo).remote(), ray.remote(_Echo).remote()
        assert gather([("a", a.echo.remote(1)), ("b", b.echo.remote(2))], 60, "echo") == [1, 2]
        with pytest.raises(ValueError, match="a bug"):
            gather([("a", a.fail.remote())], 60, "fail")
        broken = ray.remote(_Broken).remote()
        with pytest.raises(ActorStartError, match=r"(?s)c could not start, not retried: .*user_envs"):
            gather([("c", broken.__ray_ready__.remote())], 60, "start")
        arm(b, parse_fault("hang:rollout@step=1"))
        with pytest.raises(ActorFault, match="no answer to echo within 2 s") as hung:
            gather([("a", a.echo.remote(1)), ("b", b.echo.remote(2))], 2, "echo")
        assert hung.value.actor == "b" and hung.value.waited_s == 2
        arm(a, parse_fault("kill:rollout@step=1"))
        with pytest.raises(ActorFault, match="ActorDiedError during echo") as died:
            gather([("a", a.echo.remote(1))], 60, "echo")
        assert died.value.actor == "a"
    finally:
        ray.shutdown()
        subprocess.run(["rm", "-rf", ray_tmp])


def _config(model, out, steps, **sections):
    base = dict(
        model=str(model), output_dir=str(out), steps=steps, tasks_per_step=2,
        env={"name": "maze", "options": {"size": 7, "max_turns": 3}}, algorithm={"group_size": 2},
        lora={"rank": 8, "alpha": 16.0}, train={"lr": 1e-3, "micro_batch_size": 16},
        rollout={"max_tokens_per_turn": 10, "history": "none"}, engine={"max_model_len": 2048},
        eval={"seeds": "0-1"}, checkpoint={"every": 2, "keep": 2}, cluster={"train_ranks": 2},
        metrics={"plots": False, "tensorboard": False})
    base.update(sections)
    return grpo.RunConfig(**base)


def _check_finished_run(out: Path, steps: int, restarts: list[str]) -> list[dict]:
    from sync import AdapterStore

    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == steps and summary["restarts"] == len(restarts)
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "event" not in r] == list(range(1, steps + 1))  # one line a step
    # A replayed step's episodes replace the ones its first run wrote: the same count for every step.
    sampled = Counter(json.loads(x)["step"] for x in (out / "samples.jsonl").read_text().splitlines())
    assert sorted(sampled) == list(range(1, steps + 1)) and len(set(sampled.values())) == 1, sampled
    events = [r for r in records if r.get("event") == "restart"]
    assert [e["actor"] for e in events] == restarts
    for e in events:
        assert e["recovery_s"] > 0 and 0 <= e["resumed_step"] < e["step"]
    store = AdapterStore(str(out / "store"))
    versions = store.versions()
    assert versions and all(store.verify(v.version) for v in versions)
    assert versions[-1].version == summary["adapter_version"]
    return events


def _ray_leftovers(before: set) -> list[str]:
    folders = set(glob.glob("/tmp/grpo-ray-*")) - before
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return sorted(folders) + [line for line in ps.splitlines() if any(d in line for d in folders)]


def test_past_the_restart_limit_the_run_stops_with_the_last_cause(tmp_path, tiny_vl):
    """No Ray needed to see the limit: the recovery path with its restart budget used up."""
    from grpo.driver.trainer import RunFailedError, Trainer

    trainer = Trainer(_config(tiny_vl, tmp_path / "run", steps=2, fault={"max_restarts": 0}))
    trainer.restarts, trainer._step, trainer._recovery = 0, 2, None
    with pytest.raises(RunFailedError, match=r"rollout-0 failed in step 2: ActorDiedError during rollout.*"
                                             r"all 0 restarts \(fault.max_restarts\); no checkpoint yet"):
        trainer._recover(ActorFault("rollout-0", "ActorDiedError during rollout: The actor died."))


def test_a_restart_says_whether_a_checkpoint_is_there_to_resume_from(tmp_path, tiny_vl, capsys):
    """Seen on 2026-12-04: a run without a checkpoint restarted from step 1 while its line said "from the last
    checkpoint"."""
    from grpo.driver.trainer import Trainer

    trainer = Trainer(_config(tiny_vl, tmp_path / "run", steps=2, fault={"max_restarts": 1}))
    trainer.restarts, trainer._step, trainer._recovery = 0, 2, None
    trainer._recover(ActorFault("rollout-0", "OutOfMemoryError during rollout: a worker was killed."))
    assert ("rollout-0 failed in step 2: OutOfMemoryError during rollout: a worker was killed; restart 1 of 1: "
            "new actors, no checkpoint yet, starting again from step 1") in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_lost_rollout_node_is_replaced_and_the_run_finishes(tmp_path, tiny_vl, monkeypatch):
    """Ray's own multi-node test cluster: head, a train node and a rollout node, each its own raylet. The
    rollout node goes away mid-run; a fresh one joins; the run recovers onto it."""
    import ray
    from ray.cluster_utils import Cluster

    out = tmp_path / "run"
    ray_tmp = tempfile.mkdtemp(prefix="grpo-ray-", dir="/tmp")
    # Cluster notes its address under Ray's default temp folder ($RAY_TMPDIR/ray): inside ours, not the system's.
    monkeypatch.setenv("RAY_TMPDIR", ray_tmp)
    Path(ray_tmp, "ray").mkdir()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "temp_dir": ray_tmp,
                                                            "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=2, resources={"train_node": 2}, temp_dir=ray_tmp)
        rollout_node = cluster.add_node(num_cpus=1, resources={"rollout_node": 1}, temp_dir=ray_tmp)
        cfg = _config(tiny_vl, out, steps=3, checkpoint={"every": 1, "keep": 2},
                      cluster={"address": cluster.address, "train_ranks": 2,
                               "rollout_resources": {"rollout_node": 1}, "train_resources": {"train_node": 1}},
                      fault={"call_timeout_s": 120, "start_timeout_s": 300})
        # The trainer runs in a thread: Ray adds a node only from the main thread (it sets signal handlers).
        result = {}

        def run():
            try:
                result["summary"] = grpo.Trainer(cfg).fit()
            except BaseException as e:  # re-raised below, in the test's thread
                result["error"] = e

        trainer = threading.Thread(target=run, daemon=True)
        trainer.start()
        while not (out / "checkpoints" / "latest.json").is_file():  # step 1 done: step 2 is starting
            assert trainer.is_alive(), result
            time.sleep(0.2)
        cluster.remove_node(rollout_node)
        cluster.add_node(num_cpus=1, resources={"rollout_node": 1}, temp_dir=ray_tmp)
        trainer.join()
        if "error" in result:
            raise result["error"]
        assert not ray.is_initialized()  # the trainer disconnected from the cluster it joined
        events = _check_finished_run(out, 3, ["rollout-0"])
        shown = ("actor", "cause", "detect_s", "recovery_s")
        print(json.dumps({"recovery": [{k: e[k] for k in shown} for e in events]}))
    finally:
        ray.shutdown()
        cluster.shutdown()
        subprocess.run(["rm", "-rf", ray_tmp])
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert ray_tmp not in ps, "a Ray process of the test cluster is still alive"
