"""The calculator task of the real-model tool example (examples/tools/calc.py) without an engine: the safe
evaluator and what it refuses, the reward, the held-out split, and our SmolLM2 tool template read back by the
hermes parser."""
from pathlib import Path

import pytest

from envs.seeds import parse_seeds
from envs.split import held_out, training_seeds
from envs.tools import ToolCall, as_toolset
from examples.tools import calc, templates
from grpo.config import RunConfig
from rollout import tool_calls

YAML = Path(__file__).resolve().parents[1] / "examples" / "tools" / "smollm2.yaml"
SMOLLM2_DIR = Path.home() / ".cache" / "grpo" / "models" / "smollm2-135m-instruct"


@pytest.mark.parametrize("expr, value", [
    ("347 * 28", 9716), ("12 + 3 * 4", 24), ("(12 + 3) * 4", 60), ("-5 * -6", 30), ("100 - 250", -150),
    (" 7 ", 7), ("+3 - -2", 5), ("999 * 99 - 1", 98900),
])
def test_evaluate_whole_number_arithmetic(expr, value):
    assert calc.evaluate(expr) == value
    assert calc.calculate(expr) == str(value)


@pytest.mark.parametrize("expr, says", [
    ("x * 2", "'x' is not supported"),
    ("__import__('os').system('true')", "is not supported"),
    ("abs(-3)", "'abs(-3)' is not supported"),
    ("2 ** 10", "Pow is not supported"),
    ("7 / 2", "Div is not supported"),
    ("7 // 2", "FloorDiv is not supported"),
    ("1.5 * 2", "'1.5' is not supported"),
    ("True + 1", "'True' is not supported"),
    ("10000000 * 10000000 * 10000000", "a number past"),
    ("1" * 20, "a number past"),
    ("1 +" * 100 + "1", "longer than 200"),
    ("347 x 28", "not an arithmetic expression"),
])
def test_evaluate_refuses_everything_else(expr, says):
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
        calc.evaluate(expr)


def test_a_refusal_is_a_tool_result_the_model_reads():
    result = as_toolset(calc.CalcEnv.tools).run(ToolCall("calculate", {"expression": "2 ** 10"}))
    assert result.error == "raised"
    assert result.content == ("error (raised): calculate raised ValueError: the operator Pow is not supported: "
                              "use + - * only")


def test_reward_is_the_last_integer_of_the_final_reply():
    env = calc.CalcEnv()
    obs = env.reset(7)
    text, answer = calc.question(7)
    assert obs.text == text and obs.messages[-1] == {"role": "user", "content": text}
    assert obs.messages[0]["role"] == "system"
    a, b = (int(x) for x in text.removeprefix("What is ").split("?")[0].split(" * "))
    assert a * b == answer and 100 <= a <= 999 and 10 <= b <= 99
    for reply, ok in [(f"{a} * {b} = {answer}", True), (f"{answer:,}", True), (f"{answer} or {answer + 1}", False),
                      (f"It is {answer}.", True), ("I cannot say.", False), (f"{answer}0", False)]:
        env.reset(7)
        step = env.step(reply)
        assert (step.reward, step.done, step.info["success"]) == (float(ok), True, ok), reply
        assert step.info["parse_error"] == (reply == "I cannot say.")


def test_no_seed_asks_a_worked_example():
    asked = {calc.ask(a, b) for a, b in calc.DEMOS}
    assert not asked & {calc.question(s)[0] for s in range(5000)}


def test_validation_test_and_training_share_no_question():
    cfg = RunConfig.from_yaml(YAML, [])
    env = calc.CalcEnv()
    val, test = parse_seeds(cfg.eval.seeds), parse_seeds(cfg.eval.test_seeds)
    assert (val[0], val[-1], len(val), test[0], test[-1], len(test)) == (0, 63, 64, 64, 191, 128)
    keys = {name: {env.task_key(s) for s in seeds} for name, seeds in (("val", val), ("test", test))}
    assert not keys["val"] & keys["test"]
    skip = held_out(env, val) | held_out(env, test)
    train, _ = training_seeds(env, 0, cfg.steps * cfg.tasks_per_step, skip)
    assert len(train) == cfg.steps * cfg.tasks_per_step and min(train) >= 192
    assert not {env.task_key(s) for s in train} & (keys["val"] | keys["test"])


@pytest.fixture(scope="module")
def smollm2_tok():
    if not (SMOLLM2_DIR / "model.safetensors").exists():
        pytest.skip(f"SmolLM2 is not pulled at {SMOLLM2_DIR} (`grpo models pull smollm2-135m-instruct`)")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(SMOLLM2_DIR)
    tok.chat_template = templates.SMOLLM2
    return tok


def test_smollm2_template_without_tools_is_smollm2s_own(smollm2_tok):
    from transformers import AutoTokenizer

    own = AutoTokenizer.from_pretrained(SMOLLM2_DIR)
    for msgs in ([{"role": "user", "content": "hi"}],
                 [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                  {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "and?"}]):
        assert (smollm2_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
                == own.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))


def test_smollm2_template_renders_tools_and_calls_the_parser_reads(smollm2_tok):
    schemas = as_toolset(calc.CalcEnv.tools).schemas
    text = smollm2_tok.apply_chat_template(calc.PROMPT + [{"role": "user", "content": "What is 2 * 3?"}],
                                           tools=schemas, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n" + calc.SYSTEM + "\n\n# Tools\n")
    assert '<tools>\n{"type": "function", "function": {"name": "calculate"' in text
    assert "<|im_start|>user\n<tool_response>\n5535\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>user\nWhat is 2 * 3?<|im_end|>\n<|im_start|>assistant\n")
    assert tool_calls.detect_format(templates.SMOLLM2) == "hermes"
    # The first worked exchange's call, as the template rendered it, read back as the call it was made from.
    reply = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    content, calls = tool_calls.parse("hermes", reply)
    assert content == "" and [(c.name, c.arguments, c.error) for c in calls] == [
        ("calculate", {"expression": "123 * 45"}, None)]
    default = smollm2_tok.apply_chat_template([{"role": "user", "content": "x"}], tools=schemas, tokenize=False)
    assert default.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                              "Hugging Face\n\n# Tools\n")


def test_measure_scores_training_questions_only():
    import grpo
    from examples.tools import measure, run
    from examples.tools.calc import CalcEnv

    config = grpo.RunConfig.from_yaml(run.HERE / "smollm2.yaml", ["--model", "unused"])
    kept = measure.training_seeds(list(range(150, 400)), config)
    held = {CalcEnv().task_key(s) for s in range(192)}
    assert kept and min(kept) >= 192 and kept == sorted(kept)
    assert not {CalcEnv().task_key(s) for s in kept} & held
