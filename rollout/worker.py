"""Multi-turn rollouts: every live episode of a batch goes to vLLM in one call per turn, and their env calls
run at once on threads, so a turn waits about one env call however many episodes there are.

What an env returns is checked (envs.contract). A group whose env raises or breaks the contract starts over
with fresh env instances (its other episodes too: advantages are relative to the whole group), up to
`RolloutConfig.env_retries` times; then envs.EnvError names the env, the seed, the turn and the traceback.

Run it in-process, or as a Ray actor with `ray.remote(RolloutWorker)`: the class holds no Ray code.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from envs.base import AgentEnv, Observation
from envs.contract import EnvError, check_env, check_step_result, env_error
from envs.tools import as_toolset
from rollout import runtime, tool_calls
from rollout.checks import check_choice, check_number
from rollout.env_threads import EnvThreads
from rollout.models import image_length
from rollout.openai_server import run_agents
from rollout.trajectory import RolloutStats, Segment, Trajectory

HISTORY_MODES = ("full", "text", "none")


@dataclass(frozen=True)
class Task:
    env: str
    seed: int
    options: dict = field(default_factory=dict)

    @property
    def task_id(self) -> str:
        return f"{self.env}:{self.seed}"


@dataclass(frozen=True)
class RolloutConfig:
    temperature: float = 1.0  # the run's one temperature: vLLM samples at it and the trainer scores at it
    top_p: float = 1.0  # nucleus sampling; 1: the whole distribution, which training needs (see RunConfig)
    max_tokens_per_turn: int = 32  # a reply's token limit
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

    def __post_init__(self):
        check_number(self, "temperature", ge=0)
        check_number(self, "top_p", gt=0, le=1)
        check_number(self, "max_tokens_per_turn", integer=True, ge=1)
        check_choice(self, "history", HISTORY_MODES + ("auto",))
        check_number(self, "max_turns", integer=True, ge=1, optional=True)
        check_number(self, "env_workers", integer=True, ge=1, hint="threads for env calls; 1 runs them in turn")
        check_number(self, "env_retries", integer=True, ge=0, hint="0 stops at the first env failure")


class _Episode:
    def __init__(self, task: Task, group_id: int, slot: int, env, first: Observation, history: str, chat):
        self.task, self.group_id, self.slot, self.env, self.chat = task, group_id, slot, env, chat
        self.history = history
        if history == "auto":
            self.history = "full" if getattr(env, "keep_images", True) else "text"
        self.first = first
        # An env with tools: replies that call them get the results as `tool` messages (docs/tools.md).
        self.toolset = as_toolset(env.tools) if getattr(env, "tools", ()) else None
        self.tool_calls = 0
        self.tool_errors: Counter = Counter()
        if self.toolset is not None:
            chat = self.chat = chat.with_tools(self.toolset.schemas)
            if chat.tool_format is None:
                raise ValueError(f"env {task.env!r} has tools but the model's chat template renders no tool calls "
                                 f"(formats read: {', '.join(tool_calls.FORMATS)}); use a model whose template "
                                 "takes `tools` (docs/tools.md)")
            if self.history == "none":
                raise ValueError(f"env {task.env!r} has tools: rollout.history 'none' would drop the calls and "
                                 "their results from the next turn; use 'full' or 'text'")
        self.segments: list[Segment] = []
        self.turn_rewards: list[float] = []
        self.actions: list[str] = []
        self.turn_states: list = []
        self.parse_errors = 0
        self.success = False
        self.stop_reason: str | None = None
        self.info: dict = {}
        # The context the next turn sees, compact ids plus per-token mask/logprob and its images.
        self._start_context(chat.prompt_ids(first), list(first.images))

    def _start_context(self, ids: list[int], images: list) -> None:
        self.ids, self.mask, self.lps, self.images = list(ids), [0] * len(ids), [0.0] * len(ids), images

    @property
    def done(self) -> bool:
        return self.stop_reason is not None

    @property
    def turn(self) -> int:
        """The turn the next step takes, from 1 (turn 0 is reset)."""
        return len(self.turn_rewards) + 1

    def take_reply(self, gen) -> str:
        """Append the sampled tokens; the text the env receives."""
        self.ids += gen.token_ids
        self.mask += [1] * len(gen.token_ids)
        self.lps += gen.logprobs
        return self.chat.action_text(gen.token_ids)

    def parse_calls(self, action: str):
        """The reply's tool calls; None for an env without tools or a reply that calls none (it goes to step)."""
        if self.toolset is None:
            return None
        return tool_calls.parse(self.chat.tool_format, action, self.tool_calls)[1] or None

    def on_tool_turn(self, action: str, calls: list, state, results: list, reply_ids: list[int],
                     max_turns: int | None) -> None:
        """A reply that called tools: their results go back as `tool` messages; the env's step is not called."""
        self.actions.append(action)
        self.turn_states.append(state)
        self.turn_rewards.append(0.0)
        self.tool_calls += len(calls)
        self.tool_errors.update(r.error for r in results if r.error)
        capped = max_turns is not None and len(self.turn_rewards) >= max_turns
        if self.history != "full" or capped:
            self.segments.append(Segment(self.ids, self.mask, self.lps, self.images))
        if capped:
            self.stop_reason = "max_turns"
            return
        messages = [{"role": "tool", "tool_call_id": c.id, "name": c.name or "", "content": r.content}
                    for c, r in zip(calls, results)]
        readable = [] if any(c.error for c in calls) else [c.as_message_call() for c in calls]
        suffix = self.chat.tool_result_ids(readable, messages, reply_ids)
        if self.history == "full":
            self.ids += suffix
            self.mask += [0] * len(suffix)
            self.lps += [0.0] * len(suffix)
        else:
            self._start_context(self.chat.drop_images(self.ids) + suffix, [])

    def on_step(self, action: str, state, result, reply_ids: list[int], max_turns: int | None) -> None:
        """What the env said about `action` (a checked StepResult); `state` is its state_key before."""
        self.actions.append(action)
        self.turn_states.append(state)
        self.turn_rewards.append(float(result.reward))
        info = result.info or {}
        self.parse_errors += int(bool(info.get("parse_error")))
        self.success = bool(info.get("success", self.success))
        self.info = info
        capped = not result.done and max_turns is not None and len(self.turn_rewards) >= max_turns
        if self.history != "full" or result.done or capped:
            self.segments.append(Segment(self.ids, self.mask, self.lps, self.images))
        if result.done or capped:
            self.stop_reason = "max_turns" if capped or info.get("truncated") else "done"
            return
        obs = result.observation
        if self.history == "full":
            suffix = self.chat.observation_ids(obs, reply_ids)
            self.ids += suffix
            self.mask += [0] * len(suffix)
            self.lps += [0.0] * len(suffix)
            self.images = self.images + list(obs.images)
        elif self.history == "text":
            kept = self.chat.drop_images(self.ids)
            self._start_context(kept + self.chat.observation_ids(obs, reply_ids), list(obs.images))
        else:
            merged = Observation(text=f"{self.first.text}\n{obs.text}", images=list(obs.images))
            self._start_context(self.chat.prompt_ids(merged), list(obs.images))

    def finish_for_context(self) -> None:
        # The context is full before the model could act: what was sampled so far still trains.
        if self.history == "full" and any(self.mask):
            self.segments.append(Segment(self.ids, self.mask, self.lps, self.images))
        self.stop_reason = "context"

    def trajectory(self, adapter_version) -> Trajectory:
        return Trajectory(
            task_id=self.task.task_id, group_id=self.group_id, seed=self.task.seed, segments=self.segments,
            turn_rewards=self.turn_rewards, num_turns=len(self.turn_rewards), stop_reason=self.stop_reason,
            adapter_version=adapter_version, success=self.success, parse_errors=self.parse_errors,
            actions=self.actions, turn_states=self.turn_states, info=dict(self.info),
            tool_calls=self.tool_calls, tool_errors=dict(self.tool_errors),
        )


class _Batch:
    """A rollout's episodes (episode k of task g in slot g * group_size + k), the threads their env calls
    run on, and the re-runs of groups whose env failed: a failed group starts over with fresh env instances
    and joins the next engine call, until its retry budget is spent."""

    def __init__(self, tasks: list[Task], group_size: int, config: RolloutConfig, chat, threads: EnvThreads):
        self.tasks, self.group_size, self.config, self.chat = tasks, group_size, config, chat
        n = len(tasks) * group_size
        self.episodes: list[_Episode] = [None] * n  # type: ignore[list-item]  # filled by open()
        self.threads = threads
        self.reruns: Counter = Counter()
        self.env_s = 0.0

    def open(self, group_ids) -> None:
        """Fresh env instances for every episode of `group_ids`, built and reset on their threads."""
        pending = list(group_ids)
        while pending:
            g = self.group_size
            slots = [s for gid in pending for s in range(gid * g, (gid + 1) * g)]
            outcomes = self._run([(s, check_env, self.tasks[s // g].env, self.tasks[s // g].options,
                                   self.tasks[s // g].seed) for s in slots])
            failed = self._failures(zip((s // g for s in slots), outcomes))
            for s, out in zip(slots, outcomes):
                if s // g not in failed:
                    self.episodes[s] = _Episode(self.tasks[s // g], s // g, s, *out, self.config.history, self.chat)
            pending = self._rerun(failed)

    def step(self, live: list[_Episode], gens) -> None:
        """Every live episode's reply to its env, all at once; groups whose env failed start over."""
        actions = [e.take_reply(g) for e, g in zip(live, gens)]
        calls = [e.parse_calls(a) for e, a in zip(live, actions)]
        outcomes = self._run([(e.slot, _run_tools, e.env, e.toolset, e.task, e.turn, c) if c else
                              (e.slot, _step_env, e.env, e.task, e.turn, a) for e, a, c in zip(live, actions, calls)])
        failed = self._failures(zip((e.group_id for e in live), outcomes))
        for e, g, a, c, out in zip(live, gens, actions, calls, outcomes):
            if e.group_id in failed:
                continue
            if c:
                e.on_tool_turn(a, c, *out, g.token_ids, self.config.max_turns)
            else:
                e.on_step(a, *out, g.token_ids, self.config.max_turns)
        self.open(self._rerun(failed))

    def _run(self, calls: list[tuple]) -> list:
        t = time.perf_counter()
        futures = [self.threads.submit(slot, fn, *args) for slot, fn, *args in calls]
        outcomes = []
        for f in futures:
            try:
                outcomes.append(f.result())
            except EnvError as e:
                outcomes.append(e)
        self.env_s += time.perf_counter() - t
        return outcomes

    @staticmethod
    def _failures(pairs) -> dict[int, EnvError]:
        failed: dict[int, EnvError] = {}
        for gid, out in pairs:
            if isinstance(out, EnvError):
                failed.setdefault(gid, out)
        return failed

    def _rerun(self, failed: dict[int, EnvError]) -> list[int]:
        budget = self.config.env_retries
        for gid, e in failed.items():
            if self.reruns[gid] >= budget:
                note = (f"its group of {self.group_size} episodes ran {budget + 1} time(s), each with fresh env "
                        f"instances, and failed each time (env_retries={budget})")
                raise EnvError(e.env, e.seed, e.turn, e.method, e.problem, e.traceback_text, note)
            self.reruns[gid] += 1
        return sorted(failed)


def _step_env(env, task: Task, turn: int, action: str) -> tuple:
    """On the episode's thread: the state the turn begins in, then the env's checked answer to `action`."""
    method = "state_key"
    try:
        state = env.state_key()
        method = "step"
        return state, check_step_result(env.step(action))
    except Exception as e:
        raise env_error(e, task.env, task.seed, turn, method) from None


def _run_tools(env, toolset, task: Task, turn: int, calls: list) -> tuple:
    """On the episode's thread: the state the turn begins in, then each call's result (failures included)."""
    try:
        state = env.state_key()
    except Exception as e:
        raise env_error(e, task.env, task.seed, turn, "state_key") from None
    return state, [toolset.run(c) for c in calls]


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
        """Run `group_size` episodes of every task; all live episodes share one engine call per turn, and
        their env calls run at once on `config.env_workers` threads. A group whose env raises or breaks
        its contract is re-run with fresh env instances up to `config.env_retries` times, then envs.EnvError."""
        from rollout.engine import Request, Sampling

        t0 = time.perf_counter()
        batch = _Batch(tasks, group_size, config, self._chat(config.system_prompt),
                       self._threads(max(1, min(config.env_workers, len(tasks) * group_size))))
        sampling = (Sampling.greedy(config.max_tokens_per_turn, config.stop) if greedy else
                    Sampling(config.temperature, config.top_p, config.max_tokens_per_turn, config.stop))
        version = self.engine.adapter_version if use_adapter else None
        calls, engine_s, prompt_tokens = 0, 0.0, 0
        limit = self.engine.cfg.max_model_len
        finished = False
        try:
            batch.open(range(len(tasks)))
            if isinstance(batch.episodes[0].env, AgentEnv):  # its agents call the engine through the endpoint
                calls, engine_s, prompt_tokens = run_agents(self, batch.episodes, config, sampling, use_adapter)
            while True:
                live = [e for e in batch.episodes if not e.done]
                for e in live:
                    if self._expanded_len(e) + config.max_tokens_per_turn > limit:
                        e.finish_for_context()
                live = [e for e in live if not e.done]
                if not live:
                    break
                t = time.perf_counter()
                gens = self.engine.generate([Request(e.ids, e.images) for e in live], sampling, use_adapter)
                engine_s += time.perf_counter() - t
                calls += 1
                prompt_tokens += sum(g.expanded_prompt_len for g in gens)
                batch.step(live, gens)
            finished = True
        finally:
            if not finished:
                # Env calls still queued are dropped rather than waited for; a thread stuck in a hung env
                # call goes with its pool, and the next rollout starts a fresh one.
                self._env_threads.close(wait=False)
                self._env_threads = None
        trajs = [e.trajectory(version) for e in batch.episodes]
        n = len(trajs)
        stats = RolloutStats(
            episodes=n, turns=sum(t.num_turns for t in trajs),
            generated_tokens=sum(t.num_generated for t in trajs), prompt_tokens=prompt_tokens,
            engine_calls=calls, wall_s=time.perf_counter() - t0, engine_s=engine_s,
            success_rate=sum(t.success for t in trajs) / max(n, 1),
            mean_reward=sum(t.reward for t in trajs) / max(n, 1),
            mean_turns=sum(t.num_turns for t in trajs) / max(n, 1),
            parse_errors=sum(t.parse_errors for t in trajs),
            stop_reasons=dict(Counter(t.stop_reason for t in trajs)),
            env_s=batch.env_s, env_retries=sum(batch.reruns.values()),
        )
        if any(e.toolset is not None for e in batch.episodes):
            stats.tool_calls = sum(t.tool_calls for t in trajs)
            stats.tool_errors = dict(sum((Counter(t.tool_errors) for t in trajs), Counter()))
        return trajs, stats

    def _expanded_len(self, e: _Episode) -> int:
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
