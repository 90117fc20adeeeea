import json

import pytest
import torch

from grpo.learner import forward
from grpo.tools import tiny_models


def test_same_seed_same_model_and_tokenizer(tmp_path, tiny_vl):
    again = tiny_models.build("vl", tmp_path / "again", seed=0)
    assert tiny_models.weights_digest(again) == tiny_models.weights_digest(tiny_vl)
    assert (again / "tokenizer.json").read_bytes() == (tiny_vl / "tokenizer.json").read_bytes()


def test_other_seed_other_weights(tmp_path, tiny_vl):
    other = tiny_models.build("vl", tmp_path / "other", seed=1)
    assert tiny_models.weights_digest(other) != tiny_models.weights_digest(tiny_vl)


def test_vl_model_and_processor_load_back_by_path(tiny_vl):
    from PIL import Image

    processor = forward.load_processor(tiny_vl)
    model = forward.load_model(tiny_vl)
    assert type(model).__name__ == "Qwen3VLForConditionalGeneration"
    assert sum(p.numel() for p in model.parameters()) < 2_000_000
    # 288 px at 16 px patches, 2 x 2 merge: one image token per 32 px block, 9 x 9 of them.
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}]
    text = processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    enc = processor(text=[text], images=[Image.new("RGB", (288, 288), "white")], return_tensors="pt")
    assert int((enc["input_ids"] == processor.image_token_id).sum()) == 81
    with torch.no_grad():
        logits = model(**enc).logits
    assert logits.shape[-1] == model.config.text_config.vocab_size
    assert torch.isfinite(logits).all()


def test_text_model_loads_back_with_chat_template(tiny_text):
    tok = forward.load_processor(tiny_text)
    model = forward.load_model(tiny_text)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    ids = tok.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert tok.decode(ids).endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_saved_in_the_dtype_asked_as_the_float32_model_rounded(dtype, tmp_path, tiny_text):
    from safetensors.torch import load_file

    path = tiny_models.build("text", tmp_path / dtype, seed=0, dtype=dtype)
    assert json.loads((path / "config.json").read_text())["dtype"] == dtype
    assert json.loads((path / "tiny_model.json").read_text())["dtype"] == dtype
    saved, reference = load_file(str(path / "model.safetensors")), load_file(str(tiny_text / "model.safetensors"))
    assert saved.keys() == reference.keys()
    for name, t in saved.items():
        assert t.dtype == getattr(torch, dtype)
        assert torch.equal(t, reference[name].to(t.dtype)), name
    # The trainer loads a bf16 checkpoint in float32, as vLLM runs it on the CPU.
    assert {p.dtype for p in forward.load_model(path).parameters()} == {torch.float32}


def test_finished_build_is_reused_and_marked(tiny_vl):
    stamp = json.loads((tiny_vl / "tiny_model.json").read_text())
    assert stamp["kind"] == "vl" and stamp["seed"] == 0
    before = (tiny_vl / "model.safetensors").stat().st_mtime_ns
    tiny_models.build("vl", tiny_vl, seed=0)
    assert (tiny_vl / "model.safetensors").stat().st_mtime_ns == before


def test_missing_or_non_model_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist.*tiny_models"):
        forward.load_model(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        forward.load_processor(tmp_path / "empty")


def test_unknown_kind_or_preset_names_the_choices(tmp_path):
    with pytest.raises(ValueError, match="use one of"):
        tiny_models.build("llava", tmp_path / "x")
    with pytest.raises(ValueError, match="use one of"):
        tiny_models.build("vl", tmp_path / "x", preset="huge")
    with pytest.raises(ValueError, match="use one of"):
        tiny_models.build("vl", tmp_path / "x", dtype="float16")
