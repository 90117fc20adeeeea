"""Tool turns end to end: the tool example's warm start on real vLLM calls `look` in its own format,
the results come back as `tool` messages, and the trainer scores exactly the ids vLLM sampled across the
tool turns (float32 parity, within the bar test_tools_agent holds its agent runs to)."""
import pytest
from test_tools_agent import _parity

import envs
from examples.tools.sft import RUN, ensure_warmstart
from examples.tools.task import LookEnv
from grpo.learner import forward
from rollout.engine import EngineConfig
from rollout.worker import RolloutConfig, RolloutWorker, Task

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tool_worker(session_dir):
    envs.register("look", LookEnv, overwrite=True)
    path = ensure_warmstart()
    w = RolloutWorker(EngineConfig(model=str(path), enable_lora=False, max_model_len=1024, dtype="float32"),
                      run_dir=str(session_dir))
    yield w, path
    w.shutdown()


def test_tool_turns_reach_the_trainer_with_the_ids_vllm_sampled(tool_worker):
    w, path = tool_worker
    cfg = RolloutConfig(temperature=1.0, max_tokens_per_turn=RUN.rollout.max_tokens_per_turn, history="full",
                        max_turns=3)
    trajs, stats = w.rollout([Task("look", s) for s in range(1_000_001, 1_000_005)], 4, cfg)
    with_calls = [t for t in trajs if t.tool_calls]
    assert with_calls and stats.tool_calls == sum(t.tool_calls for t in trajs) >= len(with_calls)
    errors = {}
    for t in trajs:
        for k, v in t.tool_errors.items():
            errors[k] = errors.get(k, 0) + v
    assert stats.as_dict()["tool_errors"] == errors
    tok = forward.tokenizer_of(forward.load_processor(path))
    for t in with_calls:
        seg = t.segments[0]
        text = tok.decode(seg.token_ids)
        # The call went out in the model's format and its result came back as the template's tool message.
        assert "<tool_call>" in t.actions[0] and "<tool_response>\n" in text
        # Only the replies are trained on: after the first reply, the context tokens hold the tool's result
        # and the template's turns, never the model's call.
        first = seg.loss_mask.index(1)
        context = tok.decode([i for i, m in zip(seg.token_ids[first:], seg.loss_mask[first:]) if not m])
        assert "<tool_response>" in context and '"arguments"' not in context
    _parity(path, trajs)
