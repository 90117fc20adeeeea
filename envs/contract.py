"""What an environment may return, checked with messages that name the method, the field, the type and the
value; and `EnvError`, what an environment's failure becomes once the rollout gives up on it.

The rollout worker checks every `reset` and `step` result, and the trainer resets one training seed in the
driver before Ray and vLLM start, so a broken env fails in seconds with the rule it broke.
"""
from __future__ import annotations

import math
import numbers
import traceback
from typing import Any

from envs.base import Observation, StepResult


class ContractError(ValueError):
    """An environment returned something the Env contract does not allow."""


class EnvError(RuntimeError):
    """An environment raised or broke its contract: which env, on which seed, at which turn (0 is `reset`),
    in which method, what went wrong, and the environment's own traceback as text (it survives pickling,
    so it reaches the driver through Ray)."""

    def __init__(self, env: str, seed: int, turn: int, method: str, problem: str, traceback_text: str = "",
                 note: str = ""):
        self.env, self.seed, self.turn, self.method = env, seed, turn, method
        self.problem, self.traceback_text, self.note = problem, traceback_text, note
        text = f"environment {env!r}, seed {seed}, turn {turn} ({method}): {problem}"
        if note:
            text += f"\n{note}"
        if traceback_text:
            text += f"\nthe environment's traceback:\n{traceback_text.rstrip()}"
        super().__init__(text)

    def __reduce__(self):
        return type(self), (self.env, self.seed, self.turn, self.method, self.problem, self.traceback_text, self.note)


def check_observation(obs: Any, method: str = "reset") -> Observation:
    """`obs` if it is an envs.Observation with str text and a list of PIL images, else a ContractError.
    `method` is what produced it: "reset", or "step" (in its StepResult)."""
    name = "Observation" if method == "reset" else "StepResult.observation"
    if not isinstance(obs, Observation):
        hint = " (wrap the text: envs.Observation(text=...))" if isinstance(obs, str) else ""
        if method == "reset":
            raise ContractError(f"reset must return envs.Observation, got {_show(obs)}{hint}")
        raise ContractError(f"{method} returned {name} of type {_show(obs)}: it must be an envs.Observation{hint}")
    if not isinstance(obs.text, str):
        raise ContractError(f"{method} returned {name}.text of type {_show(obs.text)}: it must be a str")
    if not isinstance(obs.images, (list, tuple)):
        raise ContractError(f"{method} returned {name}.images of type {_show(obs.images)}: it must be a list of "
                            "PIL images (empty for none)")
    if obs.images:
        from PIL.Image import Image

        for i, img in enumerate(obs.images):
            if not isinstance(img, Image):
                raise ContractError(f"{method} returned {name}.images[{i}] of type {_show(img)}: each image must "
                                    "be a PIL.Image.Image (PIL.Image.fromarray converts an array)")
    return obs


def check_step_result(result: Any) -> StepResult:
    """`result` if it is an envs.StepResult with a finite number as reward, a bool as done, a dict (or None)
    as info and, unless done, an Observation; else a ContractError naming the field, type and value."""
    if not isinstance(result, StepResult):
        hint = (" (a gym-style (observation, reward, done, info) tuple? return "
                "envs.StepResult(observation, reward, done, info))") if isinstance(result, tuple) else ""
        raise ContractError(f"step must return envs.StepResult, got {_show(result)}{hint}")
    reward = result.reward
    if not isinstance(reward, numbers.Real):
        raise ContractError(f"step returned StepResult.reward of type {_show(reward)}: it must be a finite number")
    if not math.isfinite(reward):
        raise ContractError(f"step returned StepResult.reward={reward!r}: it must be a finite number (a non-finite "
                            "reward would turn the loss, the gradients and then the adapter into NaN)")
    if not _is_bool(result.done):
        raise ContractError(f"step returned StepResult.done of type {_show(result.done)}: it must be True or False")
    if result.info is not None and not isinstance(result.info, dict):
        raise ContractError(f"step returned StepResult.info of type {_show(result.info)}: it must be a dict")
    if not result.done:
        check_observation(result.observation, "step")
    return result


def check_env(name: str, options: dict, seed: int) -> tuple:
    """Build environment `name` and reset it to `seed`, as a rollout does: (env, observation), or an EnvError
    naming the env, the seed and what broke. A RegistryError (unknown name or option) passes unchanged."""
    from envs.registry import RegistryError, make

    method = "make"
    try:
        env = make(name, **options)
        method = "reset"
        return env, check_observation(env.reset(seed), "reset")
    except RegistryError:
        raise
    except Exception as e:
        raise env_error(e, name, seed, 0, method) from None


def env_error(exc: Exception, env: str, seed: int, turn: int, method: str) -> EnvError:
    """`exc`, raised by (or about) env `env` in `method`, as an EnvError: a broken rule is its own message,
    anything else keeps its traceback as text."""
    if isinstance(exc, ContractError):
        return EnvError(env, seed, turn, method, str(exc))
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return EnvError(env, seed, turn, method, f"{type(exc).__name__}: {exc}", text)


def _is_bool(value: Any) -> bool:
    # numpy's bool is no subclass of bool; envs that compute `done` with numpy return it.
    kind = type(value)
    return isinstance(value, bool) or (kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_"))


def _show(value: Any) -> str:
    text = " ".join(repr(value).split())  # one line, whatever the repr
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{type(value).__name__} {text}"
