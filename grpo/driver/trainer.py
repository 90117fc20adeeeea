"""grpo.Trainer: the GRPO loop over colocated rollout engines and FSDP LoRA trainer ranks.

    trainer = grpo.Trainer(grpo.RunConfig(model="path/to/model", env="maze", steps=50))
    summary = trainer.fit()

One step: sample tasks -> rollouts with adapter v -> group advantages -> train step -> publish v+1 ->
hot-load v+1 -> metrics -> checkpoint -> periodic eval. Kill it anywhere: the next fit() on the same
output_dir resumes from the last complete checkpoint, and the last published adapter stays readable.

A rollout worker or train rank that dies or stops answering mid-run (grpo.driver.fault) does not end the run:
the step is torn down, fresh actors restore the last checkpoint and the run goes on, up to
`fault.max_restarts` times. One run per output_dir (grpo.driver.run_lock); Ray and SIGTERM:
grpo.driver.session; hooks for users' code: grpo.driver.callbacks.
"""
from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

from grpo.algo.advantages import batch_advantages, next_draw
from grpo.config import RunConfig
from grpo.driver import selection, session, storage
from grpo.driver.callbacks import CallbackList
from grpo.driver.eval import eval_summary, met_target
from grpo.driver.fault import RECORD as fault_record
from grpo.driver.fault import ActorFault, InjectionPlan, flip_byte
from grpo.driver.pipeline import Pipeline, check_versions, pipeline_record
from grpo.driver.preflight import check_run
from grpo.driver.progress import progress
from grpo.driver.rollout_pool import RolloutPool, fetch
from grpo.driver.run_lock import RunLock
from grpo.driver.state import RunState, TaskSampler, log_changes
from grpo.driver.train_group import StoredEpisodes, TrainGroup
from grpo.learner import checkpoint
from grpo.report import summary as run_summary
from grpo.report.curves import plot_curves
from grpo.report.metrics import MetricsSink, drop_steps_after, json_safe
from grpo.report.samples import SampleWriter, pick, reward_components
from grpo.report.table import summary_rows, table
from rollout.models import resolve_model
from rollout.trajectory import merge_stats
from rollout.worker import Task
from sync.atomic import atomic_write


class RunFailedError(RuntimeError):
    """The run used up fault.max_restarts; the message names the last cause."""


class Trainer:
    def __init__(self, config: RunConfig, callbacks=()):
        if not isinstance(config, RunConfig):
            raise TypeError(f"Trainer takes a grpo.RunConfig, got {type(config).__name__}")
        self.config = config
        self.run_dir = Path(config.output_dir).resolve()
        # The folder every actor loads (a Hub id's snapshot, found once here); config.yaml keeps the id.
        self.model_path = str(resolve_model(config.model))
        check_run(dataclasses.replace(config, model=self.model_path))
        self.callbacks = CallbackList(callbacks)
        self.state = RunState()
        self.pool = self.group = self.sink = self.pipeline = None
        self.samples = SampleWriter(self.run_dir / "samples.jsonl", self.model_path)
        self.eval_samples = SampleWriter(self.run_dir / "eval_samples.jsonl", self.model_path)
        self.restarts = 0
        self._step = 0  # the step running now (1-based); 0 while starting
        self._recovery: dict | None = None  # the last fault's restart event, logged once a step completed
        self._ray = session.RaySession()

    # -------------------------------------------------------------------------------------------- loop
    def fit(self) -> dict:
        # Refused at once, before anything starts, when another live run holds the folder.
        lock = RunLock(self.run_dir).acquire()
        restore = session.catch_sigterm()
        plan = InjectionPlan(self.config.fault.faults, record=self.run_dir / fault_record)
        self.state, self.restarts, self._step, self._recovery = RunState(), 0, 0, None
        self.callbacks.stop = None
        try:
            self.callbacks.call("on_train_begin", self)
            with self.callbacks.phase(self, "start"):
                self._start()
            while True:
                try:
                    summary = self._run(plan)
                    self.callbacks.call("on_train_end", self, summary)
                    return summary
                except ActorFault as fault:
                    self._recover(fault)
        except Exception as e:
            status = storage.report(e, self._where(), lambda: session.kept_phrase(self.run_dir))
            if status is None:
                raise
            raise SystemExit(status) from None
        except (SystemExit, KeyboardInterrupt) as e:
            if session.stopped_by_sigterm(e):
                print(self._stop_line("stopped by SIGTERM"), file=sys.stderr, flush=True)
                raise SystemExit(session.SIGTERM_EXIT) from None
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
        cfg, state = self.config, self._resume_or_begin()
        sampler = TaskSampler(cfg.env.name, cfg.env.options, cfg.train_seed_offset, state.cursor, cfg.held_out_seeds)
        first = state.step + 1
        stopped = f"ran all {cfg.steps} steps"  # summary.json's `stopped`, unless a target or a callback ends it
        reached_at = f"eval.target_success={cfg.eval.target_success} reached at step {{}}"
        if met_target(state.evals.get(str(state.step)), cfg.eval.target_success):
            # A run that stopped at its target is done: run again, it reports, it does not train on.
            print(f"[grpo] this run reached eval.target_success={cfg.eval.target_success:g} at step {state.step}: "
                  "nothing left to train (a higher target trains on; a new output_dir starts over)", file=sys.stderr)
            first, stopped = cfg.steps + 1, reached_at.format(state.step)
        if self.callbacks.stop:  # returned while starting (on_train_begin, the evals before training)
            first, stopped = cfg.steps + 1, self.callbacks.stop
        bar = progress(state.step, cfg.steps, cfg.group_size, cfg.engine.max_model_len)
        try:
            for step in range(first, cfg.steps + 1):
                self._step = step
                record, batch = self._train_step(step, sampler, plan)
                if cfg.eval.every and step % cfg.eval.every == 0:
                    record["eval"] = state.evals[str(step)] = self.evaluate(label=f"step {step}")
                    selection.note(cfg.eval.select, state, self.store_root, step, record["eval"])
                record["wall_s"] = time.time() - state.started  # the run's clock, over all its processes
                self._record_episodes(step, *batch, record)
                del batch  # the step's episodes leave the object store
                self.callbacks.call("on_step_end", self, record)
                self.sink.log(record)
                if self._recovery is not None:
                    self._log_restart()
                bar(record)
                reached = met_target(record.get("eval"), cfg.eval.target_success)
                # A callback's Stop ends the run after this step, as a reached target does: with a checkpoint.
                if checkpoint.should_save(step, cfg.checkpoint.every, cfg.steps) or reached or self.callbacks.stop:
                    with self.callbacks.phase(self, "checkpoint"):
                        self._save()
                    for _ in plan.take(step, "checkpoint"):
                        flip_byte(Path(checkpoint.latest(self.checkpoint_root).path) / "__0_0.distcp")
                if reached or self.callbacks.stop:
                    stopped = self.callbacks.stop or reached_at.format(step)
                    break
        finally:
            bar.close()
        if self._recovery is not None:  # recovered after the last step (a fault in the final eval)
            self._log_restart()
        if self.callbacks.stop:
            print(f"[grpo] stopped after step {state.step} by {self.callbacks.stop}", file=sys.stderr)
        return self._finish(stopped)

    def _train_step(self, step: int, sampler: TaskSampler, plan: InjectionPlan) -> tuple[dict, tuple]:
        """Rollouts, advantages, the update and the new adapter served: the step's record and its episodes
        (without their segments, and one ObjectRef a group: they stay in the object store, see _sample)."""
        state, phase = self.state, self.callbacks.phase
        t0 = time.perf_counter()
        trajs, groups, rstats, adv, kept, credit = self._sample(step, sampler, plan)
        for fault in plan.take(step, "driver"):
            fault.fire()  # SIGKILL of this process, as the out-of-memory killer would
        t1 = time.perf_counter()
        if not self.pipeline.k:  # with rollouts in flight the engine keeps sampling (cluster.colocate: false)
            with phase(self, "sleep"):
                self.pool.sleep()
        with phase(self, "train"):
            tstats = self.group.train_step(StoredEpisodes.of(groups, kept, self.config.group_size),
                                           [adv[i] for i in kept], faults=plan.take(step, "train_rank"))
        t2 = time.perf_counter()
        with phase(self, "publish"):
            state.version = self.group.publish(self.store_root)
        for _ in plan.take(step, "adapter"):
            flip_byte(Path(self.store_root) / "adapters" / f"v{state.version:06d}" / "adapter_model.safetensors")
        if not self.pipeline.k:
            with phase(self, "wake_up"):
                self.pool.wake_up()
        t_load = time.perf_counter()
        with phase(self, "hotload"):
            self._serve_new_adapter()
        self.pipeline.published(state.version, step)
        t3 = time.perf_counter()
        # The hot-load queues behind the rollouts in flight on the workers: the trainer waits for them there.
        credit["pipeline"]["trainer_wait_s"] += t3 - t_load
        state.step, state.cursor = step, self.pipeline.cursor(sampler)
        record = {"step": step, "rollout_adapter_version": rstats_version(trajs), "adapter_version": state.version,
                  "rollout": rstats, "train": tstats, **credit,
                  "time": {"rollout_s": t1 - t0, "train_s": t2 - t1, "sync_s": t3 - t2, "step_s": t3 - t0}}
        return record, (trajs, groups)

    def _sample(self, step: int, sampler: TaskSampler, plan: InjectionPlan) -> tuple:
        """The step's episodes and their advantages: one draw of `tasks_per_step` tasks, or with dynamic sampling
        more draws until that many groups carry signal (at most max_draw_factor x tasks_per_step tasks); the
        step trains on the first `tasks_per_step` groups with signal in draw order. Returns every episode
        drawn, their merged stats, the advantages, the indices of the episodes trained on and the credit
        figures (the group counts among them). The episodes come without their token segments and images, with
        one ObjectRef a group in the object store, so the driver's memory does not grow with the batch."""
        cfg, algo, phase = self.config, self.config.algorithm, self.callbacks.phase
        g, wanted = cfg.group_size, cfg.tasks_per_step
        cap = wanted * algo.max_draw_factor if algo.dynamic_sampling else wanted
        trajs, groups, parts, n = [], [], [], wanted
        reply_limit = cfg.rollout.max_tokens_per_turn if algo.overlong_buffer is not None else None
        while n:
            with phase(self, "rollout"):
                if not trajs:  # the step's own draw, submitted up to pipeline.max_staleness steps ahead
                    self.pipeline.fill(self.pool, sampler, step, cfg.steps, n, g, cfg.rollout, self.state.version,
                                       lambda s: plan.take(s, "rollout"))
                    ticket, part, refs, stats, waited = self.pipeline.take(self.pool, step)
                else:
                    part, refs, stats = self.pool.rollout_stored(sampler.take(n), g, cfg.rollout)
            for t in part:
                t.group_id += len(trajs) // g
            check_versions(part, ticket.version if not trajs else self.state.version)
            trajs, groups = trajs + part, groups + refs
            parts.append(stats)
            with phase(self, "advantages"):
                adv, kept, credit = batch_advantages(trajs, algo, reply_limit)
            signal = sorted({i // g for i in kept})
            n = next_draw(wanted, len(signal), len(trajs) // g, cap) if algo.dynamic_sampling else 0
        if algo.dynamic_sampling:
            chosen = set(signal[:wanted])
            kept = [i for i in kept if i // g in chosen]
        drawn, trained = len(trajs) // g, len({i // g for i in kept})
        rstats = merge_stats(parts, sequential=True).as_dict()
        replies = [cut for t in trajs for cut in t.truncated]
        rstats.update(truncated=sum(replies) / len(replies) if replies else 0.0)  # replies cut at max_tokens_per_turn
        rstats.update(groups_drawn=drawn, groups_trained=trained, draw_rounds=len(parts),
                      draws_per_kept_group=drawn / trained if trained else None)
        credit["pipeline"] = pipeline_record(self.pipeline, self.pipeline.staleness(ticket, step), trained, waited,
                                             trajs, kept)
        return trajs, groups, rstats, adv, kept, credit

    def _serve_new_adapter(self) -> None:
        """Hot-load the version just published. A version whose files fail verification as the workers read it
        (storage that tore or flipped them after the write) is published again from the trainer's weights."""
        from sync import AdapterCorruptError

        try:
            self.pool.sync_adapter(self.state.version)
        except Exception as e:
            bad = storage.cause(e, lambda x: isinstance(x, AdapterCorruptError))
            if bad is None:
                raise
            print(f"[grpo] adapter v{self.state.version} failed verification as the rollout workers loaded it "
                  f"({bad.file} fails its sha256); publishing it again", file=sys.stderr, flush=True)
            self.state.version = self.group.publish(self.store_root)
            self.pool.sync_adapter(self.state.version)

    def evaluate(self, seeds=None, label: str = "eval", submitted=None) -> dict:
        """Greedy episodes on the fixed evaluation seeds with the adapter the workers serve now (or the rollout
        `submitted` earlier, see _start_actors); every episode goes to eval_samples.jsonl under `label`."""
        with self.callbacks.phase(self, "eval"):
            trajs, _, stats = self.pool.collect(submitted or self._submit_eval(seeds))
            self.eval_samples.write(trajs, label=label)
            result = {**eval_summary(trajs, stats), "solved_seeds": [t.seed for t in trajs if t.success],
                      "outcomes": run_summary.episode_outcomes(trajs)}
        self.callbacks.call("on_eval", self, label, result)
        return result

    def _submit_eval(self, seeds=None):
        cfg = self.config
        seeds = list(seeds) if seeds is not None else cfg.eval_seeds
        return self.pool.submit([Task(cfg.env.name, s, cfg.env.options) for s in seeds], 1, cfg.rollout, greedy=True)

    # ------------------------------------------------------------------------------------------ pieces
    def _record_episodes(self, step: int, trajs, groups: list, record: dict) -> None:
        """The mean of each reward function the env reports (`reward/<name>`), and a few decoded episodes."""
        rewards = reward_components(trajs)
        if rewards:
            record["reward"] = rewards
        shown = pick(list(range(len(trajs))), self.config.metrics.samples_per_step)
        self.samples.write(fetch(groups, trajs, shown) if shown else [], step=step)

    def _resume_or_begin(self) -> RunState:
        """Fresh actors, the last checkpoint restored (or a new run begun), a fresh adapter version served."""
        with self.callbacks.phase(self, "actors_start"):
            self._start_actors()
        earlier = self.state  # this process's state before a restart: its eval before and its clock stay
        resumed = self.group.load_checkpoint(self.checkpoint_root)
        if resumed is not None:
            state = RunState.from_dict(resumed["state"])
            for note in resumed["skipped"]:
                print(f"[grpo] {note}", file=sys.stderr)
            print(f"[grpo] resumed from {resumed['path']} at step {state.step}", file=sys.stderr)
        else:
            state = RunState()
        self.state, self._step = state, state.step + 1
        # The steps after the checkpoint run again: their earlier lines go, one line a step stays.
        drop_steps_after(self.run_dir / "metrics.jsonl", state.step)
        drop_steps_after(self.run_dir / "samples.jsonl", state.step)
        if state.rollout_rng is not None and len(state.rollout_rng) == len(self.pool.workers):
            self.pool.set_rng_states(state.rollout_rng)
        elif state.rollout_rng is not None:
            print(f"[grpo] the rollout workers' random state is not restored ({len(state.rollout_rng)} saved, "
                  f"{len(self.pool.workers)} workers now): the replayed steps sample other episodes", file=sys.stderr)
        # Always a new version: the store may hold versions published after the checkpoint.
        state.version = self.group.publish(self.store_root)
        self.pool.sync_adapter(state.version)
        self.pipeline = Pipeline(self.config.pipeline.max_staleness)
        self.pipeline.published(state.version, state.step)
        if state.eval_before is None:
            state.eval_before = earlier.eval_before  # measured before a restart that found no checkpoint
        early = self._early_eval or (None, None)
        if state.eval_before is None:
            state.eval_before = self.evaluate(label="before", submitted=early[0])
            print(f"[grpo] eval before training: {state.eval_before['success_rate']:.1%}", file=sys.stderr)
        state.test_before = state.test_before or earlier.test_before
        if state.test_before is None and self.config.test_seeds:
            state.test_before = self.evaluate(self.config.test_seeds, label="test before", submitted=early[1])
        self._early_eval = None
        selection.restarted(self.config.eval.select, state, self.store_root)
        # After a restart in this process the wall clock keeps running from this process's start.
        state.started = earlier.started or time.time() - state.wall_s
        if self._recovery is not None:
            self._recovery["resumed_step"] = state.step
        return state

    def _recover(self, fault: ActorFault) -> None:
        """Tear the failed attempt down; the next _run starts fresh actors from the last checkpoint."""
        t0 = time.monotonic()
        if self._recovery is not None:  # failed again before a step completed after the previous fault
            self._log_restart(completed=False)
        self.restarts += 1
        limit = self.config.fault.max_restarts
        why = f"{fault.actor} failed in step {self._step}: {fault.cause.rstrip('.')}"
        kept = session.checkpoint_phrase(self.run_dir)
        if self.restarts > limit:
            raise RunFailedError(f"{why}. The run has used all {limit} restarts (fault.max_restarts); {kept}; run "
                                 "the same command to resume") from fault
        again = "starting again from step 1" if kept == "no checkpoint yet" else "resuming from it"
        print(f"[grpo] {why}; restart {self.restarts} of {limit}: new actors, {kept}, {again}", file=sys.stderr,
              flush=True)
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

    def _where(self) -> str:
        return f"in step {self._step}" if self._step else "while starting"

    def _stop_line(self, why: str) -> str:
        return (f"[grpo] {why} {self._where()}; {session.checkpoint_phrase(self.run_dir)}; run the same command "
                "to resume")

    def _save(self) -> None:
        state = self.state
        state.wall_s = time.time() - state.started
        state.rollout_rng = self.pool.rng_states()
        self.group.save_checkpoint(self.checkpoint_root, state=state.to_dict(), keep_last=self.config.checkpoint.keep)
        selection.saved(state, self.store_root)

    def _finish(self, stopped: str) -> dict:
        """The evaluations after training and summary.json; `stopped` says why the run ended."""
        cfg, state = self.config, self.state
        after, selected = selection.final(cfg.eval.select, state, self.evaluate, self.pool.sync_adapter)
        test = self.evaluate(cfg.test_seeds, label="test") if cfg.test_seeds else None
        curve = None
        if cfg.metrics.plots:
            curve = plot_curves(self.run_dir / "metrics.jsonl", self.run_dir / "curves.png",
                                start={"eval/success_rate": state.eval_before["success_rate"]},
                                end={"eval/success_rate": after["success_rate"]})
        summary = {
            "eval_before": state.eval_before["success_rate"], "eval_after": after["success_rate"],
            "test_before": state.test_before["success_rate"] if state.test_before else None,
            "test_after": test["success_rate"] if test else None, "steps": state.step, "stopped": stopped,
            "grpo_wall_s": round(time.time() - state.started, 1), "adapter_version": selected["adapter_version"],
            "adapter_path": str(Path(self.store_root) / "adapters" / f"v{selected['adapter_version']:06d}"),
            "selected": selected,
            "evals": state.evals, "eval_after_detail": after, "test_after_detail": test,
            "curves_png": str(curve) if curve else None, "model": cfg.model,
            # Restarts logged in metrics.jsonl: this process's and those of earlier processes of the run.
            "restarts": self.sink.event_counts.get("restart", 0),
            **run_summary.mechanism(self.run_dir / "metrics.jsonl", cfg.tasks_per_step, state.eval_before, after),
        }
        atomic_write(str(self.run_dir / "summary.json"),
                     (json.dumps(json_safe(summary), indent=1, allow_nan=False) + "\n").encode())
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
        """The run opened (session.open_run: refusals before anything is placed), Ray, the metrics sink: once
        per fit(), kept across restarts."""
        cfg = self.config
        self.placement, changes = session.open_run(self.run_dir, cfg, self._ray)
        self.sink = MetricsSink(self.run_dir, cfg.metrics.tensorboard, cfg.metrics.prometheus_port,
                                wandb=cfg.metrics.wandb, run_config=cfg.to_dict())
        log_changes(self.sink, changes)

    def _start_actors(self) -> None:
        """Rollout workers and train ranks, fresh: at the start and after every fault."""
        cfg, c, f = self.config, self.config.cluster, self.config.fault
        share = self.placement.gpu_share
        engine = dataclasses.replace(cfg, model=self.model_path).engine_config()
        self.pool = RolloutPool(engine, self.store_root, str(self.run_dir), c.rollout_workers, share,
                                resources=c.rollout_resources, call_timeout_s=f.call_timeout_s,
                                env_names=[cfg.env.name])
        # A fresh run from a fresh adapter (LoRA B = 0: exactly the base model) evaluates before training while
        # the train ranks start, not after: the engine serves the base model until the first hot-load.
        fresh = cfg.adapter is None and self.state.eval_before is None and not (
            Path(self.checkpoint_root) / checkpoint.MARKER).exists()
        test = cfg.test_seeds if fresh else []  # the test set too, reported beside the eval before training
        self._early_eval = (self._submit_eval(), self._submit_eval(test) if test else None) if fresh else None
        self.group = TrainGroup(self.model_path, self.placement.train_ranks, lora=cfg.lora, algorithm=cfg.algorithm,
                                train=cfg.train, temperature=cfg.rollout.temperature, total_steps=cfg.steps,
                                adapter_path=cfg.adapter, dtype=cfg.engine.dtype, gpus_per_rank=share,
                                resources=c.train_resources, start_timeout_s=f.start_timeout_s,
                                call_timeout_s=f.call_timeout_s)
        self.pool.ready(f.start_timeout_s)

    def _close_actors(self) -> None:
        for part in (self.pool, self.group):
            if part is not None:
                part.shutdown()
        self.pool = self.group = None

    def close(self) -> None:
        self._close_actors()
        if self.sink is not None:
            self.sink.close()
            self.sink = None
        self._ray.stop()  # joined a cluster: disconnect only; started one here: stop it


def rstats_version(trajs) -> int:
    return trajs[0].adapter_version if trajs else -1
