"""The update's contenders for benchmarks/update.py: one TrainWorker each, in its own process, taking turns.

    python -m benchmarks._update_side --model M --batch skewed|maze --train '{"tokens_per_micro_batch": 4096}'

Each child builds its batch and a single-process TrainWorker (2 threads), reports "ready", then runs one
train step each time the parent says go (benchmarks/_turns.py). A baseline contender runs the trainer as it
was before packing, chunked logprobs and the vision cache (BASELINE, extracted with `git archive` and put first
on the child's import path): the same batch builders, the trainer of that commit.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from benchmarks._machine import ROOT
from benchmarks._turns import Contender, report, wait_go

TREE = "GRPO_UPDATE_SIDE_TREE"  # the child imports the trainer from this folder instead of the repository's
BASELINE = "7e382a0"  # main before the update's rework (issue 21): right-padded micro-batches, full logits
LORA_RANK = {"skewed": 32, "maze": 16}


# The algorithm both sides of the maze comparison run: BASELINE's, which scores the old logprobs with the
# trainer (it has no other way). The maze recipe's `old_logprobs: sampler` skips that pass; counting it would
# count an algorithm change as the trainer's engineering.
BASELINE_ALGORITHM = {"old_logprobs": "trainer"}


def maze_recipe() -> dict:
    """The maze recipe's train settings (examples/maze/cpu.yaml), which the trainer before issue 21 also takes."""
    from examples.maze.maze_config import CPU_RUN

    t = CPU_RUN.train
    return {"lr": t.lr, "micro_batch_size": t.micro_batch_size, "updates_per_batch": t.updates_per_batch}


def skewed_batch(processor, sequences: int = 16, seed: int = 0):
    """`sequences` episodes of 32 to 2048 tokens, log-uniform (benchmarks/update.py's make_batch each)."""
    from benchmarks.update import make_batch

    rng = random.Random(seed)
    trajs, advantages = [], []
    for k in range(sequences):
        t, a = make_batch(processor, 1, int(32 * 64 ** rng.random()), seed=seed * 1000 + k)
        trajs += t
        advantages += a
    return trajs, advantages


def baseline_tree() -> Path:
    """The BASELINE commit's packages, extracted once under runs/bench."""
    out = ROOT / "runs" / "bench" / f"baseline-{BASELINE}"
    if not (out / "grpo").is_dir():
        out.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", BASELINE, "grpo", "rollout", "sync", "envs"],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


def contender(name: str, model: str, batch: str, train: dict, episodes: int, work: Path, baseline: bool = False,
              algorithm: dict | None = None):
    env = dict(os.environ)
    if baseline:
        env[TREE] = str(baseline_tree())
    argv = [sys.executable, "-m", "benchmarks._update_side", "--model", model, "--batch", batch, "--train",
            json.dumps(train), "--algorithm", json.dumps(algorithm or {}), "--episodes", str(episodes)]
    if batch == "maze":
        from benchmarks._maze_batch import recipe_mazes

        argv += ["--mazes", json.dumps(recipe_mazes())]
    return Contender(name, argv, work / f"update-{name}.log", env)


def race(contenders: dict, steps: int) -> tuple[dict[str, float], dict[str, dict]]:
    """Each contender's best step (seconds) over `steps` rounds, after a warm-up step each, and its "ready"
    event (the batch's tokens and segments)."""
    try:
        ready = {name: c.event("ready") for name, c in contenders.items()}
        for c in contenders.values():
            c.step()
        best = {name: float("inf") for name in contenders}
        for _ in range(steps):
            for name, c in contenders.items():
                best[name] = min(best[name], c.step()["step_s"])
        return best, ready
    finally:
        for c in contenders.values():
            c.close(120)


def main() -> None:
    if os.environ.get(TREE):
        # Ahead of the repository, which `python -m` puts first on the path.
        sys.path.insert(0, os.environ[TREE])
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", choices=("skewed", "maze"), required=True)
    ap.add_argument("--train", default="{}")
    ap.add_argument("--algorithm", default="{}")
    ap.add_argument("--mazes", default="{}", help="the maze batch's env options and seeds (recipe_mazes())")
    ap.add_argument("--episodes", type=int, default=16)
    a = ap.parse_args()
    from grpo.algo.config import AlgorithmConfig
    from grpo.learner import forward
    from grpo.learner.config import TrainConfig
    from grpo.learner.lora import LoraConfig
    from grpo.learner.worker import TrainWorker

    processor = forward.load_processor(a.model)
    if a.batch == "skewed":
        trajs, advantages = skewed_batch(processor, a.episodes)
    else:
        from benchmarks._maze_batch import maze_batch

        trajs, advantages = maze_batch(processor, a.episodes, json.loads(a.mazes))
    rank = LORA_RANK[a.batch]
    worker = TrainWorker(a.model, lora=LoraConfig(rank=rank, alpha=2.0 * rank),
                         train=TrainConfig(**json.loads(a.train)), algorithm=AlgorithmConfig(**json.loads(a.algorithm)),
                         cpu_threads=2)
    tokens = sum(len(s.token_ids) for t in trajs for s in t.segments)
    import grpo

    report({"event": "ready", "tokens": tokens, "segments": sum(len(t.segments) for t in trajs),
            "trainer": str(Path(grpo.__file__).resolve().parent.relative_to(ROOT))})
    while True:
        try:
            wait_go()
        except SystemExit:
            return
        t0 = time.perf_counter()
        worker.train_step(trajs, advantages)
        report({"event": "step", "step_s": time.perf_counter() - t0})


if __name__ == "__main__":
    main()
