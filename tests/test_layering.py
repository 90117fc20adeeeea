"""The layout's rules, held: one role per folder, imports that point one way, no circle, small files.

Read from the source (every import, those inside functions too), and checked again on fresh interpreters
for what importing a package really loads. The rules are docs/design.md's "Layout and import rules".
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ("grpo", "rollout", "sync", "envs")
MAX_LINES = 450

# Which of our modules each part may import (a prefix matches the package and everything under it).
ALLOWED = {
    "envs": ("envs",),
    "sync": ("sync",),
    "rollout": ("rollout", "envs", "sync"),
    "grpo.algo": ("grpo.algo", "rollout.checks"),
    "grpo.learner": ("grpo.learner", "grpo.algo", "rollout", "sync", "envs.base"),
    "grpo.report": ("grpo.report", "rollout", "envs", "sync.atomic"),
    "grpo.config": ("grpo.config", "grpo.algo", "grpo.learner.config", "grpo.learner.lora", "grpo.driver.fault",
                    "rollout", "envs"),
}
# Third-party packages a part must not import at all.
FORBIDDEN = {
    "grpo.algo": ("ray", "vllm", "safetensors", "peft", "transformers", "os", "io", "pathlib", "shutil", "json",
                  "tempfile"),
    "grpo.learner": ("vllm",),
    "sync": ("vllm", "ray"),
    "envs": ("vllm", "ray", "torch"),
    "rollout": ("ray",),
}


def _modules() -> dict[str, Path]:
    found = {}
    for package in LIBRARY:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Every module `name` imports, resolved to the longest known module name for our own."""
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([base] if base else []))
            # `from grpo.learner import checkpoint` imports the module grpo.learner.checkpoint.
            for alias in node.names:
                out.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return out


IMPORTS = {name: _imports(name, path) for name, path in MODULES.items()}


def _part(name: str, table: dict) -> str | None:
    matches = [p for p in table if name == p or name.startswith(p + ".")]
    return max(matches, key=len) if matches else None


def _ours(module: str) -> bool:
    return module.split(".")[0] in LIBRARY


def test_each_part_imports_only_what_is_below_it():
    wrong = []
    for name, imported in IMPORTS.items():
        part = _part(name, ALLOWED)
        if part is None:
            continue
        for module in sorted(imported):
            if _ours(module) and not any(module == a or module.startswith(a + ".") for a in ALLOWED[part]):
                wrong.append(f"{name} imports {module} ({part} may import {', '.join(ALLOWED[part])})")
    assert not wrong, "\n".join(wrong)


def test_no_part_imports_a_package_it_must_not():
    wrong = []
    for name, imported in IMPORTS.items():
        part = _part(name, FORBIDDEN)
        if part is None:
            continue
        for module in sorted(imported):
            if module.split(".")[0] in FORBIDDEN[part]:
                wrong.append(f"{name} imports {module}")
    assert not wrong, "\n".join(wrong)


def test_the_algorithm_opens_no_file():
    calls = []
    for name, path in MODULES.items():
        if _part(name, {"grpo.algo": 1}):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) in (
                        "open", "save", "load", "read_text", "write_text"):
                    calls.append(f"{name}:{node.lineno}")
    assert not calls, calls


def test_no_circle_between_library_modules():
    graph = {n: {m for m in imps if m in MODULES and m != n} for n, imps in IMPORTS.items()}
    # A package's __init__ that re-exports its own modules is not a circle with them.
    for n in graph:
        graph[n] = {m for m in graph[n] if not n.startswith(m + ".")}
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in graph:
        if v not in index:
            visit(v)
    assert not circles, circles


def test_no_module_is_named_as_a_standard_library_module():
    # A script run by its path (grpo/driver/reaper.py) has its folder first on sys.path: a module there named
    # as one of the standard library's (select.py, once) is what the library's own imports then load.
    shadows = sorted(str(p.relative_to(ROOT)) for folder in (*LIBRARY, "examples", "benchmarks", "tests")
                     for p in (ROOT / folder).rglob("*.py") if p.stem in sys.stdlib_module_names)
    assert not shadows, f"rename these, they shadow the standard library's modules: {shadows}"


def test_no_library_file_is_over_the_limit():
    long = {str(p.relative_to(ROOT)): n for p in MODULES.values() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines: {long}"


# What importing each package loads, on a fresh interpreter (a module-level import hidden behind another).
FRESH = {
    "grpo.algo.advantages": ("ray", "vllm"),
    "grpo.algo.loss": ("ray", "vllm"),
    "sync": ("vllm", "ray"),
    "envs": ("vllm", "ray", "torch", "grpo", "rollout", "sync"),
    "rollout.worker": ("grpo", "ray"),
    "grpo": ("ray", "vllm"),
}


@pytest.mark.parametrize("module", sorted(FRESH))
def test_a_fresh_interpreter_loads_nothing_forbidden(module):
    code = (f"import json, sys; import {module}; "
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert not loaded & set(FRESH[module]), f"import {module} loads {sorted(loaded & set(FRESH[module]))}"
