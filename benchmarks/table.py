"""The docs' benchmark figures, generated from benchmarks/results/*.json (never typed by hand; full runs only).

    python -m benchmarks.table            # print the full table (Markdown)
    python -m benchmarks.table --write    # rewrite every generated block of the docs (DOCS)
    python -m benchmarks.table --check    # exit 1 if a generated block is not what the result files give

A generated block sits between `<!-- NAME -->` and `<!-- /NAME -->` in a doc; BLOCKS names each block and the
function that writes it. Only full runs feed the blocks, judged by each file's own "quick" field (False), never
by its name: a quick run, or a file that does not say, is left out. A result names its figures in "headline":
a list of rows {"figure", "value", "unit", "baseline", "baseline_name", "ratio", "ratio_range"} (all but figure
and value optional; ratio_range [min, max] over repeated runs, shown beside the ratio). A result without a
headline contributes one row per top-level number whose key starts with "ratio". The machine and date
columns come from the "machine" block benchmarks/_machine.py writes. A benchmark run on a real model writes
NAME-MODEL.json (benchmarks/_machine.py's result_stem): its rows follow NAME's, in every table that shows NAME.
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
DOCS = (README, ROOT / "docs" / "benchmarks.md", ROOT / "docs" / "pipeline.md", ROOT / "docs" / "algorithms.md")
FIX = "python -m benchmarks.table --write"
BEGIN, END = "<!-- bench-table -->", "<!-- /bench-table -->"
HEADER = ("| benchmark | figure | value | baseline | ratio | machine | date |\n"
          "|---|---|---|---|---|---|---|")
# Short names of the ISA flags that decide the kernels (the rest of the list is in the JSON).
ISA_SHORT = {"amx_bf16": "AMX-BF16", "avx512f": "AVX-512", "avx2": "AVX2"}
# The README's short table: each result's first headline rows, as many as given.
HEADLINE = {"rollout": 1, "update": 1, "sync": 1, "env_latency": 1, "vs_trl": 2}
# benchmarks/step.py's parts of a step, in the order a step runs them.
STEP_PARTS = {"rollout_engine_s": "rollout: vLLM generate", "rollout_env_and_bookkeeping_s": "rollout: env and worker",
              "rollout_ray_s": "rollout: Ray", "advantages_s": "advantages",
              "train_s": "update (logprobs, loss, AdamW)", "publish_s": "publish adapter",
              "hotload_s": "hot-load adapter", "sleep_wake_s": "vLLM sleep and wake", "checkpoint_s": "checkpoint",
              "rest_s": "rest"}
STARTUP_PARTS = {"ray_s": "start-up: Ray", "actors_s": "start-up: actors", "publish_and_hotload_first_s":
                 "start-up: first publish + hot-load", "eval_before_s": "start-up: eval before training",
                 "to_first_step_done_s": "first step done, after launch"}


def number(x) -> str:
    """Three significant digits, no exponent for everyday magnitudes: 1234.6 -> 1235, 0.012345 -> 0.0123,
    2.4e-06 -> 2.4e-06."""
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


def _cells(row: dict) -> tuple[str, str, str]:
    """A row's value, baseline and ratio cells."""
    unit = f" {row['unit']}" if row.get("unit") else ""
    baseline = ""
    if row.get("baseline") is not None:
        baseline = f"{number(row['baseline'])}{unit}"
        if row.get("baseline_name"):
            baseline += f" ({row['baseline_name']})"
    elif row.get("baseline_name"):
        baseline = row["baseline_name"]
    ratio = number(row["ratio"]) if row.get("ratio") is not None else ""
    if row.get("ratio_range"):
        ratio += " ({}-{})".format(*(number(x) for x in row["ratio_range"]))
    return f"{number(row['value'])}{unit}", baseline, ratio


def _line(cells) -> str:
    return "| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |"


def render_row(name: str, row: dict, machine: dict | None) -> str:
    date = (machine or {}).get("date", "?")[:10]
    return _line([name, row["figure"], *_cells(row), machine_cell(machine), date])


def full_run(result: dict) -> bool:
    """Whether a result says it is a full run: its own field, whatever its file is called."""
    return result.get("quick") is False


def load(results_dir: str | Path = RESULTS) -> dict[str, dict]:
    """Every full-run result by its file's stem, in the stems' order, so NAME-MODEL follows NAME (quick runs'
    smoke figures are left out)."""
    paths = sorted(Path(results_dir).glob("*.json"), key=lambda path: path.stem)
    results = {path.stem: json.loads(path.read_text()) for path in paths}
    return {name: result for name, result in results.items() if full_run(result)}


def with_models(results: dict[str, dict], name: str) -> dict[str, dict]:
    """Benchmark NAME's result and its runs on real models (NAME-MODEL), NAME first."""
    return {stem: result for stem, result in results.items() if stem == name or stem.startswith(f"{name}-")}


def table(results_dir: str | Path = RESULTS) -> str:
    lines = [HEADER]
    for name, result in load(results_dir).items():
        lines += [render_row(name, row, result.get("machine")) for row in rows(name, result)]
    return "\n".join(lines)


def headline(results_dir: str | Path = RESULTS) -> str:
    results = load(results_dir)
    lines = ["| benchmark | figure | grpo | baseline | ratio |", "|---|---|---|---|---|"]
    for name, count in HEADLINE.items():
        for stem, result in with_models(results, name).items():
            lines += [_line([stem, row["figure"], *_cells(row)]) for row in rows(stem, result)[:count]]
    return "\n".join(lines)


def vs_trl(results_dir: str | Path = RESULTS) -> str:
    """benchmarks/vs_trl.py per size and side: medians over the repeats, the median step's range beside it."""
    result = load(results_dir).get("vs_trl", {})
    lines = ["| model | side | runs | ready after launch | median step (range over runs) | median generate | "
             "completion tokens/s |", "|---|---|---|---|---|---|---|"]
    for size in result.get("sizes", {}).values():
        for side, s in size["sides"].items():
            low, high = s["step_s_range"]
            lines.append(_line([size["model_preset"], side, s["repeats"], f"{number(s['ready_s'])} s",
                                f"{number(s['step_s_median'])} s ({number(low)}-{number(high)})",
                                f"{number(s['generate_s_median'])} s", number(s["completion_tokens_per_s"])]))
    return "\n".join(lines)


def step(results_dir: str | Path = RESULTS) -> str:
    """benchmarks/step.py's breakdown: each part's median seconds (and share of the step) per workload."""
    workloads = load(results_dir).get("step", {}).get("workloads", {})
    names = list(workloads)
    lines = ["| part | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    over = ", ".join(w["median_over_steps"] for w in workloads.values())
    lines.append(_line([f"step (median over steps {over})", *(f"{number(w['step_s'])} s" for w in workloads.values())]))
    for key, label in STEP_PARTS.items():
        lines.append(_line([label, *(f"{number(w['parts_s'][key])} s ({w['parts_share'][key]:.0%})"
                                     for w in workloads.values())]))
    lines.append(_line(["generated tokens/s", *(number(w["generated_tokens_per_s"]) for w in workloads.values())]))
    for key, label in STARTUP_PARTS.items():
        lines.append(_line([label, *(f"{number(w['startup_s'][key])} s" for w in workloads.values())]))
    return "\n".join(lines)


def generate_vs_hf(results_dir: str | Path = RESULTS) -> str:
    """benchmarks/generate_vs_hf.py: median seconds of one batched generate per model size and path."""
    results = [r for name, r in load(results_dir).items() if name.startswith("generate_vs_hf")]
    paths = list(dict.fromkeys(p for r in results for p in r["seconds_median"]))
    lines = ["| model | requests x new tokens | " + " | ".join(paths) + " |", "|---|---|" + "---|" * len(paths)]
    for r in results:
        seconds = r["seconds_median"]
        lines.append(_line([r["preset"], f"{r['requests']} x {r['max_tokens']}",
                            *(f"{number(seconds[p])} s" if p in seconds else "" for p in paths)]))
    return "\n".join(lines)


def pipeline(results_dir: str | Path = RESULTS) -> str:
    """benchmarks/pipeline.py's figures, each a pair of runs side by side in one invocation."""
    result = load(results_dir).get("pipeline", {})
    lines = ["| what | grpo | baseline | ratio |", "|---|---|---|---|"]
    lines += [_line([row["figure"], *_cells(row)]) for row in rows("pipeline", result)]
    return "\n".join(lines)


def _accuracy_cell(side: dict | None) -> str:
    """A side's test accuracy before -> after and its own seconds at the end; or how far it got."""
    if not side or not side.get("complete"):
        from benchmarks.learning_vs_trl import steps_in_one_attempt

        done = steps_in_one_attempt(side or {})
        return f"did not finish (steps 1-{done} done)" if done else "did not finish"
    curve = side["curve"]
    return f"{curve[0]['test_accuracy']:.1%} -> {curve[-1]['test_accuracy']:.1%} in {number(curve[-1]['wall_s'])} s"


def learning(results_dir: str | Path = RESULTS) -> str:
    """benchmarks/learning_vs_trl.py: each seed's two curves' end points and ratio, then the medians."""
    result = load(results_dir).get("learning_vs_trl")
    if result is None:
        return "No full run of `python -m benchmarks.learning_vs_trl` is in the results yet."
    lines = ["| seed | machine | engine test (before -> after in its own s) | TRL test | engine reaches TRL's final "
             "at | ratio |", "|---|---|---|---|---|---|"]
    for run in result["runs"]:
        # A seed that was not kept ran on the machine of the run that wrote the result.
        here = result.get("machine") or {}
        where = result["seed_machines"].get(str(run["seed"])) or {
            "cpu": here.get("cpu", {}).get("model", "?"), "cores": here.get("cpu", {}).get("cores", "?"),
            "date": here.get("date", "?")}
        machine = f"{where.get('cpu', '?')}, {where.get('cores', '?')} cores, {where.get('date', '?')[:10]}"
        ratio = run.get("ratio") or {}
        reach = ratio.get("engine_reach_s")
        if not ratio:
            compared = ["not compared: a side did not finish", ""]
        else:
            compared = [f"{number(reach)} s" if reach is not None else ratio["reason"],
                        number(ratio["ratio"]) if ratio["ratio"] is not None else "none"]
        lines.append(_line([run["seed"], machine, _accuracy_cell(run.get("engine")), _accuracy_cell(run.get("trl")),
                            *compared]))
    median = result["time_to_trl_final_ratio"]
    over = ", ".join(map(str, result["seeds_finished"]))
    lines.append(_line([f"median over seeds {over}", "",
                        f"{result['test_before_engine']:.1%} -> {result['test_after_engine']:.1%}",
                        f"{result['test_before_trl']:.1%} -> {result['test_after_trl']:.1%}", "",
                        number(median) if median is not None else result["time_to_trl_final_ratio_reason"]]))
    return "\n".join(lines)


def _objective_cells(cell: dict, seeds: int) -> list[str]:
    if "refused" in cell:
        return ["refused by the config", "", ""]
    if not cell["complete"]:
        return [f"{len(cell['seeds'])} of {seeds} seeds run", "", ""]
    low, high = cell["test_after_range"]
    gain_low, gain_high = cell["gain_range"]
    return [f"{cell['test_after_mean']:.1%} ({low:.1%}-{high:.1%})",
            f"{cell['gain_mean']:+.1%} ({gain_low:+.1%} to {gain_high:+.1%})", number(cell["wall_s_mean"])]


def objectives(results_dir: str | Path = RESULTS) -> str:
    """benchmarks/objectives.py: per arm and task, the test accuracy after training and its gain over before
    (mean and range over the seeds), and the mean wall time; then the machines the runs had, and per task the
    arms that beat or trail their baseline at every seed (objectives.verdicts)."""
    result = load(results_dir).get("objectives")
    if result is None:
        return "No run of `python -m benchmarks.objectives` is in the results yet."
    tasks, seeds = list(result["tasks"]), len(result["seeds"])
    head = ["arm"] + [f"{t}: {what}" for t in tasks for what in ("test after", "gain", "wall s")]
    lines = [_line(head), "|" + "---|" * len(head)]
    for arm in result["arms"]:
        lines.append(_line([arm] + [c for t in tasks for c in _objective_cells(result["cells"][f"{t}/{arm}"], seeds)]))
    machines = sorted({f"{r['cpu']} ({r['date'][:10]})" for r in result["runs"] if "cpu" in r})
    lines += ["", f"Runs kept: {len(result['runs'])}, on {', '.join(machines) or 'no machine yet'}."]
    lines += [""] + [f"- {verdict}" for verdict in result["verdicts"].values()]
    return "\n".join(lines)


def learning_headline(results_dir: str | Path = RESULTS) -> str:
    """benchmarks/learning_vs_trl.py in one sentence: the medians over the seeds and the ratio."""
    result = load(results_dir).get("learning_vs_trl")
    if result is None:
        return "No full run of `python -m benchmarks.learning_vs_trl` is in the results yet."
    median = result["time_to_trl_final_ratio"]
    per_seed = ", ".join("not compared" if "ratio" not in run else
                         "never" if run["ratio"]["ratio"] is None else number(run["ratio"]["ratio"])
                         for run in result["runs"])
    if median is None:
        reach = f"no median time to TRL's final accuracy: {result['time_to_trl_final_ratio_reason']}"
    else:
        reach = f"the engine reached TRL's final accuracy in {number(median)} of TRL's wall time ({per_seed})"
    finished, runs = len(result["seeds_finished"]), len(result["runs"])
    seeds = f"{finished} seeds" if finished == runs else f"{finished} of {runs} seeds finished both sides"
    machines = result["seed_machines"].values()
    return (f"Against TRL's `GRPOTrainer`, same model, task and settings ({seeds}): test accuracy "
            f"{result['test_before_engine']:.1%} -> {result['test_after_engine']:.1%} (engine), "
            f"{result['test_before_trl']:.1%} -> {result['test_after_trl']:.1%} (TRL) after {result['steps']} steps; "
            f"{reach}. {', '.join(sorted({str(m['cores']) + '-core ' + m['cpu'] for m in machines}))}, "
            f"{', '.join(sorted({m['date'][:10] for m in machines}))}.")


# Each generated block: its marker name and what writes it.
BLOCKS = {"bench-table": table, "bench-headline": headline, "bench-step": step, "bench-vs-trl": vs_trl,
          "bench-generate": generate_vs_hf, "bench-pipeline": pipeline, "bench-learning": learning,
          "bench-objectives": objectives, "bench-learning-headline": learning_headline}


def regenerate(text: str, results_dir: str | Path = RESULTS, doc: str = "the doc") -> str:
    """The text with every generated block in it rewritten from the result files."""
    found = False
    for name, write in BLOCKS.items():
        begin, end = f"<!-- {name} -->", f"<!-- /{name} -->"
        start, stop = text.find(begin), text.find(end)
        if start < 0:
            continue
        if stop < start:
            raise SystemExit(f"{doc} has {begin} without {end} after it: add the closing marker")
        found = True
        text = text[:start + len(begin)] + "\n" + write(results_dir) + "\n" + text[stop:]
    if not found:
        raise SystemExit(f"{doc} has no generated-block markers ({', '.join(f'<!-- {n} -->' for n in BLOCKS)}): "
                         "add them where the table goes")
    return text


def stale(docs=DOCS, results_dir: str | Path = RESULTS) -> list[Path]:
    """The docs whose generated blocks differ from what the result files give."""
    return [Path(d) for d in docs if regenerate(Path(d).read_text(), results_dir, str(d)) != Path(d).read_text()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=str(RESULTS))
    ap.add_argument("--doc", "--readme", dest="docs", action="append",
                    help="a doc to write or check (repeatable; default: README.md and docs/benchmarks.md)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write", "--write-readme", dest="write", action="store_true")
    mode.add_argument("--check", action="store_true")
    a = ap.parse_args(argv)
    docs = [Path(d) for d in (a.docs or DOCS)]
    if a.check:
        old = stale(docs, a.results)
        for doc in old:
            print(f"{doc}'s generated benchmark blocks are not what {a.results} gives: run {FIX}", file=sys.stderr)
        return 1 if old else 0
    if a.write:
        for doc in docs:
            doc.write_text(regenerate(doc.read_text(), a.results, str(doc)))
        return 0
    print(table(a.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
