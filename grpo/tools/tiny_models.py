"""Deterministic tiny models of real architectures, built offline from a config and a seed.

No model hub is reachable here, so tests, benchmarks and the CPU maze run on these: a Qwen3-VL (the seed's
family) and a Qwen3 text model, each saved with `save_pretrained` next to a byte-level BPE tokenizer trained
offline and a chat template. Everything downstream loads them by path, exactly as it would load a real
checkpoint such as Qwen3-VL-8B. They are float32 by default; `dtype="bfloat16"` saves the same model rounded
to bf16, as real checkpoints ship (config.json's dtype and the safetensors both bf16).

    python -m grpo.tools.tiny_models --kind vl --out runs/models/tiny-vl [--seed 0] [--preset tiny] [--dtype bfloat16]
"""
from __future__ import annotations

import argparse
import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

# Qwen-style ChatML. Images are placeholders that the processor expands to one token per merged patch.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif item['type'] == 'video' -%}{{ '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] }}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)

# A fixed corpus: the tokenizer must come out byte-identical on every machine. It leans towards the text
# the bundled maze and tests produce, so actions take a handful of tokens.
_CORPUS = [
    "You are in a maze. Reach the red square and stop on it.",
    "You are the blue circle. Walls are gray, paths are white, the target is the red square.",
    "Answer with exactly one action: ('move', 0) right, ('move', 1) up, ('move', 2) left, ('move', 3) down,",
    "or ('stop', 'stop') when you are on the target.",
    "('move', 0) ('move', 1) ('move', 2) ('move', 3) ('stop', 'stop')",
    "You moved right. You moved up. You moved left. You moved down. You hit a wall and stay where you are.",
    "Your action could not be parsed; the turn is spent. Answer with one action in the format above.",
    "The quick brown fox jumps over the lazy dog. 0 1 2 3 4 5 6 7 8 9 + - * / = ( ) [ ] { } , . : ; ' \"",
    "Question: what is 12 + 30? Answer: 42. The answer is correct. Think step by step.",
    "user assistant system",
    # The chat template writes "assistant" at the start of a line: without a leading space it is another word.
    "assistant",
    # envs/maze.py's rules and feedback, word for word: the maze prompt, read on every turn, is most of a
    # rollout's tokens, so each of its words should be one token.
    "You are in a maze drawn as 9 x 9 blocks: gray blocks are walls, white blocks are open. You are the blue "
    "circle; the goal is the red square. Each turn, reply with exactly one action:",
    "('move', 0) moves one block right, ('move', 1) up, ('move', 2) left, ('move', 3) down;",
    "('stop', 'stop') ends the episode, and wins only when you are on the red square.",
    "Moving into a wall leaves you in place. You have 30 turns, the stop included.",
    "There is a wall to the right; you stay where you are. There is a wall to the up, to the left, to the down.",
    "I could not read an action, so you stay where you are. Reply with one action, e.g. ('move', 0) or "
    "('stop', 'stop').",
    "You stopped on the target: solved. You stopped off the target: episode over. Out of turns: episode over.",
    "Turns left: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 40 50.",
]


@dataclass(frozen=True)
class TinyPreset:
    vocab_size: int
    text_hidden: int
    text_layers: int
    text_heads: int
    text_kv_heads: int
    text_intermediate: int
    head_dim: int
    vision_hidden: int
    vision_depth: int
    vision_heads: int
    vision_intermediate: int
    patch_size: int
    max_position_embeddings: int = 4096


PRESETS = {
    # About 0.8M parameters: the model docs/design.md, "Tiny models" measured; vLLM on 2 cores serves it at
    # thousands of tokens/s.
    "tiny": TinyPreset(
        vocab_size=1024, text_hidden=128, text_layers=2, text_heads=4, text_kv_heads=2,
        text_intermediate=256, head_dim=32, vision_hidden=64, vision_depth=2, vision_heads=2,
        vision_intermediate=128, patch_size=16,
    ),
    # Large enough that matmuls, not Python overhead, dominate a step on 2 cores (benchmarks).
    "bench": TinyPreset(
        vocab_size=1024, text_hidden=512, text_layers=4, text_heads=8, text_kv_heads=4,
        text_intermediate=1536, head_dim=64, vision_hidden=128, vision_depth=2, vision_heads=4,
        vision_intermediate=256, patch_size=16,
    ),
    # The maze warm start (examples/maze): "tiny" with 4 px patches for 8 px maze blocks, so a 2 x 2 merge
    # still gives one language token per block while the patch embedding reads 96 inputs instead of 1536.
    # Four vision blocks, not two: the tower learns every block's expert move, a walk along the maze's
    # corridors. After 1200 steps of that lesson 4 blocks had every shortest-path block right in 86% of the
    # eval mazes, 2 blocks in 56% (6 blocks: no better than 4 at equal steps); 3000 steps: 100%.
    "maze": TinyPreset(
        vocab_size=1024, text_hidden=128, text_layers=2, text_heads=4, text_kv_heads=2,
        text_intermediate=256, head_dim=32, vision_hidden=64, vision_depth=4, vision_heads=2,
        vision_intermediate=128, patch_size=4,
    ),
}


def build_tokenizer(vocab_size: int):
    """A byte-level BPE trained on a fixed corpus, wrapped as a PreTrainedTokenizerFast."""
    return family_tokenizer(
        vocab_size, SPECIAL_TOKENS, CHAT_TEMPLATE, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        extra_special_tokens={"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
                              "vision_bos_token": "<|vision_start|>", "vision_eos_token": "<|vision_end|>"},
    )


# Gemma 3's language-model settings beside the preset's sizes: one value each for the text family
# (grpo.tools.families) and the vision one (grpo.tools.families_vl), which cannot import each other both ways.
GEMMA3_TEXT = {"query_pre_attn_scalar": 32, "sliding_window": 512,
               "layer_types": ["sliding_attention", "full_attention"], "tie_word_embeddings": True,
               "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                                   "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}}}


def family_tokenizer(vocab_size: int, special: list[str], template: str, added: list[str] = (), **named):
    """build_tokenizer's byte-level BPE on the same corpus, with a family's special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(special) - len(added), min_frequency=1,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    tok.add_special_tokens(special)
    if added:
        tok.add_tokens(list(added))
    return PreTrainedTokenizerFast(tokenizer_object=tok, chat_template=template, **named)


def _vocab_size(tokenizer) -> int:
    return len(tokenizer)


def _text_config_kwargs(p: TinyPreset, tokenizer) -> dict:
    return dict(
        vocab_size=_vocab_size(tokenizer),
        hidden_size=p.text_hidden,
        intermediate_size=p.text_intermediate,
        num_hidden_layers=p.text_layers,
        num_attention_heads=p.text_heads,
        num_key_value_heads=p.text_kv_heads,
        head_dim=p.head_dim,
        max_position_embeddings=p.max_position_embeddings,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    )


def _mrope_section(head_dim: int) -> list[int]:
    # The three sections (time, height, width) must sum to head_dim/2; the library default assumes a large
    # head and silently breaks a tiny one. Qwen3-VL-8B uses [24, 20, 20] for head_dim 128: same proportions.
    half = head_dim // 2
    t = half - 2 * (half * 5 // 16)
    return [t, half * 5 // 16, half * 5 // 16]


def build_vl(out: Path, seed: int, preset: TinyPreset, dtype: str = "float32") -> Path:
    import torch
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLProcessor
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    tokenizer = build_tokenizer(preset.vocab_size)
    text = _text_config_kwargs(preset, tokenizer)
    text["rope_parameters"] = {
        "rope_type": "default", "rope_theta": 1_000_000.0,
        "mrope_section": _mrope_section(preset.head_dim), "mrope_interleaved": True,
    }
    ids = {name: tokenizer.convert_tokens_to_ids(tok) for name, tok in [
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>")]}
    config = Qwen3VLConfig(
        text_config=text,
        vision_config=dict(
            depth=preset.vision_depth, hidden_size=preset.vision_hidden, num_heads=preset.vision_heads,
            intermediate_size=preset.vision_intermediate, patch_size=preset.patch_size,
            spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=preset.text_hidden,
            num_position_embeddings=256, deepstack_visual_indexes=[preset.vision_depth - 1],
        ),
        tie_word_embeddings=False,
        **ids,
    )
    config.architectures = ["Qwen3VLForConditionalGeneration"]
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(config).to(getattr(torch, dtype))
    model.generation_config.eos_token_id = text["eos_token_id"]
    model.generation_config.pad_token_id = text["pad_token_id"]

    pixels = {"shortest_edge": 32 * 32, "longest_edge": 1024 * 1024}
    common = dict(patch_size=preset.patch_size, temporal_patch_size=2, merge_size=2,
                  image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5], size=pixels)
    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(**common),
        video_processor=Qwen3VLVideoProcessor(**common),
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
    )
    _save(out, model, processor, tokenizer)
    return out


def build_text(out: Path, seed: int, preset: TinyPreset, dtype: str = "float32") -> Path:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tokenizer = build_tokenizer(preset.vocab_size)
    text = _text_config_kwargs(preset, tokenizer)
    config = Qwen3Config(**text, rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0})
    config.architectures = ["Qwen3ForCausalLM"]
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).to(getattr(torch, dtype))
    model.generation_config.eos_token_id = text["eos_token_id"]
    model.generation_config.pad_token_id = text["pad_token_id"]
    _save(out, model, None, tokenizer)
    return out


def _save(out: Path, model, processor, tokenizer) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    if processor is not None:
        processor.save_pretrained(out)


BUILDERS = {"vl": build_vl, "text": build_text}
DTYPES = ("float32", "bfloat16")


def build(kind: str, out: str | Path, seed: int = 0, preset: str = "tiny", dtype: str = "float32") -> Path:
    """Build and save a tiny model; a folder that already holds the same build is reused as it is. The
    weights are drawn in float32 from `seed` and saved in `dtype`: a bf16 build is the float32 one rounded."""
    if kind not in BUILDERS:
        raise ValueError(f"unknown tiny model kind {kind!r}: use one of {sorted(BUILDERS)}")
    if preset not in PRESETS:
        raise ValueError(f"unknown tiny model preset {preset!r}: use one of {sorted(PRESETS)}")
    if dtype not in DTYPES:
        raise ValueError(f"unknown tiny model dtype {dtype!r}: use one of {list(DTYPES)}")
    stamp = {"kind": kind, "seed": seed, "preset": asdict(PRESETS[preset]), "dtype": dtype}
    return build_once(Path(out), stamp, lambda tmp: BUILDERS[kind](tmp, seed, PRESETS[preset], dtype))


def build_once(out: Path, stamp: dict, make) -> Path:
    """`make(folder)` builds a model into a folder; `out` is reused when it already holds the build `stamp`."""
    marker = out / "tiny_model.json"
    if marker.exists() and json.loads(marker.read_text()) == stamp:
        return out
    # Build into a sibling folder and rename, so a half-built model is never mistaken for a finished one.
    tmp = out.with_name(out.name + ".building")
    if tmp.exists():
        import shutil
        shutil.rmtree(tmp)
    make(tmp)
    (tmp / "tiny_model.json").write_text(json.dumps(stamp, sort_keys=True))
    if out.exists():
        import shutil
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def weights_digest(path: str | Path) -> str:
    """sha256 over the saved tensors' values, independent of file metadata."""
    from safetensors.torch import load_file

    h = hashlib.sha256()
    for f in sorted(Path(path).glob("*.safetensors")):
        tensors = load_file(f)
        for k in sorted(tensors):
            h.update(k.encode())
            h.update(tensors[k].contiguous().view(-1).view(dtype=__import__("torch").uint8).numpy().tobytes())
    return h.hexdigest()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Build a deterministic tiny model of a real architecture.")
    ap.add_argument("--kind", choices=sorted(BUILDERS), default="vl")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--dtype", choices=DTYPES, default="float32")
    a = ap.parse_args(argv)
    path = build(a.kind, a.out, a.seed, a.preset, a.dtype)
    print(json.dumps({"path": str(path), "kind": a.kind, "seed": a.seed, "preset": a.preset, "dtype": a.dtype,
                      "weights_sha256": weights_digest(path)}))


if __name__ == "__main__":
    main()
