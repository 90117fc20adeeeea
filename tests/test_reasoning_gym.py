"""reasoning-gym's tasks as `env: reasoning_gym`: the item a seed names, its own scorer as the reward, the weights
of the tasks, and training draws that never ask a question the evaluations ask. The end-to-end run is in
tests/test_dataset_env.py (one stack start for both)."""
import pytest
import reasoning_gym  # the test extra installs it

import envs
from envs.split import held_out, training_seeds


def test_a_seed_names_reasoning_gyms_own_item_scored_by_its_scorer():
    env = envs.make("reasoning_gym", tasks=["basic_arithmetic"], seed=7)
    item = reasoning_gym.create_dataset("composite", size=1_000_000, seed=7, datasets=[
        reasoning_gym.composite.DatasetSpec("basic_arithmetic", 1.0, {})])[12]
    obs = env.reset(12)
    assert obs.text == item["question"] and env.item["answer"] == item["answer"]
    # reasoning-gym's default system prompt asks for <answer> tags, and it is what the model reads first.
    assert obs.messages == [{"role": "system", "content": reasoning_gym.utils.SYSTEM_PROMPTS["default"]},
                            {"role": "user", "content": item["question"]}]
    right = env.step(f"Let me think.\n<answer>{item['answer']}</answer>")
    assert (right.reward, right.done, right.info["success"]) == (1.0, True, True)
    assert right.info["rewards"] == {"basic_arithmetic": 1.0} and not right.info["parse_error"]
    env.reset(12)
    untagged = env.step(item["answer"])  # the scorer reads the tags only
    assert untagged.reward == 0.0 and untagged.info["parse_error"] and not untagged.info["success"]
    bare = envs.make("reasoning_gym", tasks="basic_arithmetic", seed=7, answer_tag=None, system_prompt=None)
    assert bare.reset(12).messages is None
    assert bare.step(f" {item['answer']} ").reward == 1.0


def test_task_weights_and_per_task_options_follow_reasoning_gyms_composite():
    env = envs.make("reasoning_gym", seed=0, tasks={
        "basic_arithmetic": 1.0, "chain_sum": {"weight": 3.0, "config": {"min_terms": 2, "max_terms": 2}}})
    names = [env.task_key(s)[0] for s in range(400)]
    assert 0.65 < names.count("chain_sum") / 400 < 0.85  # 3 : 1
    for s in [s for s, n in enumerate(names) if n == "chain_sum"][:20]:
        env.reset(s)
        assert env.item["metadata"]["num_terms"] == 2  # min_terms = max_terms = 2


def test_training_draws_never_ask_an_eval_or_test_question():
    # 80 items: seeds cycle through them, so the draw from 1,000,000 up meets every eval item again and skips it.
    env = envs.make("reasoning_gym", tasks={"basic_arithmetic": 1.0, "chain_sum": 1.0}, size=80, seed=3)
    assert env.task_key(5) == env.task_key(85) and env.reset(5).text == env.reset(85).text
    skip = held_out(env, range(64))
    seeds, _ = training_seeds(env, 1_000_000, 40, skip)
    held = {env.task_key(s) for s in range(64)}
    assert not held & {env.task_key(s) for s in seeds}
    assert {s % 80 for s in seeds} <= set(range(64, 80))


def test_mistakes_are_named():
    with pytest.raises(ValueError, match="'basic_arithmetc', which is no reasoning-gym dataset; known: .*chain_sum"):
        envs.make("reasoning_gym", tasks={"basic_arithmetc": 1.0})
    with pytest.raises(ValueError, match=r"tasks\['chain_sum'\] weight=0 must be a number > 0"):
        envs.make("reasoning_gym", tasks={"chain_sum": 0})
    with pytest.raises(ValueError, match=r"tasks\['chain_sum'\] has 'min_terms': give a weight"):
        envs.make("reasoning_gym", tasks={"chain_sum": {"min_terms": 2}})
    with pytest.raises(ValueError, match="reasoning-gym refused the tasks \\['chain_sum'\\]"):
        envs.make("reasoning_gym", tasks={"chain_sum": {"config": {"min_terms": 0}}})
    with pytest.raises(ValueError, match="tasks is empty"):
        envs.make("reasoning_gym", tasks=[])
    with pytest.raises(ValueError, match="size=0 must be a whole number >= 1"):
        envs.make("reasoning_gym", tasks="chain_sum", size=0)
