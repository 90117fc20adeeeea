"""Rollouts ahead of the trainer (pipeline.max_staleness) and continuous rollout scheduling, side by side.

    python -m benchmarks.pipeline [--quick] [--parts continuous_vs_lockstep,async_vs_sync_tool_env,...]

The "tool" env (defined here) stands for a tool or sandbox call: reset is free; step t of the episode of task
seed s sleeps a latency drawn from a Pareto distribution (x_min 0.05 s, alpha 1: median 0.1 s, P(> 1 s) = 5%)
clipped to [0.05, 2] s (mean 0.24 s) by a generator keyed on (SEED, s, t), so every schedule and run sees the
same latencies (a task's G episodes share them); task s's episodes last 2-6 turns (uniform, keyed on (SEED,
s)). Reward: 1/turns for each reply holding a digit, so groups differ. Parts, two sides each, in one run:
- continuous_vs_lockstep: one rollout (32 tasks x G=2 of the tool env, tiny text model, in-process vLLM),
  `rollout.schedule` continuous against lockstep, A B A B, medians; episodes/s. Lockstep waits each turn for
  the slowest env call of all live episodes (a sum over turns of maxima), continuous for each episode's own
  calls only (a maximum over episodes of sums).
- async_vs_sync_tool_env: grpo.Trainer on the tool env (32 tasks x G=2, tiny text model, LoRA r16, one train
  rank, one local Ray node): max_staleness 1 with continuous rollouts against the synchronous loop (k=0,
  lockstep). On 2 quiet cores the continuous rollout takes about 4 s, lockstep's 9 s and the update 1-2 s
  (2-3 s under load); the rollout is mostly env waits, so the update runs on the cores it leaves idle. Two
  changes at once (the schedule and the pipeline): the parts below take them apart.
- async_vs_sync_same_schedule_tool_env: the same, continuous rollouts at both k: the pipeline's own gain. Its
  k=0 run over async_vs_sync_tool_env's is the schedule's own gain in training
  (continuous_vs_lockstep_sync_tool_env).
- async_vs_sync_disaggregated: a Ray test cluster whose rollout node's raylet starts on core 0 and train node's
  on core 1; every process inherits its raylet's affinity (read back from /proc/PID/task/*/status of both
  actors: `pinned`), so each side has a core of its own as on separate machines and the synchronous loop
  leaves one idle while the other works. "maze": the maze example's step (examples/maze/cpu.yaml, its warm
  start; 2 mazes x G=4, one update a batch, lockstep), about 3.4 s: its update takes about 1.6x as long as
  its rollout (2-3x before the vision tower ran once per distinct image), more at larger sizes (the update
  grows with the episodes, the rollout far less), which caps the gain at 1 + rollout / update, about 1.6 here.
  "tool": the tool env, G=4, continuous
  rollouts on both sides, sized so that rollout and update take about 5 s each on their core.
- colocated_maze: the maze step on one local Ray node, both sides free to use both cores; reported, not in the
  headline. Overlap pays here only as far as a side leaves a core idle; with sides that each kept both cores
  busy it could not. These do not: vLLM's engine loop on a model this small keeps about one core busy while
  it rolls out (the actors' busy_share: CPU seconds over the wall seconds of the steps measured), so the
  synchronous loop idles a core during every rollout and k=1 fills it, at the cost of a slower update.
Each k=0/k=1 pair is one config but for the pipeline (and the schedule where said), tis_cap 2 on both sides.
Steps/s and trained episodes/s: over steps 2..N-1 on the run's clock (metrics.jsonl wall_s), the steps that
each wait for one rollout (at k=1, step 1 waits for its own and step N for none: the pipeline fills and
drains). ratio_overlap_est: the k=0 median step over its longer side (the rollout as long as at k=1, or the
update + sync). The maze runs use lr 1e-5 (the example: 2e-3) and keep zero-signal groups, so the work a step
stays the same over the steps measured in both runs. logprob_gap_max: the largest trainer-vs-vLLM logprob
gap on the sampled tokens (train.sampler_abs_diff_max) over the k=0 steps of every run, the parity figure;
logprob_gap_max_async: over the k=1 steps, where it includes one update's change of the policy (staleness).

The last line printed is one JSON object, also written to benchmarks/results/pipeline.json (pipeline-quick.json
with --quick): the ratios at its top level (continuous_vs_lockstep, async_vs_sync_tool_env,
async_vs_sync_disaggregated: the maze's, async_vs_sync_disaggregated_tool_env, colocated_maze; steps/s, k=1
over k=0, or episodes/s, continuous over lockstep), and beside them the k=1 over k=0 ratios of the pairs whose
two sides ran the same schedule (async_vs_sync_same_schedule_tool_env, async_vs_sync_same_schedule_disaggregated:
the maze's, ..._disaggregated_tool_env; None where the schedules differ) and continuous_vs_lockstep_sync_tool_env;
each part's details under "parts". A run of some parts only is written as a quick one. Run folders go under
runs/bench-pipeline/.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

T0 = time.perf_counter()

import envs  # noqa: E402
import grpo  # noqa: E402
from benchmarks._machine import ROOT, fresh_run_dir, write_result  # noqa: E402

SEED, LAT_MIN, LAT_MAX, PARETO_ALPHA, TURNS = 0, 0.05, 2.0, 1.0, (2, 6)
PARTS = ("continuous_vs_lockstep", "async_vs_sync_tool_env", "async_vs_sync_same_schedule_tool_env",
         "async_vs_sync_disaggregated", "colocated_maze")
MODES = {"quick": {"rounds": 3, "tool_steps": 6, "maze_steps": 6},
         "full": {"rounds": 5, "tool_steps": 12, "maze_steps": 12}}
TOOL_TASKS, TOOL_GROUP = 32, 2
MAZE_TASKS, MAZE_GROUP, MAZE_LR = 2, 4, 1e-5


def tool_latency(seed: int, turn: int) -> float:
    u = random.Random(f"{SEED}:{seed}:{turn}").random()
    return min(LAT_MAX, max(LAT_MIN, LAT_MIN * (1.0 - u) ** (-1.0 / PARETO_ALPHA)))


def episode_turns(seed: int) -> int:
    return random.Random(f"{SEED}:{seed}").randint(*TURNS)


class ToolEnv(envs.Env):
    """A tool-calling episode: each step waits a heavy-tailed latency (the GIL is free meanwhile)."""

    keep_images = False

    def reset(self, seed: int):
        self.seed, self.turn, self.turns = seed, 0, episode_turns(seed)
        return envs.Observation(f"Task {seed}: call the tool {self.turns} times, each time with a number.")

    def step(self, action_text: str):
        self.turn += 1
        time.sleep(tool_latency(self.seed, self.turn))
        hit = any(c.isdigit() for c in action_text)
        return envs.StepResult(envs.Observation(f"tool call {self.turn}: {'ok' if hit else 'no number'}"),
                               hit / self.turns, self.turn >= self.turns, {"success": hit})


def log(*parts) -> None:
    print(f"[pipeline {time.perf_counter() - T0:6.0f}s, load {os.getloadavg()[0]:.2f}]", *parts, file=sys.stderr,
          flush=True)


# --------------------------------------------------------------------------------- continuous_vs_lockstep
def continuous_vs_lockstep(work: Path, model: str, mode: dict) -> dict:
    from rollout.engine import EngineConfig
    from rollout.worker import RolloutConfig, RolloutWorker, Task

    worker = RolloutWorker(EngineConfig(model=model, enable_lora=False, max_model_len=512), worker_id="bench")
    tasks = [Task("tool", 5_000_000 + i) for i in range(TOOL_TASKS)]

    def rollout(schedule: str) -> dict:
        trajs, stats = worker.rollout(tasks, TOOL_GROUP, RolloutConfig(max_tokens_per_turn=16, schedule=schedule))
        assert [t.num_turns for t in trajs] == [episode_turns(t.seed) for t in trajs]
        return {"wall_s": stats.wall_s, "engine_s": stats.engine_s, "env_s": stats.env_s,
                "engine_idle_s": stats.engine_idle_s, "in_flight_mean": stats.in_flight_mean,
                "episodes_per_s": stats.episodes / stats.wall_s}

    try:
        worker.rollout(tasks[:2], 1, RolloutConfig(max_tokens_per_turn=16))  # warm-up: vLLM's first calls are slow
        runs = {"continuous": [], "lockstep": []}
        for r in range(mode["rounds"]):
            for schedule in ("continuous", "lockstep") if r % 2 == 0 else ("lockstep", "continuous"):
                runs[schedule].append(rollout(schedule))
                log(f"{schedule}: {runs[schedule][-1]['wall_s']:.2f} s")
    finally:
        worker.shutdown()
    med = {s: {k: round(statistics.median(x[k] for x in rs), 4) for k in rs[0]} for s, rs in runs.items()}
    return {"episodes": TOOL_TASKS * TOOL_GROUP, "tasks": TOOL_TASKS, "group_size": TOOL_GROUP,
            "rounds": mode["rounds"], "median": med,
            "wall_s": {s: [round(x["wall_s"], 3) for x in rs] for s, rs in runs.items()},
            "ratio": round(med["continuous"]["episodes_per_s"] / med["lockstep"]["episodes_per_s"], 3)}


# ------------------------------------------------------------------------------------------ training runs
class ActorProbe(grpo.Callback):
    """Each side's process, read from /proc here (every node runs on this machine): the CPUs its threads may run
    on, its torch threads, and its busy share (CPU seconds over wall seconds) over the steps measured."""

    def __init__(self):
        self.pids, self.threads, self.marks = {}, {}, []

    def on_phase_end(self, trainer, phase, seconds):
        if phase == "actors_start":  # the actors have just started and are idle: one call each
            import ray

            for side, actor in (("rollout", trainer.pool.workers[0]), ("train", trainer.group.workers[0])):
                self.pids[side], self.threads[side] = ray.get(actor.__ray_call__.remote(_pid_threads))

    def on_step_end(self, trainer, record):  # no call to a busy actor: /proc only
        if record["step"] in (1, trainer.config.steps - 1):
            self.marks.append((time.perf_counter(), {side: _proc(pid) for side, pid in self.pids.items()}))

    def report(self) -> dict:
        (t1, first), (t2, last) = self.marks[0], self.marks[-1]
        return {side: {"pid": pid, "cpus_allowed": last[side][1], "torch_threads": self.threads[side],
                       "busy_share": round((last[side][0] - first[side][0]) / max(t2 - t1, 1e-9), 3)}
                for side, pid in self.pids.items()}


def _pid_threads(_actor) -> tuple[int, int]:
    import torch

    return os.getpid(), torch.get_num_threads()


def _proc(pid: int) -> tuple[float, list[str]]:
    """A process's CPU seconds so far, and the CPU lists of its threads (Cpus_allowed_list)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    allowed = {line.split(":")[1].strip() for status in Path(f"/proc/{pid}/task").glob("*/status")
               for line in status.read_text().splitlines() if line.startswith("Cpus_allowed_list")}
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), sorted(allowed)


def train_run(cfg) -> dict:
    """fit() from an empty run folder; figures over steps 2..N-1 from metrics.jsonl (the run's own clock)."""
    fresh_run_dir(cfg.output_dir)
    probe = ActorProbe()
    grpo.Trainer(cfg, callbacks=[probe]).fit()
    lines = (Path(cfg.output_dir) / "metrics.jsonl").read_text().splitlines()
    records = [r for r in map(json.loads, lines) if "event" not in r]
    kept = records[1:-1]
    span = records[-2]["wall_s"] - records[0]["wall_s"]
    med = lambda f: round(statistics.median(f(r) for r in kept), 3)  # noqa: E731
    trained = sum(r["rollout"]["groups_trained"] * cfg.group_size for r in kept)
    out = {"k": cfg.pipeline.max_staleness, "schedule": cfg.rollout.schedule, "steps": len(records),
           "steps_per_s": round(len(kept) / span, 4), "step_s_median": med(lambda r: r["time"]["step_s"]),
           "trained_episodes_per_s": round(trained / span, 3),
           "trained_turns_per_step": med(lambda r: r["pipeline"]["mean_turns_trained"] * cfg.group_size
                                         * r["rollout"]["groups_trained"]),
           "rollout_wall_s_median": med(lambda r: r["rollout"]["wall_s"]),
           "time_s_median": {k: med(lambda r, k=k: r["time"][k]) for k in ("rollout_s", "train_s", "sync_s")},
           "trainer_wait_s_median": med(lambda r: r["pipeline"]["trainer_wait_s"]),
           "staleness": dict(sum((Counter(r["pipeline"]["staleness"]) for r in records), Counter())),
           "logprob_gap_max": max(r["train"]["sampler_abs_diff_max"] for r in records),
           "mean_reward": [round(r["rollout"]["mean_reward"], 3) for r in records],
           "steps_measured": f"2..{len(records) - 1}", "actors": probe.report()}
    return out


def compare(sync: dict, pipelined: dict) -> dict:
    """k=1 against k=0: the ratios, and what a perfect overlap of k=0's parts would give (an estimate)."""
    ratio = lambda key: round(pipelined[key] / sync[key], 3)  # noqa: E731
    t = sync["time_s_median"]
    bound = sync["step_s_median"] / max(pipelined["rollout_wall_s_median"], t["train_s"] + t["sync_s"])
    return {"k0": sync, "k1": pipelined, "ratio": ratio("steps_per_s"),
            "ratio_trained_episodes_per_s": ratio("trained_episodes_per_s"), "ratio_overlap_est": round(bound, 3)}


def pair(label: str, config) -> dict:
    """The synchronous loop (k=0), then rollouts one step ahead (k=1): config(k)."""
    runs = {}
    for k in (0, 1):
        runs[k] = train_run(config(k))
        log(f"{label} k={k}: {runs[k]['step_s_median']} s a step (median), {runs[k]['steps_per_s']} steps/s, "
            f"actors {runs[k]['actors']}")
    return compare(runs[0], runs[1])


def tool_config(work: Path, model: str, name: str, k: int, steps: int, schedule: str, cluster: dict,
                group: int = TOOL_GROUP):
    return grpo.RunConfig(
        model=model, output_dir=str(work / f"{name}-k{k}"), steps=steps, tasks_per_step=TOOL_TASKS, seed=0,
        env={"name": "tool"}, lora={"rank": 16, "alpha": 32.0}, algorithm={"group_size": group, "tis_cap": 2.0},
        train={"lr": 1e-3, "micro_batch_size": 64}, engine={"max_model_len": 512},
        rollout={"temperature": 1.0, "max_tokens_per_turn": 16, "schedule": schedule},
        eval={"seeds": "0"}, checkpoint={"every": 10 ** 6}, cluster=cluster, pipeline={"max_staleness": k},
        metrics={"tensorboard": False, "plots": False, "samples_per_step": 0})


def maze_config(work: Path, name: str, k: int, steps: int, cluster: dict):
    return grpo.RunConfig.from_yaml(ROOT / "examples" / "maze" / "cpu.yaml", overrides=[
        "--model", str(ROOT / "examples" / "maze" / "warmstart"), "--output_dir", str(work / f"{name}-k{k}"),
        "--steps", str(steps), "--tasks_per_step", str(MAZE_TASKS), "--algorithm.group_size", str(MAZE_GROUP),
        "--train.updates_per_batch", "1", "--train.lr", str(MAZE_LR), "--algorithm.drop_zero_signal_groups", "false",
        "--algorithm.old_logprobs", "trainer", "--algorithm.tis_cap", "2.0",
        "--pipeline.max_staleness", str(k), "--eval.seeds", "[0]",
        "--eval.every", "0", "--eval.target_success", "null",
        "--checkpoint.every", str(10 ** 6), "--metrics.tensorboard", "false", "--metrics.plots", "false",
        "--metrics.samples_per_step", "0", "--cluster", json.dumps(cluster)])


LOCAL = {"rollout_workers": 1, "train_ranks": 1, "colocate": False}  # one local Ray node: both sides on both cores


def async_vs_sync_tool_env(work: Path, model: str, mode: dict) -> dict:
    return pair("tool env", lambda k: tool_config(work, model, "tool", k, mode["tool_steps"],
                                                  "continuous" if k else "lockstep", LOCAL))


def async_vs_sync_same_schedule_tool_env(work: Path, model: str, mode: dict) -> dict:
    """async_vs_sync_tool_env with continuous rollouts on both sides: what k=1 adds to the schedule alone."""
    return pair("tool env, continuous at both k", lambda k: tool_config(work, model, "tool-continuous", k,
                                                                        mode["tool_steps"], "continuous", LOCAL))


def same_schedule(p: dict | None) -> float | None:
    """A pair's k=1 over k=0 ratio where both sides ran the same rollout schedule (read from the runs), else None."""
    return p["ratio"] if p and p["k0"]["schedule"] == p["k1"]["schedule"] else None


def async_vs_sync_disaggregated(work: Path, model: str, mode: dict) -> dict:
    """Ray's multi-node test cluster (tests/test_recovery.py): a head with no CPUs, a rollout node started on
    core 0 and a train node on core 1; each raylet and the actors it spawns inherit its affinity."""
    import subprocess
    import tempfile

    import ray
    from ray.cluster_utils import Cluster

    ray_tmp = tempfile.mkdtemp(prefix="grpo-ray-", dir="/tmp")
    old_tmpdir = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = ray_tmp  # Cluster notes its address under $RAY_TMPDIR/ray: ours, not the system's
    Path(ray_tmp, "ray").mkdir()
    everything, cluster, out = os.sched_getaffinity(0), None, {}
    try:
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "temp_dir": ray_tmp,
                                                                "include_dashboard": False})
        for core, resource in ((0, "rollout_node"), (1, "train_node")):
            os.sched_setaffinity(0, {core})
            try:
                cluster.add_node(num_cpus=1, resources={resource: 1}, temp_dir=ray_tmp)
            finally:
                os.sched_setaffinity(0, everything)
        nodes = {"address": cluster.address, "rollout_workers": 1, "train_ranks": 1, "colocate": False,
                 "rollout_resources": {"rollout_node": 1}, "train_resources": {"train_node": 1}}
        out["maze"] = pair("maze, 2 nodes", lambda k: maze_config(work, "maze-2nodes", k, mode["maze_steps"], nodes))
        # Continuous on both sides and G=4: a rollout and an update of about 5 s each on one core.
        out["tool"] = pair("tool env, 2 nodes", lambda k: tool_config(
            work, model, "tool-2nodes", k, mode["tool_steps"], "continuous", nodes, group=4))
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        subprocess.run(["rm", "-rf", ray_tmp])
        os.environ.pop("RAY_TMPDIR")
        if old_tmpdir is not None:
            os.environ["RAY_TMPDIR"] = old_tmpdir
    out["pinned"] = all(run["actors"][side]["cpus_allowed"] == [str(core)] for w in ("maze", "tool")
                        for run in (out[w]["k0"], out[w]["k1"]) for side, core in (("rollout", 0), ("train", 1)))
    return out


def colocated_maze(work: Path, model: str, mode: dict) -> dict:
    return pair("maze, shared cores", lambda k: maze_config(work, "maze-shared", k, mode["maze_steps"], LOCAL))


def headline(parts: dict) -> list[dict]:
    rows, p = [], parts.get("continuous_vs_lockstep")
    if p:
        rows.append({"figure": f"rollout episodes/s, continuous against lockstep scheduling ({p['episodes']} "
                               "tool-env episodes of 2-6 turns, env latency Pareto 0.05-2 s)",
                     "value": p["median"]["continuous"]["episodes_per_s"], "unit": "episodes/s",
                     "baseline": p["median"]["lockstep"]["episodes_per_s"], "baseline_name": "lockstep",
                     "ratio": p["ratio"]})
    split = parts.get("async_vs_sync_disaggregated", {})
    for p, what in ((parts.get("async_vs_sync_same_schedule_tool_env"), "tool env, 2 shared cores"),
                    (split.get("maze"), "maze step, rollout and training on 2 Ray nodes of 1 core each"),
                    (split.get("tool"), "tool env, rollout and training on 2 Ray nodes of 1 core each")):
        if p:
            rows.append({"figure": f"GRPO steps/s, rollouts 1 step ahead of the trainer against the synchronous "
                                   f"loop, both {p['k0']['schedule']} ({what})", "value": p["k1"]["steps_per_s"],
                         "unit": "steps/s", "baseline": p["k0"]["steps_per_s"], "baseline_name": "max_staleness 0",
                         "ratio": p["ratio"]})
    p = parts.get("async_vs_sync_tool_env")
    if p:  # two changes at once: the schedule and the pipeline; the rows above take them one at a time
        rows.append({"figure": "GRPO steps/s, k=1 with continuous rollouts against k=0 with lockstep (tool env, 2 "
                               "shared cores): schedule and pipeline together", "value": p["k1"]["steps_per_s"],
                     "unit": "steps/s", "baseline": p["k0"]["steps_per_s"],
                     "baseline_name": "max_staleness 0, lockstep", "ratio": p["ratio"]})
    return rows


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--work", default=str(ROOT / "runs" / "bench-pipeline"))
    ap.add_argument("--no-write", action="store_true", help="print only; leave benchmarks/results alone")
    a = ap.parse_args(argv)
    names = [p for p in a.parts.split(",") if p]
    quick = a.quick or set(names) != set(PARTS)  # a run of some parts only is not the full protocol
    if not set(names) <= set(PARTS):
        ap.error(f"unknown parts {sorted(set(names) - set(PARTS))}: choose from {', '.join(PARTS)}")
    from rollout import runtime

    work = Path(a.work).resolve()
    runtime.configure(work / "run", runtime.shared_cache_dir(work / "run"))
    from grpo.tools import tiny_models

    envs.register("tool", ToolEnv, overwrite=True)
    model = str(tiny_models.build("text", work / "models" / "tiny-text", seed=0))
    mode = MODES["quick" if a.quick else "full"]
    loads = [round(os.getloadavg()[0], 2)]
    log(f"parts {names}, mode {mode}")
    result = {"benchmark": "pipeline", "quick": quick, "mode": mode, "parts": {},
              "tool_env": f"step latency Pareto(x_min={LAT_MIN}, alpha={PARETO_ALPHA}) clipped to [{LAT_MIN}, "
                          f"{LAT_MAX}] s, keyed on (seed, task seed, turn); {TURNS[0]}-{TURNS[1]} turns"}
    for name in names:
        log(f"{name} ...")
        result["parts"][name] = globals()[name](work, model, mode)
        loads.append(round(os.getloadavg()[0], 2))
    runs = [r for p in result["parts"].values() for c in (p, *p.values()) if isinstance(c, dict)
            for r in (c.get("k0"), c.get("k1")) if r]
    result["logprob_gap_max"] = max((r["logprob_gap_max"] for r in runs if r["k"] == 0), default=None)
    result["logprob_gap_max_async"] = max((r["logprob_gap_max"] for r in runs if r["k"] > 0), default=None)
    # The ratios at the top level (None for a part not run). The disaggregated one is the maze's, whose update
    # outweighs its rollout and caps what overlap can give; the tool env's stands beside it.
    parts, split = result["parts"], result["parts"].get("async_vs_sync_disaggregated", {})
    result.update({name: parts.get(name, {}).get("ratio") for name in ("continuous_vs_lockstep",
                                                                      "async_vs_sync_tool_env", "colocated_maze")})
    result["async_vs_sync_disaggregated"] = split.get("maze", {}).get("ratio")
    result["async_vs_sync_disaggregated_tool_env"] = split.get("tool", {}).get("ratio")
    # k=1 against k=0 with nothing else changed: the pipeline's own gain, apart from the schedule's.
    result["async_vs_sync_same_schedule_tool_env"] = same_schedule(parts.get("async_vs_sync_same_schedule_tool_env"))
    result["async_vs_sync_same_schedule_disaggregated"] = same_schedule(split.get("maze"))
    result["async_vs_sync_same_schedule_disaggregated_tool_env"] = same_schedule(split.get("tool"))
    # The schedule's own gain in training, at k=0: the synchronous loop, continuous over lockstep.
    lockstep, continuous = (parts.get(n, {}).get("k0") for n in ("async_vs_sync_tool_env",
                                                                "async_vs_sync_same_schedule_tool_env"))
    result["continuous_vs_lockstep_sync_tool_env"] = (
        round(continuous["steps_per_s"] / lockstep["steps_per_s"], 3) if lockstep and continuous else None)
    result["headline"] = headline(result["parts"])
    result["load_average_during"] = loads
    result["wall_s"] = round(time.perf_counter() - T0, 1)
    if not a.no_write:
        write_result("pipeline", result)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
