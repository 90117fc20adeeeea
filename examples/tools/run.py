"""The tool example on the CPU: the tiny Qwen2.5 warm start (examples/tools/warmstart, made by sft.py if
missing) -> greedy eval on the 64 fixed questions -> GRPO -> eval again; the last line is one JSON object
with eval_before and eval_after.

    python -m examples.tools.run                  # native tool calls: the env's `look`, the model's format
    python -m examples.tools.run --agent openai   # the same task as an agent written with the openai client
    python -m examples.tools.run --steps 4        # extra arguments override examples/tools/cpu.yaml

    python -m examples.tools.run --model smollm2-135m-instruct
        # the real SmolLM2-135M-Instruct with our tool template on the calculator task (examples/tools/calc.py,
        # smollm2.yaml); the last line has test_before, test_after, steps and wall_s
"""
from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHOWN = ("eval_before", "eval_after", "steps", "grpo_wall_s", "first_step_rollout_success",
         "last_step_rollout_success")
PRETRAINED = "smollm2-135m-instruct"
PRETRAINED_SHOWN = ("test_before", "test_after", "eval_before", "eval_after", "steps", "grpo_wall_s",
                    "first_step_rollout_success", "last_step_rollout_success")


def agent_env():
    """examples/tools/agent.py's agent as the run's env: the rollout serves its OpenAI calls."""
    from envs.base import AgentEnv
    from examples.tools.agent import look_agent, task

    return functools.partial(AgentEnv, agent=look_agent, tasks=task)


def calc_config(overrides: list[str] = ()):
    """examples/tools/smollm2.yaml on the real model's folder with our tool template, the calc env registered."""
    import envs
    import grpo
    from examples.tools.calc import CalcEnv
    from examples.tools.templates import pretrained_with_tools

    envs.register("calc", CalcEnv, overwrite=True)
    return grpo.RunConfig.from_yaml(HERE / "smollm2.yaml", ["--model", str(pretrained_with_tools(PRETRAINED)),
                                                             *overrides])


def pretrained(overrides: list[str]) -> dict:
    """The calculator task on the real model (calc_config)."""
    import grpo

    t0 = time.time()
    config = calc_config(overrides)
    summary = grpo.Trainer(config).fit()
    line = {"model": PRETRAINED, **{k: summary.get(k) for k in PRETRAINED_SHOWN}}
    line["wall_s"] = round(time.time() - t0, 1)
    print(json.dumps(line))
    return summary


def main(argv: list[str] | None = None) -> dict:
    import envs
    import grpo
    from examples.tools.sft import ensure_warmstart
    from examples.tools.task import LookEnv

    overrides = list(sys.argv[1:] if argv is None else argv)
    # `--model smollm2-135m-instruct` picks the calculator run; any other model trains on the look task.
    for i, o in enumerate(overrides):
        if o == f"--model={PRETRAINED}" or (o == "--model" and overrides[i + 1:i + 2] == [PRETRAINED]):
            return pretrained(overrides[:i] + overrides[i + (1 if "=" in o else 2):])
    form = "native"
    if "--agent" in overrides:
        i = overrides.index("--agent")
        form = overrides[i + 1] if i + 1 < len(overrides) else ""
        if form != "openai":
            raise SystemExit(f"--agent takes 'openai', got {form!r}")
        del overrides[i:i + 2]
    t0 = time.time()
    envs.register("look", agent_env() if form == "openai" else LookEnv, overwrite=True)
    # The shipped warm start (built if missing), unless the arguments name another model.
    model = [] if any(o.split("=")[0] == "--model" for o in overrides) else ["--model", str(ensure_warmstart())]
    # Each form its own run folder: a run resumes from the checkpoints it finds there.
    folder = [] if any(o.split("=")[0] == "--output_dir" for o in overrides) else ["--output_dir", f"runs/tools-{form}"]
    config = grpo.RunConfig.from_yaml(HERE / "cpu.yaml", model + folder + overrides)
    summary = grpo.Trainer(config).fit()
    line = {"form": form, **{k: summary.get(k) for k in SHOWN}}
    line["wall_s"] = round(time.time() - t0, 1)
    print(json.dumps(line))
    return summary


if __name__ == "__main__":
    main()
