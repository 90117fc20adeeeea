"""Adapter versions served merged into vLLM's weights: the merge itself on hand-computed numbers, then a real
in-process engine against transformers + peft, version after version."""
import pytest
import torch

from grpo.learner import forward, lora
from rollout.merged import merged_weights
from sync import AdapterStore

P = "base_model.model."


def _adapter(a, b, module="layers.0.q_proj"):
    return {f"{P}{module}.lora_A.weight": torch.tensor(a), f"{P}{module}.lora_B.weight": torch.tensor(b)}


def test_merge_adds_scaled_b_times_a_to_the_base_weight():
    base = {"layers.0.q_proj.weight": torch.tensor([[1.0, 0.0], [0.0, 1.0]]), "norm.weight": torch.ones(2)}
    # r=1, alpha=2: scaling 2; B @ A = [[1, 2], [0, 0]]
    out = merged_weights(base, _adapter([[1.0, 2.0]], [[1.0], [0.0]]), {"r": 1, "lora_alpha": 2}, torch.float32)
    assert list(out) == ["layers.0.q_proj.weight"]
    assert out["layers.0.q_proj.weight"].tolist() == [[3.0, 4.0], [0.0, 1.0]]
    assert base["layers.0.q_proj.weight"].tolist() == [[1.0, 0.0], [0.0, 1.0]]  # the pristine copy stays


def test_merge_uses_rslora_scaling():
    base = {"layers.0.q_proj.weight": torch.zeros(1, 2)}
    # r=4, alpha=4, rsLoRA: scaling 4 / sqrt(4) = 2; B @ A = [[4, 0]]
    a, b = [[1.0, 0.0]] * 4, [[1.0] * 4]
    out = merged_weights(base, _adapter(a, b), {"r": 4, "lora_alpha": 4, "use_rslora": True}, torch.float32)
    assert out["layers.0.q_proj.weight"].tolist() == [[8.0, 0.0]]


def test_merge_of_a_bf16_checkpoint_keeps_the_update_in_the_engines_dtype():
    # An early update (1e-5) is below a bf16 weight's resolution near 1 (2**-7): cast back to the checkpoint's
    # bf16 it vanished and vLLM, running float32 on the CPU, served the base model.
    base = {"layers.0.q_proj.weight": torch.ones(1, 2, dtype=torch.bfloat16)}
    out = merged_weights(base, _adapter([[1e-5, 0.0]], [[1.0]]), {"r": 1, "lora_alpha": 1}, torch.float32)
    merged = out["layers.0.q_proj.weight"]
    assert merged.dtype == torch.float32
    assert merged.tolist() == [[torch.tensor(1.0 + 1e-5, dtype=torch.float32).item(), 1.0]]
    assert merged_weights(base, _adapter([[1e-5, 0.0]], [[1.0]]), {"r": 1, "lora_alpha": 1},
                          torch.bfloat16)["layers.0.q_proj.weight"].tolist() == [[1.0, 1.0]]


def test_merge_refuses_what_it_cannot_merge():
    base = {"layers.0.q_proj.weight": torch.zeros(2, 2)}
    f32 = torch.float32
    with pytest.raises(KeyError, match="layers.0.k_proj"):
        merged_weights(base, _adapter([[1.0, 0.0]], [[1.0], [0.0]], "layers.0.k_proj"), {"r": 1}, f32)
    with pytest.raises(ValueError, match="DoRA.*use_dora.*merge_adapter: false"):
        merged_weights(base, _adapter([[1.0, 0.0]], [[1.0], [0.0]]), {"r": 1, "use_dora": True}, f32)
    # A tensor the loader does not know (here an embedding's LoRA) is refused, never silently left out.
    odd = {**_adapter([[1.0, 0.0]], [[1.0], [0.0]]), f"{P}embed_tokens.lora_embedding_A": torch.zeros(1, 2)}
    with pytest.raises(ValueError, match="lora_embedding_A.*merge_adapter: false"):
        merged_weights(base, odd, {"r": 1}, f32)


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = torch.nn.Linear(6, 8)
        self.v_proj = torch.nn.Linear(6, 6)


class _Tiny(torch.nn.Module):
    """Module names as a decoder's (layers.N.q_proj), biases on, an untied head: every case below needs one."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([_Block(), _Block()])
        self.lm_head = torch.nn.Linear(6, 10)


@pytest.mark.parametrize("settings", [
    # rank and alpha per module, by full name and by a suffix (peft's get_pattern_key rules)
    dict(r=4, lora_alpha=3, rank_pattern={"layers.1.q_proj": 2, "v_proj": 3}, alpha_pattern={"q_proj": 5}),
    dict(r=2, lora_alpha=4, lora_bias=True),
    dict(r=2, lora_alpha=4, modules_to_save=["lm_head"]),
], ids=["rank_alpha_pattern", "lora_bias", "modules_to_save"])
def test_merge_matches_peft_merge_and_unload(settings, tmp_path):
    import json

    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file

    torch.manual_seed(0)
    model = _Tiny()
    base = {k: v.clone() for k, v in model.state_dict().items()}
    peft_model = get_peft_model(model, LoraConfig(target_modules=["q_proj", "v_proj"], **settings))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name or "modules_to_save" in name:
                p.add_(torch.randn(p.shape) * 0.1)
    # Through the files, as the engine reads a published version.
    peft_model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    adapter = load_file(str(tmp_path / "adapter_model.safetensors"))
    out = merged_weights(base, adapter, config, torch.float32)
    want = peft_model.merge_and_unload().state_dict()
    assert set(want) == set(base)
    for name in base:
        torch.testing.assert_close(out.get(name, base[name]), want[name], rtol=0, atol=1e-6, msg=name)
    changed = {n for n in base if not torch.equal(base[n], want[n])}
    assert changed and set(out) == changed  # every weight peft changes, and only those


def _max_gap(model, processor, prompts, gens) -> float:
    """Largest |trainer logprob - vLLM logprob| over the sampled tokens."""
    seqs = [forward.expand(processor, p + g.token_ids, [],
                           [torch.tensor([0] * len(p) + [1] * len(g.token_ids)),
                            torch.tensor([0.0] * len(p) + list(g.logprobs))]) for p, g in zip(prompts, gens)]
    batch = forward.collate(processor, seqs, forward.tokenizer_of(processor).pad_token_id)
    with torch.no_grad():
        lp = forward.token_logprobs(model, batch, mask=batch.per_token[0])
    mask = batch.per_token[0].bool()
    gap = (lp[mask] - batch.per_token[1][mask]).abs().max().item()
    print(f"max |vLLM - trainer| = {gap:.2e} over {int(mask.sum())} tokens")
    return gap


# float32, the same figures in two runs: 9.5e-7 to 1.9e-6 over 128 sampled tokens, a few ulps of the logprobs;
# the bound is 5x the largest.
PARITY = 1e-5


@pytest.mark.slow
def test_merged_engine_matches_peft_version_after_version(tiny_text, tmp_path):
    from rollout.engine import Engine, EngineConfig, Request, Sampling

    store = AdapterStore(tmp_path / "store")
    models, versions = [], []
    for seed in (3, 4):
        model = lora.apply_lora(forward.load_model(tiny_text), lora.LoraConfig(rank=8, alpha=16.0))
        lora.randomize_adapter(model, seed=seed)
        versions.append(store.publish(lora.adapter_tensors(model), lora.adapter_config(model)))
        models.append(model.eval())
    processor = forward.load_processor(tiny_text)
    engine = Engine(EngineConfig(model=str(tiny_text), max_model_len=512, merge_adapter=True))
    assert engine.cfg.merged and not engine.llm.llm_engine.vllm_config.lora_config
    # Prompts longer than two KV blocks: a prefix cache kept across a weight change would serve stale blocks.
    prompts = [[10 + (i + k) % 500 for k in range(2 * engine.block_size + 5)] for i in range(8)]
    sampling = Sampling(1.0, 1.0, 16)

    def sample(use_adapter=True):
        return engine.generate([Request(p) for p in prompts], sampling, use_adapter)

    engine.load_adapter(versions[0], store.verify(versions[0]).path)
    gens = sample()
    assert _max_gap(models[0], processor, prompts, gens) <= PARITY

    engine.load_adapter(versions[1], store.verify(versions[1]).path)
    assert engine.adapter_version == versions[1]
    gens = sample()
    assert _max_gap(models[1], processor, prompts, gens) <= PARITY
    # Teeth: had the engine kept serving the first version, the gap to it would be this small instead.
    assert _max_gap(models[0], processor, prompts, gens) > 1e-2

    with models[1].disable_adapter():
        assert _max_gap(models[1], processor, prompts, sample(use_adapter=False)) <= PARITY
    assert _max_gap(models[1], processor, prompts, sample()) <= PARITY
