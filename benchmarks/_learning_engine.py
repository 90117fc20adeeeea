"""This engine's side of benchmarks/learning_vs_trl.py: grpo.Trainer.fit() on a run config (a YAML file and
overrides, as `grpo train` takes them), paused between steps until the parent says go (benchmarks/_turns.py),
scoring greedy test accuracy on the config's eval.test_seeds before training and every few steps.

    python -m benchmarks._learning_engine --config C.yaml --eval-every K [--section.field=VALUE ...]

The test accuracy is the trainer's own evaluation (Trainer.evaluate on the test seeds: greedy, the rollout
worker's vLLM serving the adapter the step published, eval_samples.jsonl keeps the replies): "test before" and
the final "test" are the ones every run reports, the ones between are asked for after their step.
"""
from __future__ import annotations

import argparse
import time

T0 = time.perf_counter()

from benchmarks._turns import report, wait_go  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    # No abbreviations: the run config's overrides (--eval.every=0) pass through untouched.
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--config", required=True)
    ap.add_argument("--eval-every", type=int, required=True)
    a, overrides = ap.parse_known_args(argv)

    import grpo
    from benchmarks._engine_side import step_fields
    from benchmarks._timed_trainer import StepClock

    config = grpo.RunConfig.from_yaml(a.config, overrides)

    class Turns(grpo.Callback):
        """Ready once the test before training is scored; a step event after each step, with its test accuracy
        every `eval_every` steps; the last step's waits for the run's own final test. `eval_s`: the seconds the
        driver waited on evaluations since the last event, which the parent leaves out of the side's clock."""

        def __init__(self):
            self.eval_s, self.last = 0.0, None

        def on_phase_end(self, trainer, phase, seconds):
            if phase == "eval":
                self.eval_s += seconds

        def _send(self, event: dict) -> None:
            event["eval_s"], self.eval_s = self.eval_s, 0.0
            report(event)

        def on_eval(self, trainer, label, result):
            if label == "test before":
                self._send({"event": "ready", "test_accuracy": result["success_rate"]})
                wait_go()
            elif label == "test":
                self._send({**self.last, "test_accuracy": result["success_rate"]})

        def on_step_end(self, trainer, record):
            fields = {"event": "step", **step_fields(record)}
            if record["step"] == trainer.config.steps:
                self.last = fields
                return
            if record["step"] % a.eval_every == 0:
                fields["test_accuracy"] = trainer.evaluate(trainer.config.test_seeds,
                                                           label=f"test step {record['step']}")["success_rate"]
            self._send(fields)
            wait_go()

    # StepClock first: it adds the step's parts to the record that step_fields reads.
    grpo.Trainer(config, callbacks=[StepClock(t0=T0), Turns()]).fit()


if __name__ == "__main__":
    main()
