"""What can be checked about a run before Ray starts: a mistake found here costs seconds, not a cluster start.
`grpo train --dry-run` runs the same checks, less those of files that may live on another machine."""
from __future__ import annotations

import json
from pathlib import Path

from grpo.algo.config import ConfigError
from grpo.config import RunConfig
from grpo.driver.resources import AUTO
from grpo.driver.state import TaskSampler


def check_run(config: RunConfig, files: bool = True) -> None:
    """Raise on the first problem: the env (one training seed built and reset as a rollout would), injected
    faults that could never fire, and with `files` the model folder and the starting adapter."""
    import envs

    if files:
        from grpo.learner.forward import check_model_dir

        check_model_dir(config.model)
        if config.adapter is not None and not (Path(config.adapter) / "adapter_config.json").is_file():
            raise FileNotFoundError(f"adapter={config.adapter!r} has no adapter_config.json: give the folder a "
                                    "LoRA adapter was saved to (save_pretrained), or leave it unset")
        if config.adapter is not None:
            _check_adapter_matches_lora(config)
    # A broken env fails here, not in an actor; so does one with no task left to train on past the eval sets.
    envs.check_env(config.env.name, config.env.options, config.train_seed_offset)
    TaskSampler(config.env.name, config.env.options, config.train_seed_offset,
                held_out=config.held_out_seeds).take(config.tasks_per_step)
    ranks = config.cluster.train_ranks
    check_faults(config, ranks if ranks != AUTO else None)


def check_faults(config: RunConfig, train_ranks: int | None) -> None:
    """Injected faults that could never fire are refused. `train_ranks` None: not known yet ("auto", resolved
    once Ray tells the cluster's GPUs, grpo.driver.resources), so a train rank's index is checked then."""
    for f in config.fault.faults:
        count = {"rollout": config.cluster.rollout_workers, "train_rank": train_ranks}.get(f.target, 1)
        if (count is not None and f.index >= count) or f.step > config.steps:
            index = f"index below {count} (the {f.target}s the run has) and " if count is not None else ""
            raise ConfigError("RunConfig", "fault.inject", f.spec,
                              f"a fault that can fire: {index}step at most steps ({config.steps})")
        if f.target == "checkpoint" and not _saves_at(f.step, config):
            raise ConfigError("RunConfig", "fault.inject", f.spec, f"a step that saves a checkpoint (every "
                              f"{config.checkpoint.every} steps and the last)")


def _saves_at(step: int, config: RunConfig) -> bool:
    from grpo.learner.checkpoint import should_save

    return should_save(step, config.checkpoint.every, config.steps)


def _check_adapter_matches_lora(config: RunConfig) -> None:
    """A starting adapter is trained in its own shape; a `lora:` section that says otherwise would be a setting
    that changes nothing (and the engines would be sized for the wrong rank): refused, naming the values."""
    saved = json.loads((Path(config.adapter) / "adapter_config.json").read_text())
    lora = config.lora
    stated = {"lora.rank": (lora.rank, saved.get("r")), "lora.alpha": (lora.alpha, saved.get("lora_alpha"))}
    if isinstance(saved.get("target_modules"), list):
        stated["lora.target_modules"] = (sorted(lora.target_modules), sorted(saved["target_modules"]))
    for field, (ours, theirs) in stated.items():
        if theirs is not None and ours != theirs:
            raise ConfigError("RunConfig", field, ours,
                              f"{theirs!r}, as the starting adapter {config.adapter} was saved (adapter_config.json): "
                              f"a run that starts from an adapter trains it in its own shape; set {field}: {theirs!r}")
