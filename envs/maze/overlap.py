"""Which maze layouts the example's sets share: `python -m envs.maze --overlap` prints one JSON line.

The sets, all read from files (envs imports nothing of the example's code):
- `validation`: cpu.yaml's `eval.seeds` (stops GRPO at its target; the SFT's band stop reads it too);
- `test`: cpu.yaml's `eval.test_seeds` (reported, used for nothing else);
- the warm start's manifest (`draws.json` beside it, written by examples/maze/sft.py): the SFT's own
  validation seeds and the seed ranges each of its phases drew training mazes from;
- `grpo_seedS`: GRPO's training draw for training seed S, as the trainer draws it (envs.split: from
  `training_offset(S)` up, every validation and test layout skipped), `steps` x `tasks_per_step` tasks: the
  most a run of cpu.yaml draws.
Layouts, not seeds, are compared: two seeds can draw one maze (Maze.key).
"""
from __future__ import annotations

import itertools
import json
from pathlib import Path

from envs.base import Env
from envs.registry import make
from envs.seeds import parse_seeds
from envs.split import HeldOut, held_out, training_seeds

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "maze" / "cpu.yaml"
MANIFEST = ROOT / "examples" / "maze" / "warmstart" / "draws.json"
TRAINING_SEEDS = range(5)
SEED_STRIDE = 1_000_000


def training_offset(seed: int) -> int:
    """Training seed S draws its mazes from (S + 1) x 1e6 up: seed 0 draws what cpu.yaml's run draws."""
    return (int(seed) + 1) * SEED_STRIDE


def phase_seeds(env: Env, phase: dict, skip: HeldOut) -> list[int]:
    """The seeds one manifest phase drew from: `count` mazes from `first` on, past held-out layouts where the
    phase skipped them (`skips_held_out`)."""
    if not phase.get("skips_held_out"):
        return list(range(phase["first"], phase["first"] + phase["count"]))
    return training_seeds(env, phase["first"], phase["count"], skip)[0]


def example_sets(config: Path = CONFIG, manifest: Path = MANIFEST, train: range = TRAINING_SEEDS) -> dict:
    """{name: seeds} of every set the maze example evaluates on or trains from."""
    import yaml

    cfg = yaml.safe_load(Path(config).read_text())
    env = make("maze", size=cfg["env"]["options"]["size"])
    sets = {"validation": parse_seeds(cfg["eval"]["seeds"]), "test": parse_seeds(cfg["eval"].get("test_seeds") or [])}
    skip = held_out(env, sets["validation"] + sets["test"])
    drawn = json.loads(Path(manifest).read_text())
    sets["sft_validation"] = parse_seeds(drawn["validation_seeds"])
    sft_skip = skip | held_out(env, sets["sft_validation"])
    for phase in drawn["draws"]:
        sets[f"sft_{phase['phase']}"] = phase_seeds(env, phase, sft_skip)
    n = cfg["steps"] * cfg["tasks_per_step"]
    for s in train:
        sets[f"grpo_seed{s}"] = training_seeds(env, training_offset(s), n, skip)[0]
    return sets


def overlap(sets: dict, size: int = 9) -> dict:
    """Seeds and distinct layouts of each set, and the layouts each pair shares."""
    env = make("maze", size=size)
    keys = {name: {env.task_key(s) for s in seeds} for name, seeds in sets.items()}
    shared = {f"{a}~{b}": len(keys[a] & keys[b]) for a, b in itertools.combinations(sets, 2)}
    training = [name for name in sets if name.startswith(("sft_", "grpo_")) and name != "sft_validation"]
    return {"sets": {name: {"seeds": len(sets[name]), "layouts": len(keys[name])} for name in sets},
            "shared_layouts": shared,
            "test_vs_training": sum(len(keys["test"] & keys[t]) for t in training),
            "test_vs_validation": len(keys["test"] & (keys["validation"] | keys.get("sft_validation", set()))),
            "validation_vs_training": {t: len(keys["validation"] & keys[t]) for t in training}}


def pick_test_seeds(first: int, n: int, avoid: dict, size: int = 9) -> list[int]:
    """The first `n` seeds from `first` on whose layouts no set in `avoid` holds and no earlier pick repeats."""
    env = make("maze", size=size)
    taken = set().union(*({env.task_key(s) for s in seeds} for seeds in avoid.values()))
    picked, seed = [], first
    while len(picked) < n:
        key = env.task_key(seed)
        if key not in taken:
            picked.append(seed)
            taken.add(key)
        seed += 1
    return picked


def seed_spec(seeds: list[int]) -> str:
    """A sorted seed list as ranges, "5-9,12,20-21": what parse_seeds reads back."""
    parts, run = [], []
    for s in sorted(seeds):
        if run and s != run[-1] + 1:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(s)
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(parts)
