"""Tools an env offers the model: their JSON schemas (what the chat template shows the model) and running one
call with a timeout.

An env lists its tools in `Env.tools`: plain Python functions, whose type hints and Google-style docstring
become the schema (as TRL and `transformers.utils.get_json_schema` read them), or `Tool(schema, fn)` with an
OpenAI-style function schema written by hand. Every way a call can fail comes back as text the model reads
as the tool's result, with one of ERROR_KINDS; the episode goes on.
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

# How a tool call can fail. "malformed": the reply opened a call the parser could not read; "unknown_tool":
# no tool of that name; "bad_arguments": arguments that do not fit the schema or the function; "raised": the
# tool raised; "timeout": it ran past its timeout (its thread is left to finish on its own).
ERROR_KINDS = ("malformed", "unknown_tool", "bad_arguments", "raised", "timeout")

_JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "array": list,
               "object": dict, "null": type(None)}


@dataclass(frozen=True)
class Tool:
    """One tool: an OpenAI-style function schema ({"type": "function", "function": {name, description,
    parameters}}) and the function that runs it, called with the arguments as keywords."""
    schema: dict
    fn: Callable[..., Any]
    timeout_s: float = 10.0

    def __post_init__(self):
        fn = self.schema.get("function") if isinstance(self.schema, dict) else None
        if self.schema.get("type") != "function" or not isinstance(fn, dict) or not fn.get("name"):
            raise ValueError(f"Tool.schema must be an OpenAI function schema {{'type': 'function', 'function': "
                             f"{{'name': ..., 'parameters': {{...}}}}}}, got {self.schema!r}")
        if not callable(self.fn):
            raise ValueError(f"Tool.fn of {fn['name']!r} must be callable, got {self.fn!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"Tool.timeout_s of {fn['name']!r} must be > 0, got {self.timeout_s}")

    @property
    def name(self) -> str:
        return self.schema["function"]["name"]

    @property
    def parameters(self) -> dict:
        return self.schema["function"].get("parameters") or {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolCall:
    """A call as the model wrote it: a name and its arguments, or the parse error that stands for it."""
    name: str | None
    arguments: Any = None  # a dict when the call parsed
    id: str = ""
    error: str | None = None  # set when the reply opened a call that could not be read ("malformed")

    def as_message_call(self) -> dict:
        """The call as an assistant message's `tool_calls` entry (what chat templates and the OpenAI API read)."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ToolResult:
    content: str
    error: str | None = None  # one of ERROR_KINDS, None when the tool answered


@dataclass(frozen=True)
class ToolSet:
    """An env's tools by name, with the schemas the chat template renders."""
    tools: dict[str, Tool] = field(default_factory=dict)

    @property
    def schemas(self) -> list[dict]:
        return [t.schema for t in self.tools.values()]

    def run(self, call: ToolCall) -> ToolResult:
        """Run one call; every failure is a ToolResult whose content tells the model what went wrong."""
        if call.error is not None:
            return _error("malformed", f"could not read the tool call: {call.error}")
        tool = self.tools.get(call.name)
        if tool is None:
            return _error("unknown_tool", f"no tool named {call.name!r}; the tools are {sorted(self.tools)}")
        problem = check_arguments(tool.parameters, call.arguments)
        if problem:
            return _error("bad_arguments", f"{tool.name}: {problem}")
        return _run_with_timeout(tool, call.arguments)


def as_toolset(items) -> ToolSet:
    """An env's `tools` (functions or Tool) as a ToolSet; names must be unique."""
    tools: dict[str, Tool] = {}
    for item in items or ():
        tool = item if isinstance(item, Tool) else tool_from_function(item)
        if tool.name in tools:
            raise ValueError(f"two tools named {tool.name!r}: tool names must be unique")
        tools[tool.name] = tool
    return ToolSet(tools)


def tool_from_function(fn: Callable, timeout_s: float = 10.0) -> Tool:
    """A Tool whose schema comes from `fn`'s type hints and docstring (every argument needs a hint and an
    `Args:` line; transformers says which one is missing)."""
    if not callable(fn):
        raise ValueError(f"a tool must be a function or an envs.tools.Tool, got {fn!r}")
    from transformers.utils import get_json_schema

    schema = get_json_schema(fn)
    schema["function"].pop("return", None)
    return Tool(schema, fn, timeout_s)


def check_arguments(parameters: dict, arguments: Any) -> str | None:
    """What is wrong with `arguments` for a JSON-schema object `parameters` (None: nothing): missing required
    keys, unknown keys, and the JSON types of the top-level values."""
    if not isinstance(arguments, dict):
        return f"arguments must be a JSON object, got {json.dumps(arguments)}"
    props = parameters.get("properties", {})
    missing = [k for k in parameters.get("required", []) if k not in arguments]
    if missing:
        return f"missing required argument(s) {missing}"
    unknown = [k for k in arguments if k not in props]
    if unknown:
        return f"unknown argument(s) {unknown}; the arguments are {sorted(props)}"
    for key, value in arguments.items():
        wanted = props[key].get("type")
        types = [wanted] if isinstance(wanted, str) else list(wanted or [])
        ok = not types or any(_is_type(value, t) for t in types)
        if not ok:
            return f"argument {key!r} must be of type {wanted}, got {json.dumps(value)}"
    return None


def _is_type(value, json_type: str) -> bool:
    if json_type in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, _JSON_TYPES.get(json_type, object))


def _error(kind: str, message: str) -> ToolResult:
    return ToolResult(f"error ({kind}): {message}", kind)


def _run_with_timeout(tool: Tool, arguments: dict) -> ToolResult:
    # A daemon thread per call: a tool that hangs cannot be stopped from Python, so it is left behind rather
    # than holding the env's thread (and the episode) past its timeout.
    out: dict = {}

    def call():
        try:
            out["value"] = tool.fn(**arguments)
        except Exception as e:  # any exception of the user's tool is a result for the model
            out["error"] = e

    t = threading.Thread(target=call, name=f"tool-{tool.name}", daemon=True)
    t.start()
    t.join(tool.timeout_s)
    if t.is_alive():
        return _error("timeout", f"{tool.name} ran past its timeout of {tool.timeout_s:g} s")
    if "error" in out:
        e = out["error"]
        kind = "bad_arguments" if isinstance(e, TypeError) and _is_signature_error(e, tool) else "raised"
        return _error(kind, f"{tool.name} raised {type(e).__name__}: {e}")
    value = out.get("value")
    return ToolResult(value if isinstance(value, str) else json.dumps(value, default=str))


def _is_signature_error(e: TypeError, tool: Tool) -> bool:
    """A TypeError from calling the function with keywords it does not take (not one raised inside it)."""
    tb = e.__traceback__
    return tb is not None and tb.tb_next is None and getattr(tool.fn, "__name__", "") in str(e)
