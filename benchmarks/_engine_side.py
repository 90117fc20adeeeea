"""This engine's side of a turn-taking benchmark: grpo.Trainer.fit() on the single-turn digits task, the path a
user runs, paused after every step until the parent says go (benchmarks/_turns.py).

    python -m benchmarks._engine_side --model M --run-dir D --steps N [--lora-rank 16 ...]
"""
from __future__ import annotations

import argparse
import time

T0 = time.perf_counter()

from benchmarks._turns import add_workload_args, report, wait_go  # noqa: E402


def run_config(a, checkpoint_every: int = 10 ** 6):
    """The digits task's RunConfig: the same work as TRL's side (benchmarks/_trl_side.py)."""
    import grpo

    return grpo.RunConfig(
        model=a.model, output_dir=a.run_dir, steps=a.steps, tasks_per_step=a.prompts, seed=0,
        env={"name": "digits"}, lora={"rank": a.lora_rank, "alpha": a.lora_alpha},
        algorithm={"group_size": a.group_size},
        train={"lr": a.lr, "micro_batch_size": a.micro_batch_size, "tokens_per_micro_batch": a.tokens_per_micro_batch,
               "share_prompts": a.share_prompts},
        rollout={"temperature": 1.0, "max_tokens_per_turn": a.max_tokens}, engine={"max_model_len": 512},
        eval={"seeds": f"0-{a.prompts - 1}"}, checkpoint={"every": checkpoint_every},
        cluster={"train_ranks": a.train_ranks}, metrics={"tensorboard": False, "plots": False})


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_args(ap)
    ap.add_argument("--run-dir", required=True)
    # Packed rows (train.tokens_per_micro_batch); by default padded micro-batches of --micro-batch-size.
    ap.add_argument("--tokens-per-micro-batch", type=int, default=None)
    # Each prompt's G completions run it once (train.share_prompts): TRL runs it G times, for the same gradient.
    ap.add_argument("--share-prompts", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--train-ranks", type=int, default=1)
    return ap


def main(argv: list[str] | None = None) -> None:
    ap = parser()
    a = ap.parse_args(argv)

    import envs
    from benchmarks._single_turn import DigitsEnv
    from benchmarks._timed_trainer import TimedTrainer

    envs.register("digits", DigitsEnv, overwrite=True)

    def ready(marks):
        report({"event": "ready", "marks": marks})
        wait_go()

    def stepped(record):
        report({"event": "step", **step_fields(record)})
        if record["step"] < a.steps:
            wait_go()

    TimedTrainer(run_config(a), on_ready=ready, on_step=stepped, t0=T0).fit()


def step_fields(record: dict) -> dict:
    r, t, tm = record["rollout"], record["train"], record["time"]
    return {"step": record["step"], "step_s": tm["step_s"], "rollout_s": tm["rollout_s"], "train_s": tm["train_s"],
            "sync_s": tm["sync_s"], "engine_s": r["engine_s"], "worker_s": r["wall_s"],
            "generated_tokens": r["generated_tokens"], "mean_reward": r["mean_reward"],
            "logprob_gap_mean": t.get("sampler_abs_diff"), "logprob_gap_max": t.get("sampler_abs_diff_max"),
            "time": dict(tm), "parts": record["parts"]}


if __name__ == "__main__":
    main()
