"""A bf16 checkpoint, as real ones ship, serves what the trainer scores: an early LoRA update (weights moved
by ~1e-5, below bf16's resolution) reaches vLLM's merged weights, so the sampled tokens' logprobs agree with
transformers + peft in float32 as closely as on a float32 checkpoint, and they moved away from the base model
as the trainer's did."""
import pytest
import torch
from _fixtures_train import image

from grpo.learner import forward, lora
from grpo.tools import tiny_models
from sync import AdapterStore


def _logprobs(model, processor, requests, gens) -> tuple[torch.Tensor, torch.Tensor]:
    """(vLLM's, the trainer's) logprobs of the sampled tokens, flat."""
    seqs = [forward.expand(processor, r.prompt_ids + g.token_ids, r.images,
                           [torch.tensor([0] * len(r.prompt_ids) + [1] * len(g.token_ids)),
                            torch.tensor([0.0] * len(r.prompt_ids) + list(g.logprobs))])
            for r, g in zip(requests, gens)]
    batch = forward.collate(processor, seqs, forward.tokenizer_of(processor).pad_token_id)
    with torch.no_grad():
        lp = forward.token_logprobs(model, batch, mask=batch.per_token[0])
    mask = batch.per_token[0].bool()
    return batch.per_token[1][mask], lp[mask]


def _requests(processor, kind: str) -> list:
    from rollout.engine import Request

    if kind == "text":
        return [Request([10 + (7 * i + k) % 500 for k in range(24)]) for i in range(8)]
    # One image per prompt: the vision tower's output feeds the adapted language model.
    content = [{"type": "image"}, {"type": "text", "text": "Where is the blue circle?"}]
    text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                         tokenize=False)
    ids = forward.tokenizer_of(processor)(text, add_special_tokens=False)["input_ids"]
    return [Request(list(ids), [image(i)]) for i in range(8)]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["text", "vl"])
def test_served_logprobs_move_as_the_trainers_on_a_bf16_checkpoint(kind, session_dir, tmp_path):
    from rollout.engine import Engine, EngineConfig, Sampling

    path = tiny_models.build(kind, session_dir / "models" / f"tiny-{kind}-bf16", seed=0, dtype="bfloat16")
    model = lora.apply_lora(forward.load_model(path), lora.LoraConfig(rank=8, alpha=16.0))
    # An early update: scaling * B @ A moves the weights by ~1e-5, where bf16 weights of ~0.02 step by ~1e-4.
    lora.randomize_adapter(model, seed=3, scale=1e-4)
    model.eval()
    store = AdapterStore(tmp_path / "store")
    version = store.publish(lora.adapter_tensors(model), lora.adapter_config(model))

    engine = Engine(EngineConfig(model=str(path), max_model_len=512, merge_adapter=True))
    # Both sides run the bf16 checkpoint in float32 on the CPU (engine dtype "auto", TrainWorker dtype "auto").
    assert engine.llm.llm_engine.vllm_config.model_config.dtype == torch.float32
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    engine.load_adapter(version, store.verify(version).path)
    processor = forward.load_processor(path)
    requests = _requests(processor, kind)
    gens = engine.generate(requests, Sampling(1.0, 1.0, 16))

    served, trainer = _logprobs(model, processor, requests, gens)
    with model.disable_adapter():
        _, base = _logprobs(model, processor, requests, gens)
    gap, update = (served - trainer).abs(), (trainer - base).abs()
    print(f"bf16 {kind} checkpoint, {gap.numel()} sampled tokens: |vLLM - trainer| mean {gap.mean():.3g} max "
          f"{gap.max():.3g}; |trainer - base| mean {update.mean():.3g} max {update.max():.3g}")
    # The float32 level: the two stacks' kernels differ in the last bits, nothing more.
    assert gap.max().item() <= 1e-5
    # The update is visible and served as the trainer scores it: vLLM moved from the base as the trainer did.
    assert update.mean().item() >= 1e-4
    assert (served - base - (trainer - base)).norm() <= 0.05 * (trainer - base).norm()
