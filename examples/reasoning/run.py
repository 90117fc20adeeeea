"""The reasoning example on the CPU: SmolLM2-135M-Instruct (a real pretrained model, pulled once from its
PyPI package) -> greedy test accuracy on 128 held-out questions -> GRPO -> the test again. The last line is
one JSON object with test_before, test_after, steps and wall_s (also written to RUN/result.json).

    python -m examples.reasoning.run                 # examples/reasoning/cpu.yaml
    python -m examples.reasoning.run --seed 1 --train.seed 1 --output_dir runs/reasoning-1
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHOWN = ("test_before", "test_after", "eval_before", "eval_after", "steps")


def main(argv: list[str] | None = None) -> dict:
    import grpo

    overrides = list(sys.argv[1:] if argv is None else argv)
    t0 = time.time()
    # model: smollm2-135m-instruct is pulled and converted on first use (rollout/pretrained.py).
    config = grpo.RunConfig.from_yaml(HERE / "cpu.yaml", overrides)
    summary = grpo.Trainer(config).fit()
    line = {k: summary.get(k) for k in SHOWN}
    line["wall_s"] = round(time.time() - t0, 1)
    (Path(config.output_dir) / "result.json").write_text(json.dumps(line) + "\n")
    print(json.dumps(line))
    return summary


if __name__ == "__main__":
    main()
