"""Running again into a run folder with a changed config (grpo/driver/state.py, check_resume): a change that
changes the training is refused with the diff before Ray starts; the fields of MAY_CHANGE go through. The resume
that goes on with a changed `steps` trains in tests/test_trainer.py."""
import pytest
import yaml

import grpo
from grpo import cli
from grpo.config import RunConfig
from grpo.driver.state import ResumeConfigError, check_resume, config_changes, may_change


def _run_folder(tmp_path, config: RunConfig, checkpoint: bool = True):
    """A run folder as a run that saved a checkpoint leaves it: its config.yaml and the checkpoints' marker."""
    (tmp_path / "config.yaml").write_text(config.to_yaml())
    if checkpoint:
        (tmp_path / "checkpoints").mkdir()
        (tmp_path / "checkpoints" / "latest.json").write_text("{}")
    return tmp_path


def test_changes_are_listed_field_by_field():
    old = {"steps": 4, "model": "m", "train": {"lr": 1e-5, "seed": 0}, "env": {"name": "maze", "options": {"size": 7}}}
    new = {"steps": 6, "model": "m", "train": {"lr": 1e-4, "seed": 0}, "env": {"name": "maze", "options": {"size": 9}},
           "algorithm": {"loss_type": "dapo"}}
    # env.options is one value (an env's options are its own); a section only one side has is not compared.
    assert config_changes(old, new) == [("env.options", {"size": 7}, {"size": 9}), ("steps", 4, 6),
                                        ("train.lr", 1e-5, 1e-4)]
    # A field only one side has (added or removed by an upgrade of grpo) is not compared either.
    assert config_changes({"train": {"lr": 1e-5, "old_field": 1}}, {"train": {"lr": 1e-5, "new_field": 2}}) == []


def test_may_change_lists_fields_and_whole_sections():
    assert all(may_change(f) for f in ("steps", "eval.every", "checkpoint.keep", "metrics.wandb", "fault.inject",
                                       "cluster.train_ranks", "train.micro_batch_size"))
    assert not any(may_change(f) for f in ("train.lr", "train.seed", "eval.seeds", "eval.test_seeds", "seed",
                                           "model", "algorithm.group_size", "rollout.temperature", "engine.dtype",
                                           "env.options", "lora.rank", "tasks_per_step", "pipeline.max_staleness"))


def test_a_changed_lr_is_refused_with_the_diff_and_the_fix(tmp_path):
    run = _run_folder(tmp_path, RunConfig(model="m", output_dir=str(tmp_path), train={"lr": 1e-5}))
    changed = RunConfig(model="m", output_dir=str(tmp_path), steps=200, train={"lr": 2e-5}, eval={"seeds": "0-7"})
    with pytest.raises(ResumeConfigError) as refused:
        check_resume(run, changed)
    message = str(refused.value)
    assert "  eval.seeds: '0-63' -> '0-7'\n  train.lr: 1e-05 -> 2e-05\n" in message
    assert "steps" not in message.split("Give")[0]  # steps may change: not part of the diff shown
    assert "Give a new output_dir to start a new run, or set these fields back to resume this one" in message


def test_allowed_changes_go_through_and_a_folder_without_checkpoint_has_nothing_to_resume(tmp_path):
    base = RunConfig(model="m", output_dir=str(tmp_path))
    run = _run_folder(tmp_path, base)
    assert check_resume(run, base) == []
    longer = RunConfig(model="m", output_dir="elsewhere/same-run", steps=200, checkpoint={"keep": 5},
                       cluster={"train_ranks": 1}, train={"micro_batch_size": 2})
    assert check_resume(run, longer) == [("checkpoint.keep", 2, 5), ("cluster.train_ranks", "auto", 1),
                                         ("output_dir", str(tmp_path), "elsewhere/same-run"), ("steps", 100, 200),
                                         ("train.micro_batch_size", 8, 2)]
    (tmp_path / "fresh").mkdir()
    fresh = _run_folder(tmp_path / "fresh", base, checkpoint=False)
    assert check_resume(fresh, RunConfig(model="m", train={"lr": 1.0})) == []


def test_grpo_train_refuses_a_changed_lr_before_ray_starts(tmp_path, tiny_vl, capsys):
    import ray

    first = RunConfig(model=str(tiny_vl), output_dir=str(tmp_path / "run"), steps=2, algorithm={"group_size": 2})
    (tmp_path / "run").mkdir()
    _run_folder(tmp_path / "run", first)
    path = tmp_path / "run.yaml"
    path.write_text(first.to_yaml())
    assert cli.main(["train", str(path), "--train.lr", "3e-5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"grpo train: {tmp_path / 'run'} holds a run with another config"), err
    assert "  train.lr: 1e-05 -> 3e-05\n" in err
    assert not ray.is_initialized()
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["train"]["lr"] == 1e-5  # left as it was
    with pytest.raises(ResumeConfigError):  # the Python API: the same refusal, raised
        grpo.Trainer(RunConfig.from_dict({**first.to_dict(), "lora": {"rank": 16}})).fit()
    assert not ray.is_initialized()
