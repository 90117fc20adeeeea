"""The tool calls in a model's reply, read in its family's own format.

The format follows from the chat template, which writes the same format when it renders an assistant
message's `tool_calls` (what the model was trained to produce):

- "hermes": Qwen2.5, Qwen3, Hermes: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, one block
  per call.
- "llama3_json": Llama 3.1 / 3.2 / 3.3: the whole reply is `{"name": ..., "parameters": {...}}` (an optional
  `<|python_tag|>` before it; several calls separated by `;`).
- "mistral": Mistral v0.3 and later: `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`.

A reply that opens a call the parser cannot read gives one ToolCall with `error` set (a "malformed" call),
so the model learns from the error message rather than the reply passing as a final answer.
"""
from __future__ import annotations

import json
import re

from envs.tools import ToolCall

FORMATS = ("hermes", "llama3_json", "mistral")

_HERMES = re.compile(r"<tool_call>(.*?)(</tool_call>|\Z)", re.DOTALL)


def detect_format(chat_template: str | None) -> str | None:
    """The tool-call format a chat template writes, or None when it renders no tool calls."""
    t = chat_template or ""
    if "<tool_call>" in t:
        return "hermes"
    if "[TOOL_CALLS]" in t:
        return "mistral"
    if "ipython" in t and '"parameters"' in t:
        return "llama3_json"
    return None


def call_id(n: int) -> str:
    """The id of an episode's n-th call: nine letters and digits, the form Mistral's template demands."""
    return f"call{n:05d}"


def parse(fmt: str, text: str, first_id: int = 0) -> tuple[str, list[ToolCall]]:
    """(the reply's text outside its calls, the calls); ids count on from `first_id`."""
    if fmt == "hermes":
        content, bodies = _HERMES.split(text, 1)[0], []
        for m in _HERMES.finditer(text):
            bodies.append(m.group(1) if m.group(2) else None)  # None: the block was never closed
        found = [_read_call(b, "arguments") if b is not None else "the <tool_call> block has no </tool_call>"
                 for b in bodies]
    elif fmt == "mistral":
        if "[TOOL_CALLS]" not in text:
            return text, []
        content, body = text.split("[TOOL_CALLS]", 1)
        found = _read_list(body)
    elif fmt == "llama3_json":
        body = text.strip()
        body = body[len("<|python_tag|>"):].lstrip() if body.startswith("<|python_tag|>") else body
        if not body.startswith("{"):
            return text, []
        content = ""
        found = [_read_call(part, "parameters") for part in _split_semicolons(body)]
    else:
        raise ValueError(f"unknown tool-call format {fmt!r}: use one of {FORMATS}")
    calls = []
    for i, f in enumerate(found):
        cid = call_id(first_id + i)
        calls.append(ToolCall(None, None, cid, f) if isinstance(f, str) else ToolCall(f[0], f[1], cid))
    return content.strip(), calls


def _read_call(body: str, args_key: str):
    """(name, arguments) from one call's JSON, or a string saying why it cannot be read."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return f"invalid JSON ({e.msg} at character {e.pos})"
    return _name_args(obj, args_key)


def _name_args(obj, args_key: str):
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return 'a call must be a JSON object with a string "name"'
    args = obj.get(args_key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(args, str):  # some models write the arguments as a JSON string, as the OpenAI API carries them
        try:
            args = json.loads(args)
        except json.JSONDecodeError as e:
            return f'"{args_key}" is a string that is not JSON ({e.msg})'
    return obj["name"], args


def _read_list(body: str) -> list:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return [f"invalid JSON after [TOOL_CALLS] ({e.msg} at character {e.pos})"]
    items = obj if isinstance(obj, list) else [obj]
    return [_name_args(o, "arguments") for o in items] or ["[TOOL_CALLS] holds an empty list"]


def _split_semicolons(body: str) -> list[str]:
    """`{...}; {...}` into its objects, ignoring semicolons inside JSON strings."""
    parts, depth, in_str, esc, start = [], 0, False, False, 0
    for i, ch in enumerate(body):
        if in_str:
            esc, in_str = (False, in_str) if esc else (ch == "\\", ch != '"')
        elif ch == '"':
            in_str = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        elif ch == ";" and depth == 0:
            parts.append(body[start:i])
            start = i + 1
    parts.append(body[start:])
    return [p.strip() for p in parts if p.strip()]
