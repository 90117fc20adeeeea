"""The README's results table, generated from benchmarks/results/*.json (never typed by hand; *-quick.json skipped).

    python benchmarks/table.py                   # print the table (Markdown)
    python benchmarks/table.py --write-readme    # replace the table between the markers in README.md
    python benchmarks/table.py --check           # exit 1 if README.md's table is not the generated one

A result names its figures in "headline": a list of rows {"figure", "value", "unit", "baseline",
"baseline_name", "ratio"} (baseline, baseline_name and ratio optional). A result without a headline
contributes one row per top-level number whose key starts with "ratio". The machine and date columns come
from the "machine" block benchmarks/_machine.py writes.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"
BEGIN, END = "<!-- bench-table -->", "<!-- /bench-table -->"
HEADER = ("| benchmark | figure | value | baseline | ratio | machine | date |\n"
          "|---|---|---|---|---|---|---|")
# Short names of the ISA flags that decide the kernels (the rest of the list is in the JSON).
ISA_SHORT = {"amx_bf16": "AMX-BF16", "avx512f": "AVX-512", "avx2": "AVX2"}


def number(x) -> str:
    """Three significant digits, no exponent for everyday magnitudes: 1234.6 -> 1235, 0.012345 -> 0.0123, 2.4e-06 -> 2.4e-06."""
    if isinstance(x, (bool, int)) or not isinstance(x, float):
        return str(x)
    if x == 0 or not math.isfinite(x):
        return str(x)
    if abs(x) < 1e-3:
        return f"{x:.1e}"
    if abs(x) >= 100:
        return f"{x:,.0f}".replace(",", "")
    digits = 2 - int(math.floor(math.log10(abs(x))))
    return f"{round(x, digits):.{max(digits, 0)}f}"


def machine_cell(machine: dict | None) -> str:
    if not machine:
        return "?"
    gpu = machine.get("gpu")
    if gpu:
        return f"{gpu['name']}"
    cpu = machine.get("cpu")
    # A result that wrote its own machine block may name the CPU as a plain string.
    cpu = cpu if isinstance(cpu, dict) else {"model": cpu or "?", "cores": machine.get("cpus", "?")}
    isa = next((ISA_SHORT[f] for f in ISA_SHORT if f in cpu.get("isa", [])), "")
    load = machine.get("load_average") or ["?"]
    load = load if isinstance(load, list) else [load]
    parts = [cpu.get("model", "?")] + ([isa] if isa else []) + [f"{cpu.get('cores', '?')} cores", f"load {load[0]}"]
    return ", ".join(str(p) for p in parts)


def rows(name: str, result: dict) -> list[dict]:
    if result.get("headline"):
        return list(result["headline"])
    return [{"figure": key, "value": value} for key, value in result.items()
            if key.startswith("ratio") and isinstance(value, (int, float)) and not isinstance(value, bool)]


def render_row(name: str, row: dict, machine: dict | None) -> str:
    unit = f" {row['unit']}" if row.get("unit") else ""
    value = f"{number(row['value'])}{unit}"
    baseline = ""
    if row.get("baseline") is not None:
        baseline = f"{number(row['baseline'])}{unit}"
        if row.get("baseline_name"):
            baseline += f" ({row['baseline_name']})"
    elif row.get("baseline_name"):
        baseline = row["baseline_name"]
    ratio = number(row["ratio"]) if row.get("ratio") is not None else ""
    date = (machine or {}).get("date", "?")[:10]
    cells = [name, row["figure"], value, baseline, ratio, machine_cell(machine), date]
    return "| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |"


def table(results_dir: str | Path = RESULTS) -> str:
    lines = [HEADER]
    for path in sorted(Path(results_dir).glob("*.json")):
        if path.stem.endswith("-quick"):
            continue  # a quick mode's smoke figures; the table shows the full runs
        result = json.loads(path.read_text())
        for row in rows(path.stem, result):
            lines.append(render_row(path.stem, row, result.get("machine")))
    return "\n".join(lines)


def replace_between_markers(text: str, body: str) -> str:
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"README has no {BEGIN} ... {END} markers: add them where the table goes")
    return text[:start + len(BEGIN)] + "\n" + body + "\n" + text[end:]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=str(RESULTS))
    ap.add_argument("--readme", default=str(README))
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write-readme", action="store_true")
    mode.add_argument("--check", action="store_true")
    a = ap.parse_args(argv)
    body = table(a.results)
    if not (a.write_readme or a.check):
        print(body)
        return 0
    readme = Path(a.readme)
    old = readme.read_text()
    new = replace_between_markers(old, body)
    if a.check:
        if new != old:
            print(f"{readme}'s benchmark table is not the one {a.results} gives: run "
                  f"python benchmarks/table.py --write-readme", file=sys.stderr)
            return 1
        return 0
    readme.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
