"""The vision-language families: the trainer expands a compact prompt exactly as the family's processor and
vLLM do, and scores a multi-turn image conversation (an image per turn, through the family's chat template)
as vLLM sampled it, with a random LoRA merged into vLLM's weights."""
import pytest
import torch
from _fixtures_train import image

from envs.base import Observation
from grpo.learner import forward, lora
from grpo.tools import families
from rollout.conversation import ChatFormat

VL = sorted(n for n, f in families.FAMILIES.items() if f.kind == "vision")


@pytest.fixture(scope="module")
def built(session_dir):
    return lambda name: families.build(name, session_dir / "models" / f"family-{name}")


def test_the_vision_families_are_registered():
    assert {"qwen2-vl", "qwen2.5-vl", "qwen3-vl", "gemma3-vl", "llava"} <= set(VL)


@pytest.mark.parametrize("name", VL)
def test_expand_gives_the_ids_and_pixels_of_the_familys_processor(built, name):
    path = built(name)
    processor = forward.load_processor(path)
    chat = ChatFormat(processor, "You are in a maze.")
    images = [image(1, 64), image(2, 48)]
    ids = chat.prompt_ids(Observation("Where is the blue circle?", images))
    assert ids.count(chat.image_token_id) == len(images)
    seq = forward.expand(processor, ids, images)
    # The family's own processor, given the rendered text, expands the placeholders itself.
    text = forward.tokenizer_of(processor).decode(ids)
    full = processor(text=[text], images=images, return_tensors="pt", add_special_tokens=False)
    assert seq.input_ids.tolist() == full["input_ids"][0].tolist()
    assert torch.equal(seq.pixel_values, full["pixel_values"])
    # Per-token values travel with their token; inserted ones (and Gemma 3's merged newlines) take 0.
    carried = forward.expand(processor, ids, images, [torch.arange(1, len(ids) + 1)]).per_token[0]
    kept = carried[carried > 0].tolist()
    assert kept == sorted(kept) and not {i + 1 for i, t in enumerate(ids) if t == chat.image_token_id} & set(kept)
    assert [seq.input_ids[k].item() for k in (carried > 0).nonzero().flatten()] == [ids[v - 1] for v in kept]
    assert len(kept) >= len(ids) - len(images) * 3


@pytest.mark.slow
@pytest.mark.parametrize("name", VL)
def test_vllm_and_the_trainer_agree_on_a_multi_turn_image_conversation(built, name, tmp_path):
    from rollout.engine import Engine, EngineConfig, Request, Sampling
    from sync import AdapterStore

    path = built(name)
    processor = forward.load_processor(path)
    model = lora.apply_lora(forward.load_model(path), lora.LoraConfig(rank=8, alpha=16.0))
    lora.randomize_adapter(model, seed=3)
    model.eval()
    store = AdapterStore(tmp_path / "store")
    version = store.publish(lora.adapter_tensors(model), lora.adapter_config(model))
    engine = Engine(EngineConfig(model=str(path), max_model_len=1024, merge_adapter=True,
                                 kv_cache_memory_bytes=64 << 20, max_num_seqs=4))
    engine.load_adapter(version, store.verify(version).path)
    chat = ChatFormat(processor, "You are in a maze.")
    seqs = []
    for episode in range(2):
        first = Observation("Where is the blue circle?", [image(10 * episode, 64)])
        ids, images = chat.prompt_ids(first), list(first.images)
        mask, lps = [0] * len(ids), [0.0] * len(ids)
        for turn in range(3):
            gen = engine.generate([Request(ids, images)], Sampling(1.0, 1.0, 8))[0]
            # vLLM ran the prompt as the trainer expands it.
            assert gen.expanded_prompt_len == len(forward.expand(processor, ids, images).input_ids)
            ids, mask, lps = ids + gen.token_ids, mask + [1] * len(gen.token_ids), lps + gen.logprobs
            if turn < 2:
                # Images of other sizes on later turns: the Qwen-VL grids differ, the fixed-size families resize.
                obs = Observation(f"You moved right. Turn {turn}.", [image(10 * episode + turn + 1, 48 + 16 * turn)])
                suffix = chat.observation_ids(obs, gen.token_ids)
                ids, mask, lps = ids + suffix, mask + [0] * len(suffix), lps + [0.0] * len(suffix)
                images += obs.images
        assert ids.count(chat.image_token_id) == 3
        seqs.append(forward.expand(processor, ids, images, [torch.tensor(mask), torch.tensor(lps)]))
    batch = forward.collate(processor, seqs, forward.tokenizer_of(processor).pad_token_id)
    with torch.no_grad():
        trainer = forward.token_logprobs(model, batch, mask=batch.per_token[0])
    sampled = batch.per_token[0].bool()
    assert int(sampled.sum()) > 0
    diff = (trainer[sampled] - batch.per_token[1][sampled]).abs()
    print(f"{name}: |vLLM - transformers+peft| mean {diff.mean().item():.2e}, max {diff.max().item():.2e} over "
          f"{int(sampled.sum())} tokens")
    # float32, the same figures in two runs: mean 3.3e-7 to 6.2e-7, max 9.5e-7 to 3.3e-6 (qwen2-vl), a few ulps
    # of the logprobs; the bounds are 4x the largest.
    assert diff.mean().item() <= 2.5e-6 and diff.max().item() <= 1.5e-5
