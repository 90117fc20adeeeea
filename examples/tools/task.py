"""The bundled tool task: what color is an object the model cannot see? A `look` tool can.

The question names an object (drawn by the seed) and the four colors it may have; only the tool knows which.
A model that calls `look` and answers with what it returned always succeeds; one that guesses, about one
time in four. The native form gives the env the tool (`LookEnv.tools`); the OpenAI-client agent
(examples/tools/agent.py) runs the same tool itself.
"""
from __future__ import annotations

import random
import re

from envs.base import Env, Observation, StepResult

COLORS = ("red", "blue", "white", "gray")
OBJECTS = ("ball", "box", "cup", "hat", "door", "car", "kite", "lamp")


def question(seed: int) -> tuple[str, str]:
    """The task of `seed`: the question's text and the object's color."""
    rng = random.Random(seed)
    obj, color = rng.choice(OBJECTS), rng.choice(COLORS)
    return f"What color is the {obj}? Answer red, blue, white or gray.", color


def answer_of(text: str) -> str | None:
    """The color a final answer names (the first one), or None."""
    found = re.findall(r"\b(" + "|".join(COLORS) + r")\b", text)
    return found[0] if found else None


class LookEnv(Env):
    keep_images = False

    def reset(self, seed: int) -> Observation:
        text, self.color = question(seed)
        self.tools = (self.look,)  # a tool bound to this episode: it sees the object's color
        return Observation(text)

    def look(self) -> str:
        """Look at the object the question asks about and say its color."""
        return self.color

    def step(self, action_text: str) -> StepResult:
        got = answer_of(action_text)
        ok = got == self.color
        return StepResult(Observation("Episode over."), float(ok), True, {"success": ok, "parse_error": got is None})
