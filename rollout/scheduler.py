"""How a rollout's episodes move between vLLM and their envs.

"continuous": an episode's reply goes to its env as soon as vLLM returns it, and its next turn goes to vLLM as
soon as its env answers, so no episode waits at a turn boundary for the rest of the batch (nor for the slowest
env call); vLLM batches whatever is in flight, up to engine.max_num_seqs. "lockstep": every live episode's
turn goes to vLLM together and every env call of the turn is waited for before the next turn starts. Both
sample the same distribution; lockstep's engine batches do not depend on env timing, so with the same random
state it samples the same tokens, which an exact replay of a step needs (docs/fault-tolerance.md).

A group whose env raises or breaks its contract starts over with fresh env instances (its other episodes
too: advantages are relative to the whole group), up to `RolloutConfig.env_retries` times; its requests in
flight are aborted and its env calls still running are ignored when they return.
"""
from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass

from envs.contract import EnvError, check_env
from rollout.env_threads import EnvThreads
from rollout.episode import Episode, run_tools, step_env


@dataclass(eq=False)  # compared by identity: the loop removes the calls it settled from those in progress
class _Call:
    """One episode's env call in progress: the reply it answers, and the group attempt it belongs to."""
    episode: Episode
    gen: object
    action: str
    tool_calls: list | None
    attempt: int
    future: Future


@dataclass
class Flow:
    """What a rollout's loop measured: engine batches submitted, time in the engine, prompt tokens vLLM ran,
    time spent waiting for env calls with nothing in flight on the engine, and requests in flight per step."""
    submits: int = 0
    engine_s: float = 0.0
    prompt_tokens: int = 0
    engine_idle_s: float = 0.0
    in_flight_sum: int = 0
    engine_steps: int = 0


class Batch:
    """A rollout's episodes (episode k of task g in slot g * group_size + k), the threads their env calls
    run on, and the re-runs of groups whose env failed."""

    def __init__(self, tasks: list, group_size: int, config, chat, threads: EnvThreads):
        self.tasks, self.group_size, self.config, self.chat = tasks, group_size, config, chat
        self.episodes: list[Episode] = [None] * (len(tasks) * group_size)  # type: ignore[list-item]
        self.threads = threads
        self.reruns: Counter = Counter()
        self.env_s = 0.0

    def open(self, group_ids) -> list[Episode]:
        """Fresh env instances for every episode of `group_ids`, built and reset on their threads; the new
        episodes in slot order."""
        pending, opened = list(group_ids), []
        while pending:
            g = self.group_size
            slots = [s for gid in pending for s in range(gid * g, (gid + 1) * g)]
            futures = [self.threads.submit(s, check_env, self.tasks[s // g].env, self.tasks[s // g].options,
                                           self.tasks[s // g].seed) for s in slots]
            outcomes = self._outcomes(futures)
            failed = self._failures(zip((s // g for s in slots), outcomes))
            for s, out in zip(slots, outcomes):
                if s // g not in failed:
                    self.episodes[s] = Episode(self.tasks[s // g], s // g, s, *out, self.config.history, self.chat)
                    opened.append(self.episodes[s])
            opened = [e for e in opened if e.group_id not in failed]
            pending = self._rerun(failed)
        return sorted(opened, key=lambda e: e.slot)

    def run(self, engine, sampling, use_adapter: bool, fits, continuous: bool) -> Flow:
        """Advance every episode to its end. `fits(episode)`: whether its next turn still fits the context."""
        flow = Flow()
        ready = [e for e in self.episodes if not e.done]
        in_flight: dict[str, Episode] = {}
        calls: list[_Call] = []
        while ready or in_flight or calls:
            if ready and (continuous or not (in_flight or calls)):
                t = time.perf_counter()
                for e in ready:
                    if fits(e):
                        in_flight[engine.submit(_request(e), sampling, use_adapter)] = e
                    else:
                        e.finish_for_context()
                flow.engine_s += time.perf_counter() - t
                flow.submits += 1
                ready = []
            if in_flight:
                t = time.perf_counter()
                flow.in_flight_sum += len(in_flight)
                flow.engine_steps += 1
                replies = [(in_flight.pop(key), gen) for key, gen in engine.step().items()]
                flow.prompt_tokens += sum(gen.expanded_prompt_len for _, gen in replies)
                flow.engine_s += time.perf_counter() - t
                # An env call starts as soon as its reply is back, under lockstep too: it runs while the engine
                # finishes the turn's other replies. Lockstep still waits for all of them before the next turn.
                calls += [self._call(e, gen) for e, gen in sorted(replies, key=lambda r: r[0].slot)]
            if calls and (continuous or not in_flight):
                done = self._settle_wait(calls, wait_all=not continuous, idle=not in_flight, flow=flow)
                calls = [c for c in calls if c not in done]
                applied, failed = self._settle(done)
                ready += [c.episode for c in applied if not c.episode.done]
                if failed:
                    engine.abort([k for k, e in in_flight.items() if e.group_id in failed])
                    in_flight = {k: e for k, e in in_flight.items() if e.group_id not in failed}
                    ready = [e for e in ready if e.group_id not in failed] + self.open(self._rerun(failed))
                ready.sort(key=lambda e: e.slot)
        return flow

    def _call(self, e: Episode, gen) -> _Call:
        action = e.take_reply(gen)
        tools = e.parse_calls(action)
        inline = not getattr(e.env, "blocking", True)
        future = (self.threads.submit(e.slot, run_tools, e.env, e.toolset, e.task, e.turn, tools, inline=inline)
                  if tools else self.threads.submit(e.slot, step_env, e.env, e.task, e.turn, action, inline=inline))
        return _Call(e, gen, action, tools, self.reruns[e.group_id], future)

    def _settle_wait(self, calls: list[_Call], wait_all: bool, idle: bool, flow: Flow) -> list[_Call]:
        """The env calls to apply now: all of them (lockstep), or those finished, waiting for one only when the
        engine has nothing in flight (continuous)."""
        done = [c for c in calls if c.future.done()]
        if wait_all or (idle and not done):
            t = time.perf_counter()
            wait([c.future for c in calls], return_when="ALL_COMPLETED" if wait_all else FIRST_COMPLETED)
            waited = time.perf_counter() - t
            self.env_s += waited
            flow.engine_idle_s += waited
            done = [c for c in calls if c.future.done()]
        return done

    def _settle(self, done: list[_Call]) -> tuple[list[_Call], dict[int, EnvError]]:
        """Apply the env's answers (in slot order): the calls applied, and the groups whose env failed, by group
        id. An answer for an attempt of a group that has since started over is dropped."""
        current = sorted((c for c in done if c.attempt == self.reruns[c.episode.group_id]),
                         key=lambda c: c.episode.slot)
        outcomes = self._outcomes([c.future for c in current])
        failed = self._failures(zip((c.episode.group_id for c in current), outcomes))
        applied = [(c, out) for c, out in zip(current, outcomes) if c.episode.group_id not in failed]
        for c, out in applied:
            if c.tool_calls:
                c.episode.on_tool_turn(c.action, c.tool_calls, *out, c.gen.token_ids, self.config.max_turns)
            else:
                c.episode.on_step(c.action, *out, c.gen.token_ids, self.config.max_turns)
        return [c for c, _ in applied], failed

    def _outcomes(self, futures: list[Future]) -> list:
        t = time.perf_counter()
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


def _request(e: Episode):
    from rollout.engine import Request

    return Request(e.ids, e.images)
