"""One episode in a rollout: the context its next turn sees, and what each turn adds to it (the sampled reply,
the env's observation or the results of its tool calls), until it ends."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from envs.base import Observation
from envs.contract import check_step_result, env_error
from envs.tools import as_toolset
from rollout import tool_calls
from rollout.trajectory import Segment, Trajectory


@dataclass(frozen=True)
class Task:
    env: str
    seed: int
    options: dict = field(default_factory=dict)

    @property
    def task_id(self) -> str:
        return f"{self.env}:{self.seed}"


class Episode:
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
        self.reply_tokens: list[int] = []
        self.truncated: list[bool] = []  # per reply: cut at max_tokens_per_turn
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
        self.reply_tokens.append(len(gen.token_ids))
        self.truncated.append(gen.finish_reason == "length")
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
            tool_calls=self.tool_calls, tool_errors=dict(self.tool_errors), reply_tokens=list(self.reply_tokens),
            truncated=list(self.truncated),
        )


def step_env(env, task: Task, turn: int, action: str) -> tuple:
    """On the episode's thread: the state the turn begins in, then the env's checked answer to `action`."""
    method = "state_key"
    try:
        state = env.state_key()
        method = "step"
        return state, check_step_result(env.step(action))
    except Exception as e:
        raise env_error(e, task.env, task.seed, turn, method) from None


def run_tools(env, toolset, task: Task, turn: int, calls: list) -> tuple:
    """On the episode's thread: the state the turn begins in, then each call's result (failures included)."""
    try:
        state = env.state_key()
    except Exception as e:
        raise env_error(e, task.env, task.seed, turn, "state_key") from None
    return state, [toolset.run(c) for c in calls]
