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
    out = merged_weights(base, _adapter([[1.0, 2.0]], [[1.0], [0.0]]), {"r": 1, "lora_alpha": 2})
    assert list(out) == ["layers.0.q_proj.weight"]
    assert out["layers.0.q_proj.weight"].tolist() == [[3.0, 4.0], [0.0, 1.0]]
    assert base["layers.0.q_proj.weight"].tolist() == [[1.0, 0.0], [0.0, 1.0]]  # the pristine copy stays


def test_merge_uses_rslora_scaling_and_keeps_the_base_dtype():
    base = {"layers.0.q_proj.weight": torch.zeros(1, 2, dtype=torch.bfloat16)}
    # r=4, alpha=4, rsLoRA: scaling 4 / sqrt(4) = 2; B @ A = [[4, 0]]
    a, b = [[1.0, 0.0]] * 4, [[1.0] * 4]
    out = merged_weights(base, _adapter(a, b), {"r": 4, "lora_alpha": 4, "use_rslora": True})
    assert out["layers.0.q_proj.weight"].dtype == torch.bfloat16
    assert out["layers.0.q_proj.weight"].tolist() == [[8.0, 0.0]]


def test_merge_refuses_what_it_cannot_merge():
    base = {"layers.0.q_proj.weight": torch.zeros(2, 2)}
    with pytest.raises(KeyError, match="layers.0.k_proj"):
        merged_weights(base, _adapter([[1.0, 0.0]], [[1.0], [0.0]], "layers.0.k_proj"), {"r": 1})
    with pytest.raises(ValueError, match="DoRA"):
        merged_weights(base, _adapter([[1.0, 0.0]], [[1.0], [0.0]]), {"r": 1, "use_dora": True})


def _max_gap(model, processor, prompts, gens) -> float:
    """Largest |trainer logprob - vLLM logprob| over the sampled tokens."""
    seqs = [forward.expand(processor, p + g.token_ids, [],
                           [torch.tensor([0] * len(p) + [1] * len(g.token_ids)),
                            torch.tensor([0.0] * len(p) + list(g.logprobs))]) for p, g in zip(prompts, gens)]
    batch = forward.collate(processor, seqs, forward.tokenizer_of(processor).pad_token_id)
    with torch.no_grad():
        lp = forward.token_logprobs(model, batch, mask=batch.per_token[0])
    mask = batch.per_token[0].bool()
    return (lp[mask] - batch.per_token[1][mask]).abs().max().item()


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
    assert _max_gap(models[0], processor, prompts, gens) <= 1e-4

    engine.load_adapter(versions[1], store.verify(versions[1]).path)
    assert engine.adapter_version == versions[1]
    gens = sample()
    assert _max_gap(models[1], processor, prompts, gens) <= 1e-4
    # Teeth: had the engine kept serving the first version, the gap to it would be this small instead.
    assert _max_gap(models[0], processor, prompts, gens) > 1e-2

    with models[1].disable_adapter():
        assert _max_gap(models[1], processor, prompts, sample(use_adapter=False)) <= 1e-4
    assert _max_gap(models[1], processor, prompts, sample()) <= 1e-4
