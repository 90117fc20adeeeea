"""Evaluate an adapter: `python -m grpo.driver.eval RUN_OR_ADAPTER [--seeds 0-63] [--samples K] [--base] ...`.

    python -m grpo.driver.eval runs/maze                    # the adapter the run ended with, on its eval seeds
    python -m grpo.driver.eval runs/maze --base             # the starting point, on the same seeds
    python -m grpo.driver.eval runs/maze --seeds 10000-10063 --samples 8   # pass@8 at the run's temperature
    python -m grpo.driver.eval ADAPTER_DIR --model MODEL --env maze --options '{"size": 9}'

A run folder brings everything from its config.yaml (env and options, rollout settings, engine settings,
seed), so the numbers equal the trainer's own evals on the same seeds: the same in-process rollout worker
with greedy decoding, one episode per seed. Prints a short table, then one JSON object as the last line;
writes every episode, decoded, to a JSONL file (RUN/eval/<adapter>[-seeds..][-samples..].jsonl, or --out).
Extra arguments override the config as for grpo.train (`--rollout.max_tokens_per_turn 16`).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path


def eval_summary(trajs, stats, samples: int = 1) -> dict:
    """The figures of an eval (the trainer's evals and this command's): success over episodes, and with
    `samples` episodes a seed, pass@k (the share of seeds with at least one success)."""
    from grpo.report.samples import reward_components

    out = {"success_rate": stats.success_rate, "mean_reward": stats.mean_reward, "mean_turns": stats.mean_turns,
           "stop_reasons": dict(stats.stop_reasons), "episodes": stats.episodes,
           "solved_seeds": sorted({t.seed for t in trajs if t.success})}
    rewards = reward_components(trajs)
    if rewards:
        out["rewards"] = rewards
    if samples > 1:
        seeds = {t.seed for t in trajs}
        out["samples"] = samples
        out[f"pass_at_{samples}"] = len(out["solved_seeds"]) / max(len(seeds), 1)
    return out


def resolve(target: str, model: str | None = None, adapter: str | None = None, base: bool = False,
            overrides: list[str] = ()) -> tuple:
    """(RunConfig, adapter folder or None, run folder or None) for a run folder or an adapter folder."""
    from grpo.config import RunConfig, apply_overrides

    path = Path(target)
    run_dir = path if (path / "config.yaml").is_file() else None
    if run_dir is not None:
        cfg = RunConfig.from_yaml(run_dir / "config.yaml", (["--model", model] if model else []) + list(overrides))
    elif (path / "adapter_config.json").is_file():
        # An adapter alone: its rank sizes the engine's LoRA slots; the model is the one it was trained on.
        info = json.loads((path / "adapter_config.json").read_text())
        data = {"model": model or info.get("base_model_name_or_path") or "",
                "lora": {"rank": int(info.get("r", 8)), "alpha": float(info.get("lora_alpha", 16.0))}}
        apply_overrides(data, list(overrides))
        cfg = RunConfig.from_dict(data)
        adapter = adapter or str(path)
    else:
        raise FileNotFoundError(f"{target!r} is neither a run folder (config.yaml) nor an adapter folder "
                                "(adapter_config.json): give the output_dir of a run, or a LoRA adapter folder")
    if base:
        # The starting point: the adapter the run began from, or the model alone.
        return cfg, cfg.adapter, run_dir
    if adapter is None:
        adapter = _final_adapter(run_dir)
    return cfg, adapter, run_dir


def _final_adapter(run_dir: Path) -> str:
    summary = run_dir / "summary.json"
    if summary.is_file():
        # The version the run ended with, in this folder's store (the folder may have moved since).
        version = json.loads(summary.read_text())["adapter_version"]
        return str(run_dir / "store" / "adapters" / f"v{version:06d}")
    from sync import AdapterStore

    latest = AdapterStore(str(run_dir / "store")).latest_verified()
    if latest is None:
        raise FileNotFoundError(f"{run_dir} has no summary.json and no published adapter: the run never finished "
                                "a step; evaluate the starting point with --base")
    print(f"[grpo.driver.eval] {run_dir} has no summary.json (unfinished run): its latest adapter, v{latest.version:06d}",
          file=sys.stderr)
    return latest.path


def evaluate(cfg, adapter: str | None, seeds: list[int], samples: int = 1, home: str | Path | None = None,
             out: str | Path | None = None) -> dict:
    """Run the eval in this process (no Ray): the worker and engine the trainer would start for `cfg`.
    `home` (the run folder) places the caches as the trainer does: runtime.shared_cache_dir."""
    from rollout import runtime

    home = Path(home) if home is not None else Path.cwd()
    runtime.configure(home, runtime.shared_cache_dir(home))
    from grpo.report.samples import SampleWriter
    from rollout.worker import RolloutWorker, Task

    worker = RolloutWorker(cfg.engine_config())
    try:
        if adapter is not None:
            worker.engine.load_adapter(_version_of(adapter), adapter)
        tasks = [Task(cfg.env.name, s, cfg.env.options) for s in seeds]
        trajs, stats = _rollout_like_the_pool(worker, tasks, samples, cfg)
    finally:
        worker.shutdown()
    result = eval_summary(trajs, stats, samples)
    if out is not None:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("")
        SampleWriter(out, cfg.model).write(trajs)
        result["episodes_file"] = str(out)
    result["adapter"] = adapter
    return result


def _rollout_like_the_pool(worker, tasks, samples: int, cfg):
    """The trainer's RolloutPool hands each of its workers a contiguous slice of the seeds, one rollout call
    each: the same slices, one after another here, so every engine call batches the same episodes."""
    from grpo.driver.rollout_pool import merge_stats

    n = cfg.cluster.rollout_workers
    bounds = [len(tasks) * k // n for k in range(n + 1)]
    trajs, parts = [], []
    for k in range(n):
        part = tasks[bounds[k]:bounds[k + 1]]
        if part:
            chunk, stats = worker.rollout(part, samples, cfg.rollout.rollout_config(), greedy=samples == 1)
            trajs.extend(chunk)
            parts.append(stats)
    return trajs, merge_stats(parts)


def _version_of(adapter: str) -> int:
    # A store folder is named after its version (v000003); any other adapter is served as version 1.
    match = re.fullmatch(r"v(\d+)", Path(adapter).name)
    return int(match.group(1)) if match else 1


def rows(result: dict, cfg, seeds: list[int]) -> list[tuple[str, str]]:
    k = result.get("samples", 1)
    decoding = "greedy" if k == 1 else f"{k} samples a seed, temperature {cfg.rollout.temperature}"
    out = [("model", cfg.model), ("adapter", result["adapter"] or "none (the base model)"),
           ("env", f"{cfg.env.name} {json.dumps(cfg.env.options, sort_keys=True)}"),
           ("seeds", f"{len(seeds)} ({seeds[0]}-{seeds[-1]})" if seeds else "0"), ("decoding", decoding),
           ("success rate", f"{result['success_rate']:.1%} of {result['episodes']} episodes")]
    if k > 1:
        out.append((f"pass@{k}", f"{result[f'pass_at_{k}']:.1%}"))
    out += [("mean reward", f"{result['mean_reward']:.3f}"), ("mean turns", f"{result['mean_turns']:.2f}"),
            ("stop reasons", ", ".join(f"{r} {c}" for r, c in sorted(result["stop_reasons"].items())))]
    out += [(f"reward/{name}", f"{v:.3f}") for name, v in result.get("rewards", {}).items()]
    if result.get("episodes_file"):
        out.append(("episodes (decoded)", result["episodes_file"]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m grpo.driver.eval", description=__doc__.splitlines()[0],
                                 epilog="config overrides: --rollout.max_tokens_per_turn 16 --env.options '{size: 7}'")
    ap.add_argument("target", help="a run folder (its config.yaml) or a LoRA adapter folder")
    ap.add_argument("--seeds", help="e.g. 0-63 or 0-3,10 (default: the run's eval.seeds)")
    ap.add_argument("--samples", type=int, default=1, help="episodes a seed: 1 is greedy; k > 1 samples at the "
                    "run's temperature and reports pass@k")
    ap.add_argument("--base", action="store_true", help="score the starting point: the model (or the adapter "
                    "the run began from) without the trained adapter")
    ap.add_argument("--adapter", help="this adapter folder instead of the run's final one")
    ap.add_argument("--model", help="the model folder (default: the run's, or the adapter's base model)")
    ap.add_argument("--env", help="an env name (default: the run's)")
    ap.add_argument("--options", help="the env's options as JSON (default: the run's)")
    ap.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                    help="import a module first (one that registers your env with envs.register)")
    ap.add_argument("--out", help="the JSONL file for the decoded episodes (default: RUN/eval/<adapter>.jsonl)")
    args, overrides = ap.parse_known_args(argv)

    import importlib

    from grpo.algo.config import ConfigError
    from grpo.config import parse_seeds

    if args.samples < 1:
        ap.error(f"--samples {args.samples}: give 1 (greedy) or more episodes a seed")
    if args.base and args.adapter:
        ap.error("--base and --adapter exclude each other: --base scores the starting point")
    for module in args.imports:
        importlib.import_module(module)
    if args.env:
        # Another env's options would not fit it: none unless --options gives them.
        overrides += ["--env.name", args.env] + ([] if args.options else ["--env.options", "{}"])
    if args.options:
        overrides += ["--env.options", args.options]
    try:
        cfg, adapter, run_dir = resolve(args.target, args.model, args.adapter, args.base, overrides)
        seeds = parse_seeds(args.seeds) if args.seeds else cfg.eval_seeds
    except (ConfigError, ValueError, FileNotFoundError) as e:
        print(f"grpo.driver.eval: {e}", file=sys.stderr)
        return 2
    tag = "base" if adapter is None else Path(adapter).name
    # One file per question asked: another seed set or sampling does not overwrite the greedy eval's file.
    if args.seeds:
        tag += f"-seeds{args.seeds.replace(',', '_')}"
    if args.samples > 1:
        tag += f"-samples{args.samples}"
    home = run_dir if run_dir is not None else Path.cwd()
    out = Path(args.out) if args.out else home / "eval" / f"{tag}.jsonl"
    result = evaluate(cfg, adapter, seeds, args.samples, home, out)
    from grpo.report.table import table

    print(table(rows(result, cfg, seeds)))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
