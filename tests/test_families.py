"""Model families: each tiny family model renders its real chat-template format, and passes the support matrix
(vLLM vs transformers + peft parity, merged and LoRA serving, hot-load, a GRPO step, the published adapter)
as docs/models.md says it does."""
import pytest

from envs.base import Observation
from grpo.tools import families, model_check, tiny_models
from rollout.conversation import ChatFormat

TEXT = [name for name, f in families.FAMILIES.items() if f.kind == "text"]
# Per family: what the rendered 2-turn conversation must hold, and the token that ends an assistant turn.
MARKERS = {
    "qwen2.5": (["<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n",
                 "<|im_start|>assistant\nok<|im_end|>\n", "<|im_start|>assistant\n"], "<|im_end|>"),
    "qwen3": (["<|im_start|>system\nBe brief.<|im_end|>\n", "<|im_start|>assistant\nok<|im_end|>\n"], "<|im_end|>"),
    "llama3": (["<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>",
                "<|start_header_id|>assistant<|end_header_id|>\n\nok<|eot_id|>"], "<|eot_id|>"),
    "gemma3": (["<bos><start_of_turn>user\nBe brief.\n\nhi<end_of_turn>\n",
                "<start_of_turn>model\nok<end_of_turn>\n<start_of_turn>user\nagain<end_of_turn>\n"], "<end_of_turn>"),
    "mistral": (["<s>[INST] hi[/INST] ok</s>[INST] Be brief.\n\nagain[/INST]"], "</s>"),
    "phi3": (["<|system|>\nBe brief.<|end|>\n<|user|>\nhi<|end|>\n<|assistant|>\nok<|end|>\n<|user|>\nagain<|end|>\n"
              "<|assistant|>\n"], "<|end|>"),
}


def _tokenizer(name):
    spec = families.TEXT_SPECS[name]
    return tiny_models.family_tokenizer(64 + 256 + len(spec.special) + len(spec.added), spec.special, spec.template,
                              spec.added, **spec.tokens)


def test_every_text_family_has_its_markers():
    assert set(TEXT) == set(MARKERS) == set(families.TEXT_SPECS)


@pytest.mark.parametrize("name", TEXT)
def test_chat_template_renders_the_familys_format(name):
    tok = _tokenizer(name)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "ok"}, {"role": "user", "content": "again"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    markers, end = MARKERS[name]
    for marker in markers:
        assert marker in text, f"{name}: {marker!r} not in {text!r}"
    # The rollout splices turns with the template's own pieces, and stops a reply on the family's end token.
    chat = ChatFormat(tok, "Be brief.")
    end_id = tok.convert_tokens_to_ids(end)
    assert end_id in chat.eos_ids and chat.close_ids[0] == end_id
    suffix = chat.observation_ids(Observation(text="again"), [5, end_id])
    assert suffix[0] != end_id and "again" in tok.decode(suffix)


def test_qwen3_drops_earlier_reasoning_and_the_splice_keeps_it():
    tok = _tokenizer("qwen3")
    reply = "<think>\nright\n</think>\n\nok"
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": reply},
                {"role": "user", "content": "again"}]
    assert "right" not in tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert "right" in tok.apply_chat_template(messages[:2], tokenize=False)
    chat = ChatFormat(tok)
    assert not model_check.rerender_same(chat)  # the model saw its reasoning; a re-render would not show it


def test_phi3_conversation_end_is_not_part_of_a_turn():
    tok = _tokenizer("phi3")
    chat = ChatFormat(tok)
    assert chat.close_ids == tok("<|end|>\n", add_special_tokens=False)["input_ids"]
    assert tok.eos_token_id not in chat.observation_ids(Observation(text="again"), [5])


@pytest.mark.parametrize("name", TEXT)
def test_family_builds_a_real_checkpoint_in_bf16(name, tmp_path):
    import json

    path = families.build(name, tmp_path / name, dtype="bfloat16")
    config = json.loads((path / "config.json").read_text())
    spec = families.TEXT_SPECS[name]
    assert config["architectures"] == [spec.model_class] and config["dtype"] == "bfloat16"
    # The generation config stops on the family's end-of-turn token, as the instruct checkpoints ship it.
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    eos = json.loads((path / "generation_config.json").read_text())["eos_token_id"]
    assert tok.convert_tokens_to_ids(spec.end_of_turn) in (eos if isinstance(eos, list) else [eos])
    assert families.build(name, tmp_path / name, dtype="bfloat16") == path  # reused, not rebuilt


def _same_magnitude(a: str, b: str) -> bool:
    """Gap figures agree within one order of magnitude: float32 kernels differ in the last bits by machine."""
    if "-" in (a, b) or "0" in (a, b):
        return a == b
    return abs(int(a.split("e")[1]) - int(b.split("e")[1])) <= 1


@pytest.mark.slow
def test_a_bf16_family_checkpoint_passes_the_matrix(session_dir, tmp_path):
    """Real checkpoints ship in bf16: served and trained in float32, the matrix passes as on float32 ones."""
    path = families.build("gemma3", session_dir / "models" / "family-gemma3-bf16", dtype="bfloat16")
    result = model_check.check_model(path, tmp_path, print)
    assert result["ok"], result["problems"]
    assert max(result["figures"]["gap_merged"], result["figures"]["gap_lora"]) <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("name", list(families.FAMILIES))
def test_family_passes_the_matrix_as_the_table_says(name, session_dir, tmp_path):
    path = families.build(name, session_dir / "models" / f"family-{name}")
    result = model_check.check_model(path, tmp_path, print)
    print(name, result)
    rows = model_check.doc_rows(model_check.DOC.read_text())
    assert name in rows, f"docs/models.md has no row for {name}: run {model_check.FIX} --family {name}"
    documented = rows[name]
    measured = model_check.row(families.FAMILIES[name], result)
    if documented["passes"] == "all":
        assert result["ok"], result["problems"]
        assert max(result["figures"]["gap_merged"], result["figures"]["gap_lora"]) <= model_check.TOLERANCE
    for column in model_check.COLUMNS:
        if column in model_check.TIMING:
            continue
        if column.startswith("gap"):
            assert _same_magnitude(measured[column], documented[column]), (column, measured, documented)
        else:
            assert measured[column] == documented[column], (column, measured, documented)


def test_a_family_that_is_not_exact_on_a_device_is_refused_there(tmp_path):
    import json

    from rollout.models import check_exact

    for arch in ("Gemma3ForConditionalGeneration", "Qwen3VLForConditionalGeneration"):
        (tmp_path / arch).mkdir()
        (tmp_path / arch / "config.json").write_text(json.dumps({"architectures": [arch]}))
        check_exact(tmp_path / arch, "cpu")
    check_exact(tmp_path / "Qwen3VLForConditionalGeneration", "cuda")
    with pytest.raises(ValueError, match="Gemma3ForConditionalGeneration on cuda is not supported yet.*docs/models.md"):
        check_exact(tmp_path / "Gemma3ForConditionalGeneration", "cuda")
