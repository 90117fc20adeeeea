"""The validation helpers every config class uses: a bad value fails at construction with a `ConfigError`
naming the field, the value and what is allowed, not steps later inside a tensor op.

They live here, at the bottom of the package graph, so that `rollout` validates its own config without
importing `grpo`; `grpo.algo.config` re-exports them for everything above.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Optional, Sequence


class ConfigError(ValueError):
    def __init__(self, config: Any, name: str, value: Any, allowed: str):
        # A class name stands in for the config when the error is about building one (an unknown field).
        owner = config if isinstance(config, str) else type(config).__name__
        self.field = f"{owner}.{name}"
        self.value = value
        self.allowed = allowed
        super().__init__(f"{self.field}={value!r} is not allowed: {allowed}")


def require(config: Any, name: str, ok: bool, allowed: str) -> None:
    """Raise a ConfigError for field `name` unless `ok`; for rules the other helpers do not cover."""
    if not ok:
        raise ConfigError(config, name, getattr(config, name), allowed)


def check_choice(config: Any, name: str, choices: Sequence[Any]) -> None:
    require(config, name, getattr(config, name) in choices, "one of " + ", ".join(map(repr, choices)))


def check_bool(config: Any, name: str) -> None:
    require(config, name, isinstance(getattr(config, name), bool), "True or False")


def check_number(
    config: Any,
    name: str,
    *,
    integer: bool = False,
    ge: Optional[float] = None,
    gt: Optional[float] = None,
    le: Optional[float] = None,
    lt: Optional[float] = None,
    optional: bool = False,
    hint: str = "",
) -> None:
    """A finite number (an integer if `integer`) within the given bounds; None too if `optional`."""
    value = getattr(config, name)
    bounds = [f"{op} {b}" for op, b in ((">=", ge), (">", gt), ("<=", le), ("<", lt)) if b is not None]
    allowed = ("an integer" if integer else "a number") + (" " + " and ".join(bounds) if bounds else "")
    allowed += ", or None" if optional else ""
    allowed += f" ({hint})" if hint else ""
    if value is None and optional:
        return
    # bool is an Integral in Python, and YAML reads "1e-6" as a string: neither is a number here.
    kind = numbers.Integral if integer else numbers.Real
    ok = isinstance(value, kind) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and all(
        (ge is None or value >= ge, gt is None or value > gt, le is None or value <= le, lt is None or value < lt)
    )
    require(config, name, ok, allowed)
