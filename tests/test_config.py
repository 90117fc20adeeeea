"""The run config states each value once: the rollout and engine sections are the rollout package's own
classes, one temperature, one step count, and docs/config.md is generated from the classes."""
import dataclasses
from pathlib import Path

import pytest

from grpo.algo.config import ConfigError
from grpo.config import RunConfig
from grpo.tools import config_reference
from rollout.engine import EngineConfig, VllmConfig
from rollout.worker import RolloutConfig

ROOT = Path(__file__).resolve().parents[1]
CPU_YAML = ROOT / "examples" / "maze" / "cpu.yaml"


def test_docs_config_md_is_generated_from_the_classes():
    written = (ROOT / "docs" / "config.md").read_text()
    assert written == config_reference.render(), f"docs/config.md is stale: run `{config_reference.COMMAND}`"


def test_every_field_has_a_line_and_every_class_one_suffix():
    assert config_reference.missing_descriptions() == []
    names = [cls.__name__ for _, cls in config_reference.sections()]
    assert len(names) == 14 and all(n.endswith("Config") for n in names), names


def test_rollout_and_engine_sections_are_the_rollout_packages_classes(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    cfg = RunConfig(model=str(tmp_path), seed=3, lora={"rank": 8},
                    rollout={"temperature": 0.7, "history": "none", "stop": ["\n"]},
                    engine={"max_model_len": 1024, "dtype": "float32", "merge_adapter": False})
    assert isinstance(cfg.rollout, RolloutConfig) and cfg.rollout.stop == ("\n",)
    assert isinstance(cfg.engine, VllmConfig)
    engine = cfg.engine_config()
    assert isinstance(engine, EngineConfig)
    assert (engine.model, engine.seed, engine.max_lora_rank) == (str(tmp_path), 3, 8)
    assert (engine.max_model_len, engine.dtype, engine.merge_adapter) == (1024, "float32", False)
    assert all(getattr(engine, f.name) == getattr(cfg.engine, f.name) for f in dataclasses.fields(VllmConfig))


def test_yaml_round_trip():
    cfg = RunConfig.from_yaml(CPU_YAML)
    assert RunConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.to_dict()["engine"]["max_model_len"] == 1024 and "max_model_len" not in cfg.to_dict()["rollout"]


@pytest.mark.parametrize("override, says", [
    (["--train.temperature", "0.7"], r"train\.temperature=0\.7 .*one temperature, rollout\.temperature"),
    (["--train.total_steps", "16"], r"train\.total_steps=16 .*the cosine schedule runs over the run's `steps`"),
    (["--rollout.max_model_len", "2048"], r"rollout\.max_model_len=2048 .*set engine\.max_model_len"),
    (["--rollout.dtype", "bfloat16"], r"rollout\.dtype='bfloat16' .*set engine\.dtype"),
])
def test_a_value_that_moved_says_where_it_lives_now(override, says):
    with pytest.raises(ConfigError, match=says):
        RunConfig.from_yaml(CPU_YAML, override)


@pytest.mark.parametrize("data, field", [
    ({"rollout": {"temperature": 0.0}}, "RunConfig.rollout.temperature"),  # greedy is for evaluation only
    ({"rollout": {"temperature": -1.0}}, "RolloutConfig.temperature"),
    ({"rollout": {"top_p": 0.95}}, "RunConfig.rollout.top_p"),  # vLLM renormalises over the nucleus
    ({"lora": {"dropout": 0.05}}, "LoraConfig.dropout"),
    ({"algorithm": {"kl_coef": 0.1, "kl_estimator": "k1"}}, "AlgorithmConfig.kl_estimator"),
    ({"rollout": {"history": "some"}}, "RolloutConfig.history"),
    ({"engine": {"max_model_len": 16}}, "VllmConfig.max_model_len"),
    ({"engine": {"dtype": "half"}}, "VllmConfig.dtype"),
    ({"engine": {"gpu_memory_utilization": 1.5}}, "VllmConfig.gpu_memory_utilization"),
    ({"steps": 2, "train": {"schedule": "cosine", "warmup_steps": 2}}, "RunConfig.steps"),
])
def test_bad_values_name_the_field(data, field):
    with pytest.raises(ConfigError) as e:
        RunConfig(model="m", **data)
    assert e.value.field == field


def test_the_cosine_schedule_runs_over_the_runs_steps():
    cfg = RunConfig(model="m", steps=10, train={"lr": 1.0, "schedule": "cosine", "warmup_steps": 0,
                                                "min_lr_ratio": 0.0})
    assert cfg.train.lr_at(0, cfg.steps) == 1.0 and cfg.train.lr_at(5, cfg.steps) == pytest.approx(0.5)
    assert cfg.train.lr_at(10, cfg.steps) == 0.0


def test_an_eval_set_without_seeds_is_refused(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    # A number n is the first n seeds: 0 is none, and the evals before and after training need one.
    with pytest.raises(ConfigError, match=r"EvalConfig\.seeds=0 .*at least one seed"):
        RunConfig(model=str(tmp_path), eval={"seeds": 0})
    assert RunConfig(model=str(tmp_path), eval={"seeds": [0]}).eval_seeds == [0]


_USER_ENV = '''
import envs


class Echo(envs.Env):
    def reset(self, seed):
        return envs.Observation("say hi")

    def step(self, action):
        return envs.StepResult(envs.Observation(""), float("hi" in action), True, {"success": "hi" in action})


envs.register("test_import_echo", Echo, overwrite=True)
'''


def test_grpo_train_imports_the_users_env_module_before_the_config_is_checked(tmp_path, monkeypatch, capsys):
    from grpo import cli

    (tmp_path / "user_echo_env.py").write_text(_USER_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = tmp_path / "run.yaml"
    config.write_text(f"model: {tmp_path}\nenv: test_import_echo\nsteps: 1\n")
    assert cli.main(["train", str(config), "--dry-run"]) == 2  # not registered: refused, naming it
    assert "test_import_echo" in capsys.readouterr().err
    assert cli.main(["train", str(config), "--import", "user_echo_env", "--dry-run"]) == 0
    assert "env:\n  name: test_import_echo" in capsys.readouterr().out
