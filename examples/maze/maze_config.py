"""The maze example's options for the SFT warm start, its shipped checkpoint and its evaluations, read from
examples/maze/cpu.yaml (the run behind `make maze`), so that the warm start and GRPO cannot drift apart.

The SFT rollouts, the greedy evaluations and GRPO must all show the model the same prompt and the same
image, or what the warm start learned does not transfer. Change the env options or the rollout's history or
max_tokens_per_turn in cpu.yaml and the shipped checkpoint under `warmstart/` no longer matches: rebuild it
with `python -m examples.maze.sft`.
"""
from __future__ import annotations

from pathlib import Path

from grpo.config import RunConfig

HERE = Path(__file__).resolve().parent
CPU_RUN = RunConfig.from_yaml(HERE / "cpu.yaml")

ENV = CPU_RUN.env.name
ENV_OPTIONS = dict(CPU_RUN.env.options)
SIZE = ENV_OPTIONS["size"]
CELL_PX = ENV_OPTIONS["cell_px"]
MAX_TURNS = ENV_OPTIONS["max_turns"]
HISTORY = CPU_RUN.rollout.history
MAX_TOKENS_PER_TURN = CPU_RUN.rollout.max_tokens_per_turn
EVAL_SEEDS = CPU_RUN.eval_seeds  # validation: stops GRPO at its target and the SFT in its band
TEST_SEEDS = CPU_RUN.test_seeds  # test: reported, used for nothing else (layouts no training draw holds)
# The SFT's own validation: its per-state accuracy, which decides when greedy evals start (and its report).
SFT_GATE_SEEDS = list(range(10_000, 10_064))
TRAIN_SEED_BASE = CPU_RUN.train_seed_offset  # training mazes are seeds from here on, past held-out layouts

# Progress shaping (PROGRESS_REWARD per move that shortens the way) is an option the ablation
# (examples/maze/ablate.py) measures on top of cpu.yaml's sparse task reward; it changes no prompt or image,
# so the warm start is unaffected either way.
PROGRESS_REWARD = 0.1

# cpu.yaml with rollouts one step ahead of the trainer, on resources of their own (docs/pipeline.md, "Learning
# with max_staleness: 1"): `python -m examples.maze.run --pipelined`. Steps of 8 mazes and 2 updates make as
# many updates an episode as cpu.yaml's 16 and 4, but an episode one update old is then 64 episodes behind the
# trainer instead of 128 (at 16 mazes a step 2 of 3 seeds reached 95% in 16 steps, at each of three learning
# rates); warmup and evals every 4 steps come at the same episodes as cpu.yaml's.
PIPELINED = ["--pipeline.max_staleness", "1", "--cluster.colocate", "false", "--algorithm.old_logprobs", "trainer",
             "--algorithm.tis_cap", "2.0", "--tasks_per_step", "8", "--steps", "32", "--train.updates_per_batch", "2",
             "--train.warmup_steps", "4", "--eval.every", "4", "--checkpoint.every", "8"]

# The tiny model's image preset: 4 px patches merged 2 x 2 make one language token per 8 px block.
PRESET = "maze"
WARMSTART = HERE / "warmstart"


def rollout_config():
    """The RolloutConfig every maze evaluation uses: the CPU run's (greedy decoding ignores its temperature)."""
    return CPU_RUN.rollout
