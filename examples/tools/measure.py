"""Where the calculator run starts: the untrained SmolLM2-135M-Instruct on the run's own prompt, scored as the
trainer's evals score it (grpo/driver/eval.py), greedy and with k samples a question at the run's temperature,
on training questions only (none asked by the validation or the test seeds).

    python -m examples.tools.measure                  # seeds 192-255, 4 samples each
    python -m examples.tools.measure --seeds 192-223 --samples 8

The last line is one JSON object: for each mode the success rate, the share of episodes that called the tool
and the share that had a call the tool answered.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SHOWN = ("success_rate", "episodes_calling", "episodes_with_a_call_answered", "episodes")


def training_seeds(seeds: list[int], config) -> list[int]:
    """The seeds a training draw could take: none held out, none asking a held-out seed's question (the
    trainer's rule, envs/split.py)."""
    from envs.split import held_out
    from examples.tools.calc import CalcEnv

    env = CalcEnv()
    skip = held_out(env, config.held_out_seeds)
    return [s for s in seeds if not skip.holds(env, s)]


def main(argv: list[str] | None = None) -> dict:
    from envs.seeds import parse_seeds
    from examples.tools.run import calc_config
    from grpo.driver import eval as run_eval

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="192-255")
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--home", default="runs/tools-smollm2-measure")
    a = ap.parse_args(argv)
    config = calc_config()
    seeds = training_seeds(parse_seeds(a.seeds), config)
    if not seeds:
        ap.error(f"--seeds {a.seeds}: every one asks a validation or test question; give seeds past 191")
    out = {"seeds": f"{len(seeds)} of {a.seeds}", "temperature": config.rollout.temperature}
    for mode, samples in (("greedy", 1), (f"sampled_x{a.samples}", a.samples)):
        result = run_eval.evaluate(config, None, seeds, samples, a.home, Path(a.home) / f"{mode}.jsonl")
        out[mode] = {k: result.get(k) for k in SHOWN}
        print(f"[measure] {mode}: {json.dumps(out[mode])}", file=sys.stderr, flush=True)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
