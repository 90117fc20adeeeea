"""Tools without an engine: schemas, running a call and its error kinds, each family's tool-call format parsed
from what its real chat template writes, and the rollout's tool turns on hand-written replies (the engine is
the one part left out; tests/test_tools_rollout.py runs the same with real vLLM)."""
import time
from types import SimpleNamespace

import pytest

import envs
from envs.tools import ERROR_KINDS, Tool, ToolCall, as_toolset, check_arguments, tool_from_function
from examples.tools import templates
from examples.tools.task import LookEnv
from rollout import tool_calls
from rollout.env_threads import EnvThreads
from rollout.scheduler import Batch
from rollout.worker import RolloutConfig, Task


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * and whole numbers.

    Args:
        expression: the expression, e.g. "37 * 58"
    """
    a, op, b = expression.split()
    return str({"+": int.__add__, "-": int.__sub__, "*": int.__mul__}[op](int(a), int(b)))


def boom(x: int) -> str:
    """Always fails.

    Args:
        x: anything
    """
    raise RuntimeError("the tool broke")


def slow() -> str:
    """Never answers in time."""
    time.sleep(3)
    return "late"


SLOW = Tool(tool_from_function(slow).schema, slow, timeout_s=0.2)


class FaultyToolsEnv(LookEnv):
    def reset(self, seed):
        obs = super().reset(seed)
        self.tools = (calculator, boom, SLOW, self.look)
        return obs


@pytest.fixture(scope="module")
def family_tok(session_dir):
    from transformers import AutoTokenizer

    return lambda fam: AutoTokenizer.from_pretrained(templates.build(fam, session_dir / "models" / f"{fam}-tools"))


def test_schema_comes_from_type_hints_and_docstring():
    tool = tool_from_function(calculator)
    fn = tool.schema["function"]
    assert fn["name"] == "calculator" and fn["description"].startswith("Evaluate an arithmetic expression")
    assert fn["parameters"] == {"type": "object", "required": ["expression"], "properties": {
        "expression": {"type": "string", "description": 'the expression, e.g. "37 * 58"'}}}
    assert as_toolset([calculator, SLOW]).schemas == [tool.schema, SLOW.schema]
    with pytest.raises(ValueError, match="unique"):
        as_toolset([calculator, calculator])
    with pytest.raises(ValueError, match="OpenAI function schema"):
        Tool({"name": "x"}, calculator)


def test_each_error_kind_is_a_result_the_model_reads():
    ts = as_toolset([calculator, boom, SLOW])
    assert ts.run(ToolCall("calculator", {"expression": "12 * 13"})).content == "156"
    cases = {
        "malformed": ToolCall(None, None, error="invalid JSON"),
        "unknown_tool": ToolCall("search", {"q": "x"}),
        "bad_arguments": ToolCall("calculator", {"expr": "1"}),
        "raised": ToolCall("boom", {"x": 1}),
        "timeout": ToolCall("slow", {}),
    }
    assert set(cases) == set(ERROR_KINDS)
    for kind, call in cases.items():
        t = time.perf_counter()
        r = ts.run(call)
        assert r.error == kind and r.content.startswith(f"error ({kind}): ")
        assert time.perf_counter() - t < 1.5  # the timeout does not wait for the tool
    assert "the tool broke" in ts.run(cases["raised"]).content
    assert check_arguments(tool_from_function(boom).parameters, {"x": "1"}) == \
        "argument 'x' must be of type integer, got \"1\""
    assert check_arguments(tool_from_function(boom).parameters, {"x": True}) is not None
    assert ts.run(ToolCall("calculator", {"expression": "import os"})).error == "raised"
    env = LookEnv()
    env.reset(5)
    assert as_toolset(env.tools).run(ToolCall("look", {})).content == env.color  # a tool bound to its episode


CALLS = [{"id": "call00000", "type": "function",
          "function": {"name": "calculator", "arguments": {"expression": "3 * 4"}}},
         {"id": "call00001", "type": "function", "function": {"name": "boom", "arguments": {"x": 7}}}]


@pytest.mark.parametrize("family,fmt,n", [("qwen2.5", "hermes", 2), ("llama3", "llama3_json", 1),
                                          ("mistral", "mistral", 2)])
def test_calls_parse_from_the_templates_own_rendering(family_tok, family, fmt, n):
    from rollout.conversation import ChatFormat

    tok = family_tok(family)
    tools = as_toolset([calculator, boom]).schemas
    chat = ChatFormat(tok, None, tools)
    assert chat.tool_format == fmt
    user = [{"role": "user", "content": "What is 3 * 4?"}]
    prompt = tok.apply_chat_template(user, tools=tools, tokenize=False, add_generation_prompt=True)
    # The tools reach the prompt through the template.
    assert '"name": "calculator"' in prompt
    full = tok.apply_chat_template(user + [{"role": "assistant", "content": "", "tool_calls": CALLS[:n]}],
                                   tools=tools, tokenize=False)
    # Mistral writes no generation prompt, so the reply follows the prompt directly.
    assert full.startswith(prompt)
    reply = full[len(prompt):]
    close = tok.decode(chat.close_ids)
    reply = reply[:len(reply) - len(close)] if reply.endswith(close) else reply
    content, calls = tool_calls.parse(fmt, reply)
    assert content == ""
    assert [(c.name, c.arguments, c.id) for c in calls] == \
        [(c["function"]["name"], c["function"]["arguments"], c["id"]) for c in CALLS[:n]]
    assert tool_calls.parse(fmt, "The answer is 12.") == ("The answer is 12.", [])


@pytest.mark.parametrize("fmt,text", [
    ("hermes", '<tool_call>\n{"name": "calculator", "arguments": {"expression": \n</tool_call>'),
    ("hermes", '<tool_call>\n{"name": "calculator"'),  # cut off by the token limit
    ("hermes", '<tool_call>\n["calculator"]\n</tool_call>'),
    ("llama3_json", '{"name": "calculator", "parameters": '),
    ("mistral", '[TOOL_CALLS] [{"name": "calculator", "arguments": {"expression": "1"}'),
    ("mistral", "[TOOL_CALLS] []"),
])
def test_a_call_that_cannot_be_read_is_malformed(fmt, text):
    _, calls = tool_calls.parse(fmt, text)
    assert len(calls) == 1 and calls[0].error and calls[0].name is None


def test_arguments_written_as_a_json_string_and_several_llama_calls():
    _, calls = tool_calls.parse("hermes", 'x<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>'
                                          '<tool_call>{"name": "g", "arguments": {}}</tool_call>', first_id=5)
    assert [(c.name, c.arguments, c.id) for c in calls] == [("f", {"a": 1}, "call00005"), ("g", {}, "call00006")]
    _, calls = tool_calls.parse("llama3_json", '<|python_tag|>{"name": "f", "parameters": {"s": "a;b"}}; '
                                               '{"name": "g", "parameters": {}}')
    assert [(c.name, c.arguments) for c in calls] == [("f", {"s": "a;b"}), ("g", {})]


def _gen(tok, text: str):
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|im_end|>")]
    return SimpleNamespace(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop", expanded_prompt_len=0)


class _Scripted:
    """An engine that answers each request with the next hand-written reply, keeping the contexts it got."""

    def __init__(self, gens):
        self.gens, self.contexts, self.pending = iter(gens), [], []

    def submit(self, request, sampling, use_adapter):
        self.contexts.append(list(request.prompt_ids))
        self.pending.append(str(len(self.contexts)))
        return self.pending[-1]

    def step(self):
        out = {k: next(self.gens) for k in self.pending}
        self.pending = []
        return out

    def abort(self, keys=None):
        self.pending = []


def _run(batch, gens) -> _Scripted:
    engine = _Scripted(gens)
    batch.run(engine, None, True, fits=lambda e: True, continuous=True)
    return engine


def test_each_error_kind_reaches_the_model_and_is_counted(family_tok):
    from rollout.conversation import ChatFormat

    tok = family_tok("qwen2.5")
    envs.register("faulty-tools", FaultyToolsEnv, overwrite=True)
    batch = Batch([Task("faulty-tools", 3)], 1, RolloutConfig(history="full"), ChatFormat(tok), EnvThreads(1))
    (ep,) = batch.open([0])
    call = '<tool_call>\n{{"name": "{}", "arguments": {}}}\n</tool_call>'
    replies = [(call.format("calculator", '{"expression": "12 * 13"}'), "156"),
               ("<tool_call>\n{not json}\n</tool_call>", "error (malformed)"),
               (call.format("search", "{}"), "error (unknown_tool)"),
               (call.format("calculator", '{"expr": "1"}'), "error (bad_arguments)"),
               (call.format("boom", '{"x": 1}'), "error (raised)"),
               (call.format("slow", "{}"), "error (timeout)")]
    gens = [_gen(tok, reply) for reply, _ in replies] + [_gen(tok, ep.env.color)]
    contexts = _run(batch, gens).contexts
    assert len(contexts) == 7
    for (_, shown), gen, before, after in zip(replies, gens, contexts, contexts[1:]):
        added = tok.decode(after[len(before) + len(gen.token_ids):])
        # The reply's sampled <|im_end|> is not repeated: the template's close continues after it.
        assert after[len(before):len(before) + len(gen.token_ids)] == gen.token_ids
        assert added.startswith(f"\n<|im_start|>user\n<tool_response>\n{shown}")
        assert added.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")
    traj = batch.episodes[0].trajectory(None)
    assert traj.tool_calls == 6 and traj.num_turns == 7 and traj.stop_reason == "done"
    assert traj.tool_errors == {k: 1 for k in ERROR_KINDS}
    assert traj.turn_rewards == [0.0] * 6 + [1.0] and traj.success
    # The sampled ids are the replies, nothing else; the tool results are context (mask 0).
    assert sum(traj.segments[0].loss_mask) == sum(len(_gen(tok, r).token_ids) for r, _ in replies) + \
        len(_gen(tok, ep.env.color).token_ids)
    batch.threads.close()


def test_the_endpoint_stitches_calls_that_extend_the_conversation(family_tok):
    """The endpoint's bookkeeping on hand-written replies (tests/test_tools_agent.py runs it on vLLM)."""
    from examples.tools.agent import TOOLS
    from rollout.conversation import ChatFormat
    from rollout.openai_server import Endpoint

    tok = family_tok("qwen2.5")
    base = ChatFormat(tok)
    endpoint = Endpoint(lambda system, tools: base.with_tools(tools) if tools else base, limit=4096)
    try:
        question = [{"role": "user", "content": "What color is the cup?"}]
        ids, state = endpoint.prompt(0, {"messages": question, "tools": TOOLS})
        assert ids == base.with_tools(TOOLS).prompt_ids(envs.base.Observation("What color is the cup?"))
        call_text = '<tool_call>\n{"name": "look", "arguments": {}}\n</tool_call>'
        reply = endpoint.record(state, _gen(tok, call_text))
        message = reply["choices"][0]["message"]
        assert reply["choices"][0]["finish_reason"] == "tool_calls" and message["content"] is None
        assert message["tool_calls"][0]["function"] == {"name": "look", "arguments": "{}"}
        # The agent sends back what it got, plus the tool's result: the ids extend the episode's sequence.
        follow = question + [message, {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"],
                                       "content": "blue"}]
        ids2, state2 = endpoint.prompt(0, {"messages": follow, "tools": TOOLS})
        th = endpoint.threads[0]
        assert ids2[:len(th.ids)] == th.ids and call_text in tok.decode(th.ids)
        assert tok.decode(ids2[len(th.ids):]) == "\n<|im_start|>user\n<tool_response>\nblue\n</tool_response>" \
                                                 "<|im_end|>\n<|im_start|>assistant\n"
        endpoint.record(state2, _gen(tok, "blue"))
        assert len(th.segments) == 0 and sum(th.mask) == len(_gen(tok, call_text).token_ids) + \
            len(_gen(tok, "blue").token_ids)
        # An edited history renders afresh and starts a new segment.
        edited = [{"role": "user", "content": "What color is the cup? Be brief."}]
        ids3, _ = endpoint.prompt(0, {"messages": edited, "tools": TOOLS})
        assert len(th.segments) == 1 and th.ids == [] and "Be brief." in tok.decode(ids3)
    finally:
        endpoint.close()


@pytest.mark.parametrize("family", ["qwen2.5", "llama3", "mistral"])
def test_spliced_tool_turn_is_the_templates_own_rendering(family_tok, family):
    """Prompt ids + the reply's ids + tool_result_ids decode to what the template renders for the whole
    conversation: the tool message reaches the model exactly as the family's template writes it."""
    from rollout.conversation import ChatFormat

    tok = family_tok(family)
    tools = as_toolset([calculator]).schemas
    chat = ChatFormat(tok, None, tools)
    user = [{"role": "user", "content": "What is 3 * 4?"}]
    calls, result = CALLS[:1], [{"role": "tool", "tool_call_id": "call00000", "name": "calculator", "content": "12"}]
    whole = tok.apply_chat_template(user + [{"role": "assistant", "content": "", "tool_calls": calls}] + result,
                                    tools=tools, tokenize=False, add_generation_prompt=True)
    prompt = chat.prompt_ids(envs.base.Observation("What is 3 * 4?"))
    reply_text, _ = whole[len(tok.decode(prompt)):].split(tok.decode(chat.close_ids[:1]), 1)
    reply = chat._ids(reply_text) + chat.close_ids[:1]  # the model ends its turn with the end-of-turn token
    _, parsed = tool_calls.parse(chat.tool_format, chat.action_text(reply))
    assert [c.as_message_call() for c in parsed] == calls
    suffix = chat.tool_result_ids(calls, result, reply)
    assert tok.decode(prompt + reply + suffix) == whole


def test_tool_counts_merge_across_workers_and_stay_out_of_runs_without_tools():
    from rollout.trajectory import RolloutStats, merge_stats

    def stats(**tools):
        return RolloutStats(episodes=2, turns=4, generated_tokens=10, prompt_tokens=20, engine_calls=2, wall_s=1.0,
                            engine_s=0.5, success_rate=0.5, mean_reward=0.5, mean_turns=2.0, parse_errors=0,
                            stop_reasons={"done": 2}, **tools)

    plain = stats()
    assert "tool_calls" not in plain.as_dict() and "tool_errors" not in plain.as_dict()
    merged = merge_stats([stats(tool_calls=3, tool_errors={"timeout": 1}),
                          stats(tool_calls=2, tool_errors={"timeout": 1, "malformed": 1})])
    assert merged.as_dict()["tool_calls"] == 5 and merged.tool_errors == {"timeout": 2, "malformed": 1}
    assert "tool_calls" not in merge_stats([plain, stats()]).as_dict()


def test_the_warm_starts_demonstrations_are_the_rollouts_own_ids():
    """examples/tools/sft.py trains on exactly the ids the rollout builds for the same replies."""
    from transformers import AutoTokenizer

    from examples.tools import sft
    from rollout.conversation import ChatFormat

    tok = AutoTokenizer.from_pretrained(sft.WARMSTART)
    envs.register("look", LookEnv, overwrite=True)
    seed = 7
    ids, mask = sft.episode(sft.chat_format(tok), seed, call=True)
    batch = Batch([Task("look", seed)], 1, RolloutConfig(history="full"),
                  ChatFormat(tok, sft.RUN.rollout.system_prompt), EnvThreads(1))
    (ep,) = batch.open([0])
    _run(batch, [_gen(tok, sft.CALL), _gen(tok, ep.env.color)])
    seg = ep.trajectory(None).segments[0]
    assert (seg.token_ids, seg.loss_mask) == (ids, mask) and ep.success
    batch.threads.close()
