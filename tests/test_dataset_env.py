"""The dataset env: rows scored by reward functions (ours and TRL's batched kind), conversational rows, Hub
datasets from the local cache, by hand; then GRPO from YAML on a conversational arithmetic dataset with a
TRL-style reward function, and on reasoning-gym tasks, through grpo.Trainer (the tiny text model, real vLLM,
Ray and FSDP)."""
import json
import re
import shutil
import sys

import pytest

import envs
from envs.base import Observation
from envs.dataset import DatasetEnv, function_name, load_rows, reward_functions, reward_style


def correct(prompt, completion, row):
    numbers = re.findall(r"-?\d+", completion)
    return float(bool(numbers) and numbers[-1] == str(row["answer"]))


def number_only(prompt, completion, row):
    return 1.0 if re.fullmatch(r"\s*-?\d+\s*", completion) else 0.0


def arithmetic_rows(n: int) -> list[dict]:
    return [{"prompt": f"What is {a}+{b}? Answer with a number.", "answer": a + b}
            for a, b in ((i % 7, (3 * i) % 5) for i in range(n))]


def test_weighted_sum_of_reward_functions_on_a_hand_checked_row():
    env = DatasetEnv(arithmetic_rows(4), rewards={"correct": correct, "format": number_only},
                     weights={"correct": 1.0, "format": 0.25})
    # Row 2: 2 + 6 % 5 = 2 + 1 = 3.
    assert env.reset(2).text == "What is 2+1? Answer with a number."
    right = env.step(" 3")
    assert right.done and right.info["rewards"] == {"correct": 1.0, "format": 1.0}
    assert right.reward == 1.0 * 1.0 + 0.25 * 1.0 and right.info["success"] and right.info["row"] == 2
    env.reset(2)
    wordy = env.step("It is 3.")
    assert wordy.info["rewards"] == {"correct": 1.0, "format": 0.0} and wordy.reward == 1.0
    env.reset(2)
    wrong = env.step("4")
    assert wrong.info["rewards"] == {"correct": 0.0, "format": 1.0} and wrong.reward == 0.25
    assert not wrong.info["success"]  # success follows the first reward function by default


def test_seeds_name_rows_and_training_seeds_skip_the_held_out_rows():
    env = DatasetEnv(arithmetic_rows(10), rewards=correct, holdout=4)
    assert [env.row_index(s) for s in range(10)] == list(range(10))
    # The trainer's draw (train_seed_offset and up) cycles through rows 4..9 only.
    assert sorted({env.row_index(1_000_000 + i) for i in range(60)}) == [4, 5, 6, 7, 8, 9]
    assert env.row_index(1_000_000) == 4 + 1_000_000 % 6
    assert [DatasetEnv(arithmetic_rows(3), correct).row_index(s) for s in (3, 4, 5)] == [0, 1, 2]


def test_rows_from_jsonl_and_json_files_and_reward_functions_by_name(tmp_path):
    rows = arithmetic_rows(3)
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "d.json").write_text(json.dumps(rows))
    assert load_rows(tmp_path / "d.jsonl") == rows and load_rows(str(tmp_path / "d.json")) == rows
    # "module:function" strings keep a config serialisable (config.yaml, grpo.driver.eval): built by name, as in YAML.
    env = envs.make("dataset", data=str(tmp_path / "d.jsonl"), rewards=["test_dataset_env:correct"], weights=[2.0])
    assert env.reset(1).text == "What is 1+3? Answer with a number."
    assert env.step("5").reward == 0.0
    env.reset(1)
    assert env.step("4").reward == 2.0 and list(env.rewards) == ["correct"]


def test_images_from_rows(tmp_path):
    from PIL import Image

    Image.new("RGB", (8, 8), (255, 0, 0)).save(tmp_path / "red.png")
    rows = [{"prompt": "Colour?", "image": str(tmp_path / "red.png")},
            {"prompt": "Colours?", "image": [Image.new("L", (4, 4)), str(tmp_path / "red.png")]}]
    env = DatasetEnv(rows, rewards=lambda p, c, r: 1.0, image_key="image")
    first = env.reset(0).images
    assert len(first) == 1 and first[0].mode == "RGB" and first[0].getpixel((0, 0)) == (255, 0, 0)
    assert [im.size for im in env.reset(1).images] == [(4, 4), (8, 8)]


def test_mistakes_are_named(tmp_path, monkeypatch):
    rows = arithmetic_rows(3)
    with pytest.raises(ValueError, match="weights has 1 values for 2 reward functions"):
        DatasetEnv(rows, rewards=[correct, number_only], weights=[1.0])
    with pytest.raises(ValueError, match="'typo', which is no reward function"):
        DatasetEnv(rows, rewards=[correct], weights={"typo": 1.0})
    with pytest.raises(ValueError, match="two reward functions are named 'correct'"):
        reward_functions([correct, correct])
    with pytest.raises(ValueError, match="cannot be loaded"):
        reward_functions("no_such_module_xyz:fn")
    with pytest.raises(ValueError, match="holdout=3 must be an integer from 0 to 2"):
        DatasetEnv(rows, rewards=correct, holdout=3)
    with pytest.raises(ValueError, match="row 0 has no prompt under prompt_key='question'"):
        DatasetEnv(rows, rewards=correct, prompt_key="question").reset(0)
    env = DatasetEnv(rows, rewards={"bad": lambda p, c, r: "1"})
    env.reset(0)
    with pytest.raises(ValueError, match="reward function 'bad' returned '1' on row 0: it must return a finite"):
        env.step("1")
    env = DatasetEnv(rows, rewards={"boom": lambda p, c, r: r["missing"]})
    env.reset(1)
    with pytest.raises(RuntimeError, match="reward function 'boom' failed on row 1: KeyError"):
        env.step("1")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_rows(tmp_path / "nope.jsonl")
    # A saved `datasets` folder without the package: how to install it (None in sys.modules fails the import).
    (tmp_path / "saved").mkdir()
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ImportError, match="pip install datasets"):
        load_rows(tmp_path / "saved")


def test_a_saved_hugging_face_dataset(tmp_path):
    import datasets  # the `test` extra installs it
    datasets.DatasetDict({"train": datasets.Dataset.from_list(arithmetic_rows(5))}).save_to_disk(tmp_path / "ds")
    with pytest.raises(ValueError, match=r"splits \['train'\]"):
        load_rows(tmp_path / "ds")
    env = DatasetEnv(str(tmp_path / "ds"), rewards=correct, split="train")
    assert env.reset(4).text == arithmetic_rows(5)[4]["prompt"]


def trl_correct(prompts, completions, answer, **kwargs):
    """TRL's batched kind: the row's `answer` column comes as a keyword argument, one value per completion."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [float(re.findall(r"-?\d+", t)[-1:] == [str(a)]) for t, a in zip(texts, answer)]


def test_trl_batched_reward_functions_get_the_columns_as_keyword_arguments():
    seen = []

    def spy(prompts, completions, **kwargs):
        seen.append((prompts, completions, kwargs))
        return [0.5]

    env = DatasetEnv(arithmetic_rows(4), rewards={"correct": trl_correct, "spy": spy, "format": number_only},
                     weights={"correct": 1.0, "spy": 2.0, "format": 0.25})
    env.reset(2)
    result = env.step(" 3")
    # 1.0 * 1 + 2.0 * 0.5 + 0.25 * 1 = 2.25; TRL leaves the prompt column out of the keyword arguments.
    assert result.info["rewards"] == {"correct": 1.0, "spy": 0.5, "format": 1.0} and result.reward == 2.25
    assert seen == [(["What is 2+1? Answer with a number."], [" 3"], {"answer": [3]})]
    assert [reward_style(f, "f", ["answer"]) for f in (trl_correct, spy, number_only, lambda p, c, r: 1.0)] == [
        "trl", "trl", "row", "row"]

    def accuracy(completions, solution, log_extra=None, **kwargs):  # trl.rewards.accuracy_reward's signature
        return [1.0]

    assert reward_style(accuracy, "accuracy", ["solution"]) == "trl"


def test_a_none_reward_does_not_apply_as_in_trl():
    def odd_only(completions, answer, **kwargs):
        return [1.0 if a % 2 else None for a in answer]

    env = DatasetEnv(arithmetic_rows(4), rewards={"odd": odd_only, "format": number_only},
                     weights={"odd": 3.0, "format": 0.5})
    env.reset(2)  # 2+1 = 3: odd
    assert env.step("3").reward == 3.0 + 0.5
    env.reset(1)  # 1+3 = 4: not applicable; success follows "odd", which did not score
    even = env.step("4")
    assert even.info["rewards"] == {"format": 1.0} and even.reward == 0.5 and not even.info["success"]
    env = DatasetEnv(arithmetic_rows(4), rewards={"odd": odd_only})
    env.reset(1)
    with pytest.warns(UserWarning, match="every reward function returned None"):
        assert env.step("4").reward == 0.0


def test_ambiguous_or_unservable_signatures_are_refused():
    rows = arithmetic_rows(2)
    with pytest.raises(ValueError, match="takes any arguments"):
        DatasetEnv(rows, rewards={"any": lambda *a, **kw: 1.0})
    with pytest.raises(ValueError, match=r"takes \(x\): neither TRL's"):
        DatasetEnv(rows, rewards={"one": lambda x: 1.0})
    with pytest.raises(ValueError, match="requires `completion_ids`, which TRL passes and this env cannot"):
        DatasetEnv(rows, rewards={"ids": lambda completions, completion_ids, **kw: [1.0]})
    with pytest.raises(ValueError, match=r"requires `solution`, which is no column .*\['answer'\]"):
        DatasetEnv(rows, rewards={"acc": lambda completions, solution, **kw: [1.0]})
    env = DatasetEnv(rows, rewards={"two": lambda completions, **kw: [1.0, 1.0]})
    env.reset(0)
    with pytest.raises(ValueError, match="returned 2 values for one completion"):
        env.step("1")


CHAT = [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": "What is 2+1?"}]


def test_conversational_rows_reach_the_model_as_messages(tiny_text):
    from rollout.conversation import ChatFormat
    from rollout.models import load_processor

    seen = []

    def spy(prompts, completions, **kwargs):
        seen.append((prompts, completions))
        return [1.0]

    env = DatasetEnv([{"prompt": CHAT, "answer": 3}], rewards={"correct": trl_correct, "spy": spy})
    obs = env.reset(0)
    assert obs.text == "What is 2+1?" and obs.messages == CHAT
    assert env.step("It is 3").info["rewards"] == {"correct": 1.0, "spy": 1.0}
    # TRL's conversational completion: a list of one assistant message.
    assert seen == [([CHAT], [[{"role": "assistant", "content": "It is 3"}]])]
    tok = load_processor(tiny_text)
    expected = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert ChatFormat(tok).prompt_ids(obs) == tok(expected, add_special_tokens=False)["input_ids"]
    # The row's system message replaces rollout.system_prompt; a row without one gets it.
    assert ChatFormat(tok, "Be brief.").prompt_ids(obs) == ChatFormat(tok).prompt_ids(obs)
    user_only = Observation("What is 2+1?", messages=CHAT[1:])
    assert ChatFormat(tok, "Be brief.").prompt_ids(user_only) == ChatFormat(tok, "Be brief.").prompt_ids(
        Observation("What is 2+1?"))
    with pytest.raises(ValueError, match="must end with the user's message"):
        DatasetEnv([{"prompt": CHAT[:1]}], rewards=correct).reset(0)
    with pytest.raises(ValueError, match="message 0 is .*'role': one of"):
        DatasetEnv([{"prompt": [{"role": "robot", "content": "hi"}]}], rewards=correct).reset(0)


def test_a_hub_dataset_by_name_from_the_offline_cache(tmp_path, monkeypatch):
    import datasets
    from datasets.data_files import DataFilesDict
    from datasets.packaged_modules.json.json import Json

    # The cache layout datasets writes for org/name on a first online load_dataset: <cache>/org___name/<config>/
    # <version>/<hash>/name-<split>.arrow with its dataset_info.json; built here from local files.
    cache = tmp_path / "cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(cache))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in arithmetic_rows(5)))
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in arithmetic_rows(2)))
    builder = Json(dataset_name="arith", cache_dir=str(tmp_path / "build"), data_files=DataFilesDict.from_patterns(
        {"train": [str(tmp_path / "train.jsonl")], "test": [str(tmp_path / "test.jsonl")]}))
    builder.download_and_prepare()
    shutil.copytree(builder.cache_dir, cache / "acme___arith" / "default" / "0.0.0" / "0123abcd")
    env = envs.make("dataset", data="acme/arith", split="train", rewards=[correct])
    assert len(env.rows) == 5 and env.reset(4).text == arithmetic_rows(5)[4]["prompt"]
    with pytest.raises(ValueError, match=r"splits \['test', 'train'\]: choose one"):
        load_rows("acme/arith")
    with pytest.raises(FileNotFoundError, match=r"'acme/missing' is no file and is not in the Hugging Face "
                                                r"datasets cache .*datasets.load_dataset\('acme/missing'\)"):
        load_rows("acme/missing", split="train")


def test_functions_in_options_are_written_to_config_yaml_by_name():
    import yaml

    import grpo
    from grpo.algo.config import ConfigError

    assert function_name(trl_correct) == "test_dataset_env:trl_correct"
    cfg = grpo.RunConfig(model="m", env={"name": "dataset", "options": {
        "data": arithmetic_rows(2), "rewards": {"correct": trl_correct, "format": "test_dataset_env:number_only"}}})
    written = yaml.safe_load(cfg.to_yaml())["env"]["options"]["rewards"]
    assert written == {"correct": "test_dataset_env:trl_correct", "format": "test_dataset_env:number_only"}
    env = envs.make("dataset", **grpo.RunConfig.from_dict(yaml.safe_load(cfg.to_yaml())).env.options)
    env.reset(1)
    assert env.step("4").info["rewards"] == {"correct": 1.0, "format": 1.0}
    with pytest.raises(ConfigError, match=r"EnvConfig.options=.*lambda or a function defined inside a function.*define "
                                          r"it at the top level of an importable module"):
        grpo.RunConfig(model="m", env={"name": "dataset", "options": {"rewards": [lambda p, c, r: 1.0]}})
    script = {"__name__": "__main__"}  # a function defined in the script being run, as `python script.py` makes it
    exec("def mine(prompt, completion, row):\n    return 1.0", script)
    with pytest.raises(ConfigError, match=r"mine is defined in the script being run \(__main__\)"):
        grpo.RunConfig(model="m", env={"name": "dataset", "options": {"rewards": [script["mine"]]}})


def test_the_reply_limit_defaults_to_half_the_context_and_must_fit_in_it():
    import grpo
    from grpo.algo.config import ConfigError

    assert grpo.RunConfig(model="m").rollout.max_tokens_per_turn == 4096 // 2
    assert grpo.RunConfig(model="m", engine={"max_model_len": 1024}).rollout.max_tokens_per_turn == 512
    assert grpo.RunConfig(model="m", rollout={"max_tokens_per_turn": 48}).rollout.max_tokens_per_turn == 48
    with pytest.raises(ConfigError, match=r"max_tokens_per_turn=512 .*fewer tokens than engine.max_model_len=512"):
        grpo.RunConfig(model="m", rollout={"max_tokens_per_turn": 512}, engine={"max_model_len": 512})


REWARDS_MODULE = """import re

def correct(prompts, completions, answer, **kwargs):  # TRL's signature, as a TRL script has it
    return [float(re.findall(r"-?\\d+", c[0]["content"])[-1:] == [str(a)]) for c, a in zip(completions, answer)]

def number_only(prompt, completion, row):
    return 1.0 if re.fullmatch(r"\\s*-?\\d+\\s*", completion) else 0.0

def odd_only(completions, answer, **kwargs):  # None: does not apply to even answers
    return [0.5 if a % 2 else None for a in answer]
"""

RUN_YAML = """model: {model}
output_dir: {out}
steps: {steps}
tasks_per_step: 2
env: {env}
algorithm: {{group_size: {group}}}
lora: {{rank: 8, alpha: 16.0}}
train: {{lr: 1.0e-3, micro_batch_size: 8}}
rollout: {{max_tokens_per_turn: 6}}
engine: {{max_model_len: 512}}
eval: {{seeds: {seeds}}}
checkpoint: {{every: 2}}
cluster: {{train_ranks: 1}}
metrics: {{tensorboard: false, samples_per_step: 2}}
"""


def _jsonl(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.mark.slow
def test_grpo_trains_from_yaml_on_trl_rewards_and_a_conversational_dataset_then_on_reasoning_gym(
        tmp_path, tiny_text, monkeypatch):
    import os

    import grpo

    # The user's reward module beside their config, importable by the driver and the Ray actors.
    (tmp_path / "my_rewards.py").write_text(REWARDS_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    rows = [{"prompt": [{"role": "system", "content": "Answer with a number."},
                        {"role": "user", "content": r["prompt"].replace(" Answer with a number.", "")}],
             "answer": r["answer"]} for r in arithmetic_rows(24)]
    data = tmp_path / "arith.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rewards = {"correct": "my_rewards:correct", "format": "my_rewards:number_only", "odd": "my_rewards:odd_only"}
    env = {"name": "dataset", "options": {"data": str(data), "rewards": rewards, "holdout": 4,
                                          "weights": {"correct": 1.0, "format": 0.5, "odd": 1.0}}}
    out = tmp_path / "run"
    (tmp_path / "run.yaml").write_text(RUN_YAML.format(model=tiny_text, out=out, steps=2, env=json.dumps(env),
                                                       group=4, seeds="0-3"))
    summary = grpo.Trainer(grpo.RunConfig.from_yaml(tmp_path / "run.yaml")).fit()
    lines = _jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in lines] == [1, 2]
    for r in lines:
        assert {"correct", "format"} <= set(r["reward"]) <= {"correct", "format", "odd"}
        assert 0 <= r["reward"]["correct"] <= 1 and 0 <= r["reward"]["format"] <= 1
    samples = _jsonl(out / "samples.jsonl")
    assert [s["step"] for s in samples] == [1, 1, 2, 2]
    for s in samples:
        # The row's messages through the chat template: its system message, not a stringified list.
        assert "Answer with a number." in s["prompt"] and "'role'" not in s["prompt"]
        a, b = map(int, re.search(r"What is (\d+)\+(\d+)\?", s["prompt"]).groups())
        assert ("odd" in s["rewards"]) == bool((a + b) % 2)
        assert s["reward"] == pytest.approx(s["rewards"]["correct"] + 0.5 * s["rewards"]["format"]
                                            + s["rewards"].get("odd", 0.0))
    evals = _jsonl(out / "eval_samples.jsonl")
    assert [(e["label"], e["seed"]) for e in evals] == [(label, s) for label in ("before", "after") for s in range(4)]
    assert {"correct", "format"} <= set(summary["eval_after_detail"]["rewards"])

    # reasoning-gym's tasks through `env: reasoning_gym`, scored by their own scorers.
    tasks = {"basic_arithmetic": 1.0, "chain_sum": 1.0}
    env = {"name": "reasoning_gym", "options": {"tasks": tasks, "seed": 0}}
    out = tmp_path / "rg"
    (tmp_path / "rg.yaml").write_text(RUN_YAML.format(model=tiny_text, out=out, steps=1, env=json.dumps(env),
                                                      group=2, seeds="[0]"))
    grpo.Trainer(grpo.RunConfig.from_yaml(tmp_path / "rg.yaml")).fit()
    (record,) = _jsonl(out / "metrics.jsonl")
    assert record["rollout"]["episodes"] == 4 and set(record["reward"]) <= set(tasks) and record["reward"]
    local = envs.make("reasoning_gym", tasks=tasks, seed=0)
    evals = _jsonl(out / "eval_samples.jsonl")
    assert [e["seed"] for e in evals] == [0, 0]
    for e in evals:  # the same item for a seed in every process, with reasoning-gym's system prompt
        assert local.reset(e["seed"]).text in e["prompt"] and local.system_prompt.splitlines()[0] in e["prompt"]
