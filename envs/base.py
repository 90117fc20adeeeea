"""The environment contract the rollout worker drives: reset to a task, then step with the model's text."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Hashable, Optional

if TYPE_CHECKING:  # PIL is only needed by environments that draw; keep `import envs` light.
    from PIL.Image import Image


@dataclass
class Observation:
    """What the model sees next: text, and zero or more images shown with it (in order).

    `messages`, on a first observation only: the whole conversation the reply follows, as chat messages
    ({"role", "content"}: a system message, earlier turns, the last one the user's), rendered through the chat
    template in place of one user turn of `text` (a dataset's conversational rows); `text` is then the last
    user message. A system message there replaces `rollout.system_prompt`. Images go into the last message."""

    text: str
    images: list[Image] = field(default_factory=list)
    messages: Optional[list[dict]] = None


@dataclass
class StepResult:
    observation: Observation
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


class Env(ABC):
    """One episode at a time. Plain Python: no Ray, no model; the rollout worker owns the conversation.

    The rollout worker runs the calls of many instances at once on threads (`rollout.env_workers`), each
    instance's calls always on the same thread: instances must not share unguarded mutable state. What
    `reset` and `step` return is checked (envs.contract); an env that raises or breaks the contract gets
    its group re-run with fresh instances, up to `rollout.env_retries` times, then the run stops.

    `keep_images` tells the rollout worker whether earlier observations' images stay in the
    conversation (True) or only the latest one is shown; environments override it as they see fit.

    `tools`: functions (or envs.tools.Tool) the model may call in its family's native format; a reply that
    calls tools gets their results as `tool` messages and never reaches `step` (docs/tools.md).

    `blocking`: whether `step` and the tools wait on something outside this process (a sandbox, a simulator,
    the network). An env that only computes (False: the maze) has its steps run inline on the rollout
    loop's thread (its reset still on a pool thread), which costs less than handing a sub-millisecond call to
    a thread and waking the loop.
    """

    keep_images: bool = True
    tools: tuple = ()
    blocking: bool = True

    @abstractmethod
    def reset(self, seed: int) -> Observation:
        """Start the episode for task `seed`: the same seed gives the same task on every machine."""

    @abstractmethod
    def step(self, action_text: str) -> StepResult:
        """Apply the model's reply (raw text, parsed by the env) and say what happened."""

    def task_key(self, seed: int) -> Optional[Hashable]:
        """The identity of the task that `seed` gives, or None (the default: every seed its own task). Seeds
        can name the same task (two maze seeds that draw one layout, a dataset's seeds that cycle through its
        rows): the trainer skips every training seed whose key is that of an eval or test seed
        (envs.split), so training never draws a task the evaluations score. Must not need `reset`."""
        return None

    def state_key(self) -> Optional[Hashable]:
        """A key that is equal exactly when two moments of episodes of the same task are the same state
        (the maze: the agent's block), or None. The rollout records it before every turn; step-level
        advantages compare the actions taken from equal states across a group. Keep it small and picklable."""
        return None


class AgentEnv(Env):
    """A task for an agent written against the OpenAI chat API: `agent(client, task) -> reward` runs each
    episode through an `openai.OpenAI` client pointed at the rollout's engine (rollout/openai_server.py;
    docs/tools.md). `tasks(seed)` gives the agent its task (any object); the agent returns its reward, or
    {"reward": r, "success": bool}. Register with functools.partial(AgentEnv, agent=fn, tasks=fn)."""

    keep_images = False

    def __init__(self, agent, tasks):
        if not callable(agent) or not callable(tasks):
            raise ValueError(f"AgentEnv needs agent(client, task) and tasks(seed) functions, got {agent!r}, {tasks!r}")
        self.agent, self.tasks = agent, tasks

    def reset(self, seed: int) -> Observation:
        self.task = self.tasks(seed)
        return Observation(self.task if isinstance(self.task, str) else repr(self.task))

    def step(self, action_text: str) -> StepResult:
        raise NotImplementedError("an AgentEnv's episodes are run by its agent, through the OpenAI endpoint")
