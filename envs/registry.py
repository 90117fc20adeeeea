"""Environments by name, so a user's environment is one class plus one `register` call."""
from __future__ import annotations

import difflib
import importlib
import inspect
from typing import Any, Callable, Iterable, Union

from envs.base import Env

# A factory is anything that builds an Env from keyword options (usually the class itself), or a
# "module:attribute" string naming one, imported on first use so heavy modules load only when needed.
Factory = Union[Callable[..., Env], str]

_factories: dict[str, Factory] = {}


class RegistryError(ValueError):
    """An unknown environment name or option, or a conflicting registration."""


def register(name: str, factory: Factory, *, overwrite: bool = False) -> None:
    if not isinstance(name, str) or not name:
        raise RegistryError(f"environment name must be a non-empty string, got {name!r}")
    if isinstance(factory, str):
        if factory.count(":") != 1:
            raise RegistryError(f"factory string {factory!r} for {name!r} must look like 'package.module:Class'")
    elif not callable(factory):
        raise RegistryError(f"factory for {name!r} must be callable (e.g. the Env class), got {factory!r}")
    if name in _factories and _factories[name] is not factory and not overwrite:
        raise RegistryError(
            f"environment {name!r} is already registered ({_describe(_factories[name])}); "
            f"pass overwrite=True to replace it, or choose another name"
        )
    _factories[name] = factory


def registered() -> list[str]:
    return sorted(_factories)


def factories(names: Iterable[str] | None = None) -> dict[str, Factory]:
    """The registrations of `names` (default: all), to hand to another process (a Ray actor does not see this
    one's `register` calls). Hand over only what the other process needs: a class that another process cannot
    unpickle (defined in a module it cannot import) must not break a run that never uses it."""
    if names is None:
        return dict(_factories)
    return {n: _factories[n] for n in names if n in _factories}


def make(name: str, /, **options: Any) -> Env:
    """Build environment `name` with `options`; errors name the problem and list what is accepted."""
    if name not in _factories:
        close = difflib.get_close_matches(str(name), _factories, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise RegistryError(
            f"unknown environment {name!r}; registered: {', '.join(map(repr, registered())) or 'none'}.{hint} "
            f"Register your own with envs.register({name!r}, YourEnvClass)."
        )
    factory = _resolve(name)
    accepted = _accepted_options(factory)
    if accepted is not None:
        unknown = sorted(set(options) - set(accepted))
        if unknown:
            raise RegistryError(
                f"environment {name!r} does not accept option(s) {', '.join(map(repr, unknown))}; "
                f"accepted options: {', '.join(map(repr, accepted)) or 'none'}"
            )
    return factory(**options)


def _resolve(name: str) -> Callable[..., Env]:
    factory = _factories[name]
    if isinstance(factory, str):
        module_name, attr = factory.split(":")
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as e:
            raise RegistryError(f"environment {name!r}: cannot load factory {factory!r}: {e}") from e
        _factories[name] = factory
    return factory


def _accepted_options(factory: Callable[..., Env]) -> list[str] | None:
    """Keyword options the factory takes, or None when it takes any (**kwargs) or cannot be inspected."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _describe(factory: Factory) -> str:
    if isinstance(factory, str):
        return factory
    return f"{getattr(factory, '__module__', '?')}.{getattr(factory, '__qualname__', repr(factory))}"
