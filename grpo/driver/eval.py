"""Evaluate an adapter as the trainer does (`grpo eval`, grpo.cli): the figures of an eval, and the in-process
rollout that reproduces the trainer's own evals on the same seeds.

A run folder brings everything from its config.yaml (env and options, rollout settings, engine settings,
seed), so the numbers equal the trainer's own evals on the same seeds: the same in-process rollout worker
with greedy decoding, one episode per seed.
"""
from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path


def eval_summary(trajs, stats, samples: int = 1) -> dict:
    """The figures of an eval (the trainer's evals and this command's): success over episodes, with
    `samples` episodes a seed pass@k (the share of seeds with at least one success), and with an env's tools
    the share of episodes that called one and that had a call the tool answered without an error."""
    from grpo.report.samples import reward_components

    out = {"success_rate": stats.success_rate, "mean_reward": stats.mean_reward, "mean_turns": stats.mean_turns,
           "stop_reasons": dict(stats.stop_reasons), "episodes": stats.episodes,
           "solved_seeds": sorted({t.seed for t in trajs if t.success})}
    rewards = reward_components(trajs)
    if rewards:
        out["rewards"] = rewards
    if stats.tool_calls is not None and trajs:
        out["tool_calls"] = stats.tool_calls
        out["episodes_calling"] = sum(t.tool_calls > 0 for t in trajs) / len(trajs)
        out["episodes_with_a_call_answered"] = (sum(t.tool_calls > sum(t.tool_errors.values()) for t in trajs)
                                                / len(trajs))
    if samples > 1:
        seeds = {t.seed for t in trajs}
        out["samples"] = samples
        out[f"pass_at_{samples}"] = len(out["solved_seeds"]) / max(len(seeds), 1)
    return out


def met_target(evaluation: dict | None, target) -> bool:
    """Whether an eval's success reached the run's target (none set: never)."""
    return target is not None and evaluation is not None and evaluation["success_rate"] >= target


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
    return cfg, verified(adapter), run_dir


def verified(adapter: str) -> str:
    """`adapter` once its files match the sha256 its store recorded at publish (a version folder of a run's
    store); raises AdapterStoreError naming the file and an adapter that does verify. A folder outside a
    store has no recorded checksum."""
    from sync import AdapterStore, AdapterStoreError

    path = Path(adapter)
    if not (re.fullmatch(r"v\d+", path.name) and (path.parent / "manifest.json").is_file()):
        return adapter
    store = AdapterStore(path.parent.parent)
    try:
        store.verify(_version_of(adapter))
    except AdapterStoreError as e:
        try:
            good = store.latest_verified()
            instead = f"--adapter {good.path} (v{good.version}, the newest that verifies)" if good else None
        except AdapterStoreError:
            instead = None
        fix = f"evaluate {instead}, or" if instead else "no version of this store verifies:"
        raise AdapterStoreError(f"{adapter} is refused, its files do not match the sha256 recorded when it was "
                                f"published ({e}); {fix} resume the run (the same grpo train command) to publish "
                                "its last checkpoint's adapter again") from None
    return adapter


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
    print(f"[grpo eval] {run_dir} has no summary.json (unfinished run): its latest adapter, v{latest.version:06d}",
          file=sys.stderr)
    return latest.path


def evaluate(cfg, adapter: str | None, seeds: list[int], samples: int = 1, home: str | Path | None = None,
             out: str | Path | None = None) -> dict:
    """Run the eval in this process (no Ray): the worker and engine the trainer would start for `cfg`.
    `home` (the run folder) places the caches as the trainer does: runtime.shared_cache_dir."""
    from rollout import runtime
    from rollout.models import resolve_model

    home = Path(home) if home is not None else Path.cwd()
    runtime.configure(home, runtime.shared_cache_dir(home))
    cfg = dataclasses.replace(cfg, model=str(resolve_model(cfg.model)))  # a Hub id: its snapshot folder
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
    from grpo.driver.rollout_pool import split
    from rollout.trajectory import merge_stats

    trajs, parts = [], []
    for _, part in split(tasks, cfg.cluster.rollout_workers):
        if part:
            chunk, stats = worker.rollout(part, samples, cfg.rollout, greedy=samples == 1)
            trajs.extend(chunk)
            parts.append(stats)
    return trajs, merge_stats(parts)


def _version_of(adapter: str) -> int:
    # A store folder is named after its version (v000003); any other adapter is served as version 1.
    match = re.fullmatch(r"v(\d+)", Path(adapter).name)
    return int(match.group(1)) if match else 1
