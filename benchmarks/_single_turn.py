"""The single-turn text task both sides of the step benchmarks run: one prompt, one reply, one reward.

Pure Python with no dependency beyond envs/, so TRL's separate virtual environment imports it too and both
sides score the very same reward function on the very same prompts.
"""
from __future__ import annotations

from envs.base import Env, Observation, StepResult

PROMPTS = (
    "Count from 1 to 9 with digits.",
    "Question: what is 12 + 30? Answer with digits.",
    "Write the numbers 0 1 2 3 4 5 6 7 8 9.",
    "Turns left: 1 2 3 4 5 6 7 8 9 10. Continue.",
    "Reply with as many digits as you can.",
    "The answer is a number: 42. Write more numbers.",
    "Think step by step and answer with digits only.",
    "0 1 2 3 4 5 6 7 8 9 + - * / = and then?",
)


def digit_reward(text: str) -> float:
    """The share of the reply's non-space characters that are digits: a dense signal a tiny model can climb."""
    chars = [c for c in text if not c.isspace()]
    return sum(c.isdigit() for c in chars) / len(chars) if chars else 0.0


class DigitsEnv(Env):
    """Task `seed` shows PROMPTS[seed % 8]; the reply ends the episode with its digit_reward."""

    keep_images = False

    def reset(self, seed: int) -> Observation:
        self.prompt = PROMPTS[seed % len(PROMPTS)]
        return Observation(text=self.prompt)

    def step(self, action_text: str) -> StepResult:
        reward = digit_reward(action_text)
        return StepResult(Observation(text=""), reward, True, {"success": reward >= 0.5})
