"""The environment contract the rollout worker drives: reset to a task, then step with the model's text."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Hashable, Optional

if TYPE_CHECKING:  # PIL is only needed by environments that draw; keep `import envs` light.
    from PIL.Image import Image


@dataclass
class Observation:
    """What the model sees next: text, and zero or more images shown with it (in order)."""

    text: str
    images: list[Image] = field(default_factory=list)


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
    """

    keep_images: bool = True

    @abstractmethod
    def reset(self, seed: int) -> Observation:
        """Start the episode for task `seed`: the same seed gives the same task on every machine."""

    @abstractmethod
    def step(self, action_text: str) -> StepResult:
        """Apply the model's reply (raw text, parsed by the env) and say what happened."""

    def state_key(self) -> Optional[Hashable]:
        """A key that is equal exactly when two moments of episodes of the same task are the same state
        (the maze: the agent's block), or None. The rollout records it before every turn; step-level
        advantages compare the actions taken from equal states across a group. Keep it small and picklable."""
        return None
