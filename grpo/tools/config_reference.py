"""Writes docs/config.md, the reference of every run config field, from the config classes themselves:

    python -m grpo.tools.config_reference --write docs/config.md

Each field's line is its comment in the source (on the field's line, or the comment lines just above it), so
the source stays the one place a field is described; tests/test_config.py fails when docs/config.md is stale.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import json
import sys
import textwrap
import tokenize
import typing
from pathlib import Path

from grpo.config import RunConfig

COMMAND = "python -m grpo.tools.config_reference --write docs/config.md"

HEADER = f"""# Run configuration reference

Generated from the config classes by `{COMMAND}`; edit the comments in the source, not this file.

A run is one YAML file of these fields (`python -m grpo.train CONFIG.yaml`); any field can be overridden on
the command line as `--section.field VALUE` (`--algo.clip_high 0.28`, `--steps 10`). Short section names:
`algo` for `algorithm`, `opt` for `train`. A bad value fails before Ray or vLLM start, with an error naming
the field and what is allowed. Defaults are written as YAML (JSON) values.
"""


def field_comments(cls) -> dict[str, str]:
    """Each dataclass field of `cls` (its own, not inherited) and its comment, joined into one line."""
    source = textwrap.dedent(inspect.getsource(cls))
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    lines = source.splitlines()
    body = ast.parse(source).body[0].body
    out = {}
    for node in body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above, line = [], node.lineno - 1
        while line >= 1 and lines[line - 1].strip().startswith("#"):
            above.insert(0, comments[line])
            line -= 1
        trailing = [comments[n] for n in range(node.lineno, node.end_lineno + 1) if n in comments]
        out[node.target.id] = " ".join(above + trailing)
    return out


def annotations(cls) -> dict[str, str]:
    """Each field's annotation as written in the source, through the class's dataclass bases."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        out.update({k: str(v) for k, v in vars(klass).get("__annotations__", {}).items()})
    return out


def describe(cls) -> dict[str, str]:
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            out.update(field_comments(klass))
    return out


def section_class(cls, name: str):
    """The config class field `name` of `cls` holds (an Optional one too), or None for a plain value."""
    hint = typing.get_type_hints(cls)[name]
    inner = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    return inner[0] if len(inner) == 1 and dataclasses.is_dataclass(inner[0]) else None


def sections(cls=RunConfig, where: str = "") -> list[tuple[str, type]]:
    """(YAML path, class) of `cls` and every config class nested in it, in field order."""
    found = [(where, cls)]
    for f in dataclasses.fields(cls):
        inner = section_class(cls, f.name)
        if inner is not None:
            found += sections(inner, f"{where}.{f.name}".lstrip("."))
    return found


def default_text(f: dataclasses.Field) -> str:
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
        return "required"
    value = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    if dataclasses.is_dataclass(value):
        return "see below"
    return json.dumps(list(value) if isinstance(value, tuple) else value)


def notes(where: str, cls) -> dict[str, str]:
    """Each field's line: its comment, or for a section a pointer to the section's table."""
    found = describe(cls)
    for f in dataclasses.fields(cls):
        if not found.get(f.name) and section_class(cls, f.name) is not None:
            found[f.name] = f"the `{where}.{f.name}`".replace("`.", "`") + " section below"
    return found


def missing_descriptions() -> list[str]:
    """Fields with no comment in the source: `section.field` of each."""
    return [f"{where}.{f.name}".lstrip(".") for where, cls in sections() for f in dataclasses.fields(cls)
            if not notes(where, cls).get(f.name)]


def render() -> str:
    parts = [HEADER]
    for where, cls in sections():
        title = f"`{where}`" if where else "top level"
        parts.append(f"\n## {title} ({cls.__name__})\n\n")
        doc = inspect.getdoc(cls) or ""
        if doc and not doc.startswith(f"{cls.__name__}("):  # dataclasses make a signature the docstring
            parts.append(" ".join(doc.split("\n\n")[0].split()) + "\n\n")
        lines, types = notes(where, cls), annotations(cls)
        rows = ["| field | type | default | meaning |", "|---|---|---|---|"]
        for f in dataclasses.fields(cls):
            cells = (f"`{f.name}`", f"`{types[f.name]}`", f"`{default_text(f)}`", lines[f.name])
            rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        parts.append("\n".join(rows) + "\n")
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", metavar="PATH", help="write the reference here (default: print it)")
    args = ap.parse_args(argv)
    text = render()
    if args.write:
        Path(args.write).write_text(text)
        print(f"wrote {args.write}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
