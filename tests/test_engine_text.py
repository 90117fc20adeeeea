"""The engine asks vLLM for no detokenization (it cost about a quarter of the tiny model's generate call on the
CPU) unless stop strings need vLLM's text; the reply the env reads is decoded once, from the sampled ids
(ChatFormat.action_text). Where a reply is whole characters, that text must be exactly what vLLM's own
detokenizer gives, for replies cut at max_tokens and for replies ended by the end-of-sequence token. Where an
untrained model emits byte fragments, vLLM's incremental detokenizer may hold back a trailing partial character
or join the reply's first bytes to the prompt's last ones; the text is then the plain decode of the reply's own
tokens, U+FFFD included."""
import gc
import random

import pytest

from rollout.conversation import ChatFormat
from rollout.engine import Engine, EngineConfig, Request, Sampling
from rollout.models import load_processor

FRAGMENT = "\ufffd"


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny_text", "tiny_vl"])
def test_reply_text_is_what_vllms_detokenizer_gives(model, request):
    path = request.getfixturevalue(model)
    engine = Engine(EngineConfig(model=str(path), enable_lora=False, max_model_len=512))
    try:
        tok = engine.tokenizer
        chat = ChatFormat(load_processor(path))
        assert not engine.sampling_params(Sampling()).detokenize
        assert engine.sampling_params(Sampling(stop=("\n",))).detokenize  # stop strings need vLLM's text
        rng = random.Random(0)
        vocab = [i for i in range(tok.vocab_size) if i not in engine.banned_ids]
        prompts = [[rng.choice(vocab) for _ in range(rng.randint(3, 40))] for _ in range(64)]
        prompts += [tok.encode(tok.apply_chat_template([{"role": "user", "content": f"Go {d} steps, then stop."}],
                                                       add_generation_prompt=True, tokenize=False),
                               add_special_tokens=False) for d in range(64)]
        # Every other prompt with the end-of-sequence token favoured: replies ended by it and cut at max_tokens.
        bias = {i: -100.0 for i in engine.banned_ids} | {tok.eos_token_id: 4.0}
        params = [engine.sampling_params(Sampling(1.0, 1.0, 6), detokenize=True, seed=k,
                                         **({"logit_bias": bias} if k % 2 else {})) for k in range(len(prompts))]
        outs = engine.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        whole = {"stop": 0, "length": 0}
        for o in outs:
            ids, reason, want = list(o.outputs[0].token_ids), o.outputs[0].finish_reason, o.outputs[0].text
            got = chat.action_text(ids)
            if FRAGMENT in got or FRAGMENT in want:
                own = ids[:-1] if reason == "stop" else ids
                assert got == tok.decode(own, skip_special_tokens=False, clean_up_tokenization_spaces=False)
                continue
            assert got == want, (ids, reason)
            whole[reason] += 1
        assert whole["stop"] >= 8 and whole["length"] >= 8, whole

        # The whole path: greedy replies generated without vLLM's detokenizer read as with it.
        sampling = Sampling.greedy(max_tokens=6)
        fast = engine.generate([Request(p) for p in prompts], sampling)
        slow = engine.llm.generate([{"prompt_token_ids": p} for p in prompts],
                                   engine.sampling_params(sampling, detokenize=True), use_tqdm=False)
        compared = 0
        for g, o in zip(fast, slow):
            assert g.token_ids == list(o.outputs[0].token_ids)
            text = chat.action_text(g.token_ids)
            if FRAGMENT not in text + o.outputs[0].text:
                assert text == o.outputs[0].text
                compared += 1
        assert compared >= 16, compared
    finally:
        del engine
        gc.collect()
