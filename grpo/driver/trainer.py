"""grpo.Trainer: the GRPO loop over colocated rollout engines and FSDP LoRA trainer ranks.

    trainer = grpo.Trainer(grpo.RunConfig(model="path/to/model", env="maze", steps=50))
    summary = trainer.fit()

One step: sample tasks -> rollouts with adapter v -> group advantages -> train step -> publish v+1 ->
hot-load v+1 -> metrics -> checkpoint -> periodic eval. Kill it anywhere: the next fit() on the same
output_dir resumes from the last complete checkpoint, and the last published adapter stays readable.

A rollout worker or train rank that dies or stops answering mid-run (grpo.driver.fault) does not end the run:
the step is torn down, fresh actors restore the last checkpoint and the run goes on, up to
`fault.max_restarts` times. One run per output_dir (grpo.driver.run_lock).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from grpo.learner import checkpoint

from grpo.report import summary as run_summary
from grpo.algo.advantages import group_advantages, step_advantages
from grpo.report.curves import plot_curves
from grpo.driver.eval import eval_summary
from grpo.report.table import step_warnings, summary_rows, table
from grpo.report.samples import SampleWriter, pick, reward_components
from grpo.algo.config import ConfigError
from grpo.driver.fault import ActorFault, InjectionPlan
from grpo.report.metrics import MetricsSink, drop_steps_after, json_safe
from grpo.config import RunConfig
from grpo.driver.run_lock import RunLock
from rollout import runtime
from rollout.worker import Task


class TaskSampler:
    """Training tasks: seeds counted up from `offset`, so every maze is new and a cursor resumes exactly."""

    def __init__(self, env: str, options: dict, offset: int, cursor: int = 0):
        self.env, self.options, self.offset, self.cursor = env, dict(options), offset, cursor

    def take(self, n: int) -> list[Task]:
        tasks = [Task(self.env, self.offset + self.cursor + i, self.options) for i in range(n)]
        self.cursor += n
        return tasks


class RunFailedError(RuntimeError):
    """The run used up fault.max_restarts; the message names the last cause."""


class Trainer:
    def __init__(self, config: RunConfig):
        if not isinstance(config, RunConfig):
            raise TypeError(f"Trainer takes a grpo.RunConfig, got {type(config).__name__}")
        self.config = config
        self.run_dir = Path(config.output_dir).resolve()
        self._check_before_starting()
        self.pool = self.group = self.sink = None
        self.samples = SampleWriter(self.run_dir / "samples.jsonl", config.model)
        self.eval_samples = SampleWriter(self.run_dir / "eval_samples.jsonl", config.model)
        self._ray_tmp = None
        self._ray_joined = False

    def _check_before_starting(self) -> None:
        """Everything that can be checked without Ray: a mistake here costs seconds, not a cluster start."""
        import envs
        from grpo.learner.forward import check_model_dir

        check_model_dir(self.config.model)
        if self.config.adapter is not None and not (Path(self.config.adapter) / "adapter_config.json").is_file():
            raise FileNotFoundError(f"adapter={self.config.adapter!r} has no adapter_config.json: give the "
                                    "folder a LoRA adapter was saved to (save_pretrained), or leave it unset")
        # One training seed built and reset as a rollout would: a broken env fails here, not in an actor.
        envs.check_env(self.config.env.name, self.config.env.options, self.config.train_seed_offset)
        for f in self.config.fault.faults:
            count = self.config.cluster.rollout_workers if f.target == "rollout" else self.config.cluster.train_ranks
            if f.index >= count or f.step > self.config.steps:
                raise ConfigError("RunConfig", "fault.inject", f.spec,
                                  f"a fault that can fire: index below {count} ({f.target}s in the cluster section) "
                                  f"and step at most steps ({self.config.steps})")

    # -------------------------------------------------------------------------------------------- loop
    def fit(self) -> dict:
        # Refused at once, before anything starts, when another live run holds the folder.
        lock = RunLock(self.run_dir).acquire()
        _sigterm_received.clear()
        restore = _exit_on_sigterm()
        plan = InjectionPlan(self.config.fault.faults)
        self.restarts, self._step, self._recovery, self._eval_before, self._started = 0, 0, None, None, None
        try:
            self._start()
            while True:
                try:
                    return self._run(plan)
                except ActorFault as fault:
                    self._recover(fault)
        except (SystemExit, KeyboardInterrupt) as e:
            if _sigterm_received.is_set() or (isinstance(e, SystemExit) and e.code == 128 + signal.SIGTERM):
                print(self._stop_line("stopped by SIGTERM"), file=sys.stderr, flush=True)
                raise SystemExit(128 + signal.SIGTERM) from None
            if isinstance(e, KeyboardInterrupt):
                print(self._stop_line("interrupted (Ctrl-C)"), file=sys.stderr, flush=True)
            raise
        finally:
            if self._recovery is not None and self.sink is not None:
                self._log_restart(completed=False)  # stopped before a step completed after the restart
            self.close()
            lock.release()
            restore()

    def _run(self, plan: InjectionPlan) -> dict:
        """Start the actors, restore the last checkpoint and train to the end; an ActorFault ends an attempt."""
        cfg = self.config
        self._start_actors()
        state = self._resume_or_begin(plan)
        sampler = TaskSampler(cfg.env.name, cfg.env.options, cfg.train_seed_offset, state["cursor"])
        rollout_cfg = cfg.rollout.rollout_config()
        progress = _progress(state["step"], cfg.steps, cfg.group_size, cfg.rollout.max_model_len)
        try:
            for step in range(state["step"], cfg.steps):
                self._step = step + 1
                t0 = time.perf_counter()
                trajs, rstats = self.pool.rollout(sampler.take(cfg.tasks_per_step), cfg.group_size, rollout_cfg,
                                                  faults=plan.take(step + 1, "rollout"))
                self._check_versions(trajs, state["version"])
                adv, kept, credit = self._advantages(trajs)
                t1 = time.perf_counter()
                self.pool.sleep()
                tstats = self.group.train_step([trajs[i] for i in kept], [adv[i] for i in kept],
                                               faults=plan.take(step + 1, "train_rank"))
                t2 = time.perf_counter()
                state["version"] = self.group.publish(self.store_root)
                self.pool.wake_up()
                self.pool.sync_adapter(state["version"])
                t3 = time.perf_counter()
                state["step"], state["cursor"] = step + 1, sampler.cursor
                record = {"step": step + 1, "rollout_adapter_version": rstats_version(trajs),
                          "adapter_version": state["version"],
                          "rollout": rstats.as_dict(), "train": tstats, **credit,
                          "time": {"rollout_s": t1 - t0, "train_s": t2 - t1, "sync_s": t3 - t2, "step_s": t3 - t0}}
                if cfg.eval.every and (step + 1) % cfg.eval.every == 0:
                    record["eval"] = state["evals"][str(step + 1)] = self.evaluate(label=f"step {step + 1}")
                self._record_episodes(step + 1, trajs, record)
                self.sink.log(record)
                if self._recovery is not None:
                    self._log_restart()
                progress(record)
                reached = _reached(record, cfg.eval.target_success)
                if checkpoint.should_save(step + 1, cfg.checkpoint.every, cfg.steps) or reached:
                    self._save(dict(state, faults_fired=sorted(plan.fired)), sampler)
                if reached:
                    break
        finally:
            progress.close()
        if self._recovery is not None:  # recovered after the last step (a fault in the final eval)
            self._log_restart()
        return self._finish(state)

    def evaluate(self, seeds=None, label: str = "eval") -> dict:
        """Greedy episodes on the fixed evaluation seeds with the adapter the workers serve now; every episode
        goes to eval_samples.jsonl under `label`."""
        seeds = list(seeds) if seeds is not None else self.config.eval_seeds
        cfg = self.config
        tasks = [Task(cfg.env.name, s, cfg.env.options) for s in seeds]
        trajs, stats = self.pool.rollout(tasks, 1, cfg.rollout.rollout_config(), greedy=True)
        self.eval_samples.write(trajs, label=label)
        return {**eval_summary(trajs, stats),
                "solved_seeds": [t.seed for t in trajs if t.success], "outcomes": run_summary.episode_outcomes(trajs)}

    # ------------------------------------------------------------------------------------------ pieces
    def _advantages(self, trajs) -> tuple[list, list[int], dict]:
        """Per episode: its group-relative advantage, or with step_weight > 0 one value per turn, the
        episode's advantage plus step_weight x the turn's step-level advantage."""
        algo, g = self.config.algorithm, self.config.group_size
        rewards = torch.tensor([t.reward for t in trajs], dtype=torch.float32).view(-1, g)
        out = group_advantages(rewards, algo)
        episode = out.advantages.flatten().tolist()
        keep = out.keep.repeat_interleave(g).tolist()
        credit = {"zero_signal_groups": int(out.zero_signal.sum())}
        if algo.step_weight == 0:
            return episode, [i for i in range(len(trajs)) if keep[i]], credit
        steps = step_advantages([t.turn_rewards for t in trajs], [t.turn_states for t in trajs],
                                [t.group_id for t in trajs], algo)
        adv = [[a + algo.step_weight * s for s in per_turn] for a, per_turn in zip(episode, steps.advantages)]
        # A group with equal rewards can still rank the moves made from a shared state.
        stepped = [any(any(steps.advantages[i]) for i in range(k * g, (k + 1) * g)) for k in range(len(trajs) // g)]
        kept = [i for i in range(len(trajs)) if keep[i] or stepped[i // g]]
        credit.update(step_anchored_share=steps.anchored_share,
                      step_adv_abs_mean=_mean_abs([s for per_turn in steps.advantages for s in per_turn]))
        return adv, kept, credit

    def _record_episodes(self, step: int, trajs, record: dict) -> None:
        """The mean of each reward function the env reports (`reward/<name>`), and a few decoded episodes."""
        rewards = reward_components(trajs)
        if rewards:
            record["reward"] = rewards
        self.samples.write(pick(trajs, self.config.metrics.samples_per_step), step=step)

    def _check_versions(self, trajs, expected: int) -> None:
        # The alarm for the worst silent failure: rollouts quietly sampling a stale adapter.
        used = {t.adapter_version for t in trajs}
        if used != {expected}:
            raise RuntimeError(f"rollouts used adapter versions {sorted(used, key=str)}, expected {expected}: "
                               "the hot-load after the last publish did not take effect")

    def _resume_or_begin(self, plan: InjectionPlan) -> dict:
        resumed = self.group.load_checkpoint(self.checkpoint_root)
        if resumed is not None:
            state = resumed["state"]
            print(f"[grpo] resumed from {resumed['path']} at step {state['step']}", file=sys.stderr)
        else:
            state = {"step": 0, "cursor": 0, "evals": {}, "wall_s": 0.0}
        self._step = state["step"] + 1
        # A fault that fired before the checkpoint (in an earlier process) does not fire again on resume.
        plan.fired.update(state.pop("faults_fired", ()))
        # The steps after the checkpoint run again: their earlier lines go, one line a step stays.
        drop_steps_after(self.run_dir / "metrics.jsonl", state["step"])
        drop_steps_after(self.run_dir / "samples.jsonl", state["step"])
        # Always a new version: the store may hold versions published after the checkpoint.
        state["version"] = self.group.publish(self.store_root)
        self.pool.sync_adapter(state["version"])
        if "eval_before" not in state and self._eval_before is not None:
            state["eval_before"] = self._eval_before  # measured before a restart that found no checkpoint
        if "eval_before" not in state:
            state["eval_before"] = self.evaluate(label="before")
            print(f"[grpo] eval before training: {state['eval_before']['success_rate']:.1%}", file=sys.stderr)
        self._eval_before = state["eval_before"]
        # After a restart in this process the wall clock keeps running from this process's start.
        state["started"] = self._started = self._started or time.time() - state["wall_s"]
        if self._recovery is not None:
            self._recovery["resumed_step"] = state["step"]
        return state

    def _recover(self, fault: ActorFault) -> None:
        """Tear the failed attempt down; the next _run starts fresh actors from the last checkpoint."""
        t0 = time.monotonic()
        if self._recovery is not None:  # failed again before a step completed after the previous fault
            self._log_restart(completed=False)
        self.restarts += 1
        limit = self.config.fault.max_restarts
        if self.restarts > limit:
            raise RunFailedError(f"{fault.actor} failed in step {self._step}: {fault.cause.rstrip('.')}. The run has used all "
                                 f"{limit} restarts (fault.max_restarts); {self._checkpoint_phrase()}; run the same "
                                 "command to resume") from fault
        print(f"[grpo] {fault.actor} failed in step {self._step}: {fault.cause.rstrip('.')}; restart {self.restarts} of {limit}: "
              "new actors from the last checkpoint", file=sys.stderr, flush=True)
        self._close_actors()
        self._recovery = {"event": "restart", "step": self._step, "cause": fault.cause, "actor": fault.actor,
                          "detect_s": round(fault.waited_s, 2), "resumed_step": None, "t0": t0}

    def _log_restart(self, completed: bool = True) -> None:
        """One metrics line a restart, written once the next step completed: recovery_s runs from the fault's
        detection to then (new actors, checkpoint restored, fresh adapter served, the step done); detect_s is
        how long the failed call had run when the fault showed (for a hang, fault.call_timeout_s). A run that
        failed again or stopped before completing a step logs recovery_s null."""
        record = dict(self._recovery)
        t0 = record.pop("t0")
        record["recovery_s"] = round(time.monotonic() - t0, 2) if completed else None
        self.sink.log(record)
        self._recovery = None

    def _checkpoint_phrase(self) -> str:
        try:
            info = checkpoint.latest(self.checkpoint_root)
        except (OSError, ValueError, KeyError) as e:
            return f"the last checkpoint is unreadable ({e})"
        return f"last checkpoint: step {info.step} at {info.path}" if info else "no checkpoint yet"

    def _stop_line(self, why: str) -> str:
        where = f"in step {self._step}" if self._step else "while starting"
        return f"[grpo] {why} {where}; {self._checkpoint_phrase()}; run the same command to resume"

    def _save(self, state: dict, sampler: TaskSampler) -> None:
        state = dict(state, cursor=sampler.cursor, wall_s=time.time() - state["started"])
        self.group.save_checkpoint(self.checkpoint_root, data_cursor=sampler.cursor, state=state,
                                   keep_last=self.config.checkpoint.keep)

    def _finish(self, state: dict) -> dict:
        cfg = self.config
        after = self.evaluate(label="after")
        unseen = self.evaluate(cfg.unseen_seeds, label="unseen") if cfg.unseen_seeds else None
        curve = None
        if cfg.metrics.plots:
            curve = plot_curves(self.run_dir / "metrics.jsonl", self.run_dir / "curves.png",
                                start={"eval/success_rate": state["eval_before"]["success_rate"]},
                                end={"eval/success_rate": after["success_rate"]})
        summary = {
            "eval_before": state["eval_before"]["success_rate"], "eval_after": after["success_rate"],
            "unseen_after": unseen["success_rate"] if unseen else None, "steps": state["step"],
            "grpo_wall_s": round(time.time() - state["started"], 1), "adapter_version": state["version"],
            "adapter_path": str(Path(self.store_root) / "adapters" / f"v{state['version']:06d}"),
            "evals": state["evals"], "eval_after_detail": after, "unseen_after_detail": unseen,
            "curves_png": str(curve) if curve else None, "model": cfg.model,
            # Restarts logged in metrics.jsonl: this process's and those of earlier processes of the run.
            "restarts": self.sink.event_counts.get("restart", 0),
            **run_summary.mechanism(self.run_dir / "metrics.jsonl", cfg.tasks_per_step, state["eval_before"], after),
        }
        (self.run_dir / "summary.json").write_text(json.dumps(json_safe(summary), indent=1, allow_nan=False) + "\n")
        print(table(summary_rows(summary, self.run_dir)), flush=True)
        return summary

    # ------------------------------------------------------------------------------ start and teardown
    @property
    def store_root(self) -> str:
        return str(self.run_dir / "store")

    @property
    def checkpoint_root(self) -> str:
        return str(self.run_dir / "checkpoints")

    def _start(self) -> None:
        """Ray and the metrics sink: once per fit(), kept across restarts."""
        import ray

        cfg = self.config
        self.run_dir.mkdir(parents=True, exist_ok=True)
        runtime.configure(self.run_dir, runtime.shared_cache_dir(self.run_dir))
        (self.run_dir / "config.yaml").write_text(cfg.to_yaml())
        if not ray.is_initialized():
            try:
                if cfg.cluster.address:
                    self._ray_joined = True
                    ray.init(address=cfg.cluster.address, log_to_driver=False)
                else:
                    # Unix socket paths are limited to 107 bytes: Ray's session folder lives under /tmp.
                    self._ray_tmp = tempfile.mkdtemp(prefix="grpo-ray-", dir="/tmp")
                    cpus = max(os.cpu_count() or 1, cfg.cluster.train_ranks + cfg.cluster.rollout_workers)
                    ray.init(num_cpus=cpus, _temp_dir=self._ray_tmp, include_dashboard=False, log_to_driver=False)
            except SystemExit:
                # While ray.init runs, its own SIGTERM handlers are in place and exit silently with status 15
                # or 1 (measured); the only SystemExit out of ray.init, so it is a SIGTERM: the documented 143.
                raise SystemExit(128 + signal.SIGTERM) from None
            # ray.init leaves its handler in place, which exits 1 without unwinding: ours again
            # (fit() puts back what was there before it).
            _exit_on_sigterm()
        self.sink = MetricsSink(self.run_dir, cfg.metrics.tensorboard, cfg.metrics.prometheus_port,
                                wandb=cfg.metrics.wandb, run_config=cfg.to_dict())

    def _start_actors(self) -> None:
        """Rollout workers and train ranks, fresh: at the start and after every fault."""
        import ray

        from grpo.driver.rollout_pool import RolloutPool
        from grpo.driver.train_group import TrainGroup

        cfg, c, f = self.config, self.config.cluster, self.config.fault
        gpus = ray.cluster_resources().get("GPU", 0) > 0
        share = 0.5 if (gpus and c.colocate) else (1.0 if gpus else 0.0)
        engine = cfg.engine_config()
        self.pool = RolloutPool(engine, self.store_root, str(self.run_dir), c.rollout_workers, share,
                                resources=c.rollout_resources, call_timeout_s=f.call_timeout_s,
                                env_names=[cfg.env.name])
        self.group = TrainGroup(cfg.model, c.train_ranks, lora=cfg.lora, algorithm=cfg.algorithm,
                                train=cfg.train, adapter_path=cfg.adapter, gpus_per_rank=share,
                                resources=c.train_resources, start_timeout_s=f.start_timeout_s,
                                call_timeout_s=f.call_timeout_s)
        self.pool.ready(f.start_timeout_s)

    def _close_actors(self) -> None:
        for part in (self.pool, self.group):
            if part is not None:
                part.shutdown()
        self.pool = self.group = None

    def close(self) -> None:
        import ray

        self._close_actors()
        if self.sink is not None:
            self.sink.close()
            self.sink = None
        if self._ray_tmp is not None or self._ray_joined:
            ray.shutdown()  # joined a cluster: disconnect only; started one here: stop it
            self._ray_joined = False
        if self._ray_tmp is not None:
            shutil.rmtree(self._ray_tmp, ignore_errors=True)
            self._ray_tmp = None


# Set by our SIGTERM handler. A SIGTERM that lands while the driver waits in ray.get or ray.wait reaches
# fit() as SystemExit(1): Ray's wait turns the handler's SystemExit(143) into that (measured, Ray 2.60), so
# fit() asks this, not the exit code, whether a SIGTERM stopped it.
_sigterm_received = threading.Event()


def _exit_on_sigterm():
    """Let SIGTERM (a scheduler's kill, `timeout`) unwind like Ctrl-C, so that Ray and its /tmp folder are shut
    down; Python's default for SIGTERM exits without running `finally`. Returns the undo."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum, frame):
        _sigterm_received.set()
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    # A handler installed from C (None here) cannot be put back from Python: the default then.
    return lambda: signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _mean_abs(values: list[float]) -> float:
    return sum(abs(v) for v in values) / len(values) if values else 0.0


def rstats_version(trajs) -> int:
    return trajs[0].adapter_version if trajs else -1


def _reached(record: dict, target) -> bool:
    return target is not None and "eval" in record and record["eval"]["success_rate"] >= target


def _progress(start: int, total: int, group_size: int, max_model_len: int):
    from tqdm import tqdm

    bar = tqdm(total=total, initial=start, desc="grpo", unit="step", file=sys.stderr, dynamic_ncols=True)

    def update(record: dict) -> None:
        r, t = record["rollout"], record["train"]
        shown = {"reward": f"{r['mean_reward']:.2f}", "success": f"{r['success_rate']:.0%}",
                 "turns": f"{r['mean_turns']:.1f}", "mismatch": f"{t.get('sampler_abs_diff', 0):.1e}",
                 "step_s": f"{record['time']['step_s']:.1f}"}
        if "eval" in record:
            shown["eval"] = f"{record['eval']['success_rate']:.0%}"
        bar.set_postfix(shown, refresh=False)
        bar.update(1)
        for warning in step_warnings(record, group_size, max_model_len):
            bar.write(f"[grpo] warning: {warning}", file=sys.stderr)
        if record["step"] >= total:
            bar.close()

    update.close = bar.close
    return update
