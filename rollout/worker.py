"""Multi-turn rollouts on a vLLM engine: episodes go to vLLM and their env calls run at once on threads,
continuously or turn by turn in lockstep (rollout.scheduler, `RolloutConfig.schedule`).

What an env returns is checked (envs.contract). A group whose env raises or breaks the contract starts over
with fresh env instances (its other episodes too: advantages are relative to the whole group), up to
`RolloutConfig.env_retries` times; then envs.EnvError names the env, the seed, the turn and the traceback.

Run it in-process, or as a Ray actor with `ray.remote(RolloutWorker)`: the class holds no Ray code.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

from envs.base import AgentEnv
from rollout import runtime
from rollout.checks import check_choice, check_number
from rollout.env_threads import EnvThreads
from rollout.episode import Task
from rollout.models import image_length
from rollout.openai_server import run_agents
from rollout.scheduler import Batch
from rollout.trajectory import RolloutStats, Trajectory

HISTORY_MODES = ("full", "text", "none")


@dataclass(frozen=True)
class RolloutConfig:
    temperature: float = 1.0  # the run's one temperature: vLLM samples at it and the trainer scores at it
    top_p: float = 1.0  # nucleus sampling; 1: the whole distribution, which training needs (see RunConfig)
    # A reply's token limit. None: half of engine.max_model_len, set by grpo.RunConfig, room for a reasoning
    # reply and its prompt (a small fixed limit cut reasoning replies short); a RolloutConfig used alone sets it.
    max_tokens_per_turn: int | None = None
    stop: tuple[str, ...] = ()  # strings that end a reply
    # "full": the whole conversation, images included, one growing sequence. "text": earlier images leave
    # the context, their text stays. "none": each turn sees the first observation's text and the current
    # observation only (enough when the observation shows the whole state, as the maze's image does).
    # "auto": "full" if the env keeps images (env.keep_images), else "text".
    history: str = "auto"
    system_prompt: str | None = None  # a system message before the first observation; None: none
    # An episode ends after this many turns (stop_reason "max_turns") whatever the env says; the env's own
    # limit still applies. None: only the env and the context length end an episode.
    max_turns: int | None = None
    # Threads running the live episodes' env calls (reset, step) at once, capped at the episode count.
    # Threads suit envs that wait (sandboxes, simulators, tools, the network); 64 lets a step of 8 tasks x 8
    # episodes wait about one env call per turn. 1: one call after another (envs whose instances share state).
    env_workers: int = 64
    # Re-runs of a group whose env raised or broke its contract, each with fresh env instances, per group and
    # rollout call (training on the group's surviving episodes would bias its advantages); past it the
    # rollout raises envs.EnvError naming the env, the seed, the turn and the env's traceback.
    env_retries: int = 2
    # "lockstep": each turn of every live episode goes to vLLM as one batch and waits for all their env calls;
    # the batches do not depend on env timing, so a replayed step samples the same tokens (an exact resume).
    # "continuous": each episode moves on as soon as its own env call returns; with env calls whose latency
    # varies (tools, sandboxes) no episode waits for the slowest of its turn (rollout.scheduler). Which
    # episodes share an engine batch then depends on env timing, and a replay is not bitwise.
    schedule: str = "lockstep"

    def __post_init__(self):
        check_number(self, "temperature", ge=0)
        check_number(self, "top_p", gt=0, le=1)
        check_number(self, "max_tokens_per_turn", integer=True, ge=1, optional=True)
        check_choice(self, "history", HISTORY_MODES + ("auto",))
        check_number(self, "max_turns", integer=True, ge=1, optional=True)
        check_number(self, "env_workers", integer=True, ge=1, hint="threads for env calls; 1 runs them in turn")
        check_number(self, "env_retries", integer=True, ge=0, hint="0 stops at the first env failure")
        check_choice(self, "schedule", ("lockstep", "continuous"))


class RolloutWorker:
    def __init__(self, engine_config, store_root: str | None = None, worker_id: str = "rollout-0",
                 run_dir: str | None = None, env_factories: dict | None = None):
        if run_dir is not None:
            runtime.configure(run_dir)
        import envs

        # Environments registered in the driver process; Ray ships classes defined in a user's script by value.
        for name, factory in (env_factories or {}).items():
            envs.register(name, factory, overwrite=True)
        from rollout.conversation import ChatFormat
        from rollout.engine import Engine
        from rollout.models import load_processor

        self.worker_id = worker_id
        self.engine = Engine(engine_config)
        self.processor = load_processor(engine_config.model)
        self._chat_cache: dict = {}
        self._chat = lambda system: self._chat_cache.setdefault(system, ChatFormat(self.processor, system))
        self._image_tokens: dict = {}
        self._env_threads: EnvThreads | None = None
        self._last_end: float | None = None  # when the last rollout call ended: the engine idled since
        self.store = None
        if store_root is not None:
            from sync import AdapterStore

            self.store = AdapterStore(store_root)

    # ------------------------------------------------------------------------------------------ adapters
    def sync_adapter(self, version: int | None = None) -> int | None:
        """Serve `version` (default: the newest that verifies) from the store; returns the version served."""
        if self.store is None:
            raise RuntimeError("this worker has no adapter store: pass store_root")
        # The lease goes on before vLLM reads the files, so garbage collection keeps them meanwhile, and it
        # leaves the version served until now: vLLM holds that one in memory.
        if version is None:
            info = self.store.acquire(self.worker_id)
            if info is None:
                return self.engine.adapter_version
        else:
            self.store.mark_in_use(self.worker_id, version)
            info = self.store.verify(version)
        self.engine.load_adapter(info.version, info.path)
        return info.version

    @property
    def adapter_version(self) -> int | None:
        return self.engine.adapter_version

    def sleep(self) -> None:
        self.engine.sleep()

    def wake_up(self) -> None:
        self.engine.wake_up()

    # ------------------------------------------------------------------------------------------ rollouts
    def rollout(self, tasks: list[Task], group_size: int, config: RolloutConfig, greedy: bool = False,
                use_adapter: bool = True) -> tuple[list[Trajectory], RolloutStats]:
        """Run `group_size` episodes of every task, scheduled as `config.schedule` says, their env calls at
        once on `config.env_workers` threads. A group whose env raises or breaks its contract is re-run with
        fresh env instances up to `config.env_retries` times, then envs.EnvError."""
        from rollout.engine import Sampling

        t0 = time.perf_counter()
        idle_between = t0 - self._last_end if self._last_end is not None else 0.0
        batch = Batch(tasks, group_size, config, self._chat(config.system_prompt),
                      self._threads(max(1, min(config.env_workers, len(tasks) * group_size))))
        sampling = (Sampling.greedy(config.max_tokens_per_turn, config.stop) if greedy else
                    Sampling(config.temperature, config.top_p, config.max_tokens_per_turn, config.stop))
        version = self.engine.adapter_version if use_adapter else None
        limit = self.engine.cfg.max_model_len
        finished = False
        try:
            batch.open(range(len(tasks)))
            agents = (0, 0.0, 0)
            if isinstance(batch.episodes[0].env, AgentEnv):  # its agents call the engine through the endpoint
                agents = run_agents(self, batch.episodes, config, sampling, use_adapter)
            flow = batch.run(self.engine, sampling, use_adapter, continuous=config.schedule == "continuous",
                             fits=lambda e: self._expanded_len(e) + config.max_tokens_per_turn <= limit)
            finished = True
        finally:
            if not finished:
                # Env calls still queued are dropped rather than waited for, and requests still in flight are
                # aborted; a thread stuck in a hung env call goes with its pool, and the next rollout starts a
                # fresh one.
                self._env_threads.close(wait=False)
                self._env_threads = None
                self.engine.abort()
        trajs = [e.trajectory(version) for e in batch.episodes]
        n = len(trajs)
        self._last_end = time.perf_counter()
        stats = RolloutStats(
            episodes=n, turns=sum(t.num_turns for t in trajs),
            generated_tokens=sum(t.num_generated for t in trajs), prompt_tokens=flow.prompt_tokens + agents[2],
            engine_calls=flow.submits + agents[0], wall_s=self._last_end - t0, engine_s=flow.engine_s + agents[1],
            success_rate=sum(t.success for t in trajs) / max(n, 1),
            mean_reward=sum(t.reward for t in trajs) / max(n, 1),
            mean_turns=sum(t.num_turns for t in trajs) / max(n, 1),
            parse_errors=sum(t.parse_errors for t in trajs),
            stop_reasons=dict(Counter(t.stop_reason for t in trajs)),
            env_s=batch.env_s, env_retries=sum(batch.reruns.values()),
            engine_idle_s=idle_between + flow.engine_idle_s,
            in_flight_mean=flow.in_flight_sum / flow.engine_steps if flow.engine_steps else 0.0,
        )
        if any(e.toolset is not None for e in batch.episodes):
            stats.tool_calls = sum(t.tool_calls for t in trajs)
            stats.tool_errors = dict(sum((Counter(t.tool_errors) for t in trajs), Counter()))
        return trajs, stats

    def _expanded_len(self, e) -> int:
        extra = 0
        for img in e.images:
            key = img.size
            if key not in self._image_tokens:
                self._image_tokens[key] = image_length(self.processor, img)
            extra += self._image_tokens[key] - 1
        return len(e.ids) + extra

    def _threads(self, needed: int) -> EnvThreads:
        """The env threads, kept from one rollout to the next: starting 64 threads took 0.09 s of each
        call here, a tenth of a small model's rollout."""
        # Exactly `needed`: env_workers also caps how many env calls run at once.
        if self._env_threads is None or self._env_threads.size != needed:
            if self._env_threads is not None:
                self._env_threads.close(wait=True)
            self._env_threads = EnvThreads(needed)
        return self._env_threads

    def shutdown(self) -> None:
        """Free the engine (and its memory) and the env threads now rather than at garbage collection, and
        drop this worker's lease so garbage collection may take the version it served."""
        import gc

        if self.store is not None:
            self.store.release(self.worker_id)
        if self._env_threads is not None:
            self._env_threads.close(wait=False)
            self._env_threads = None
        self.engine = None
        gc.collect()
