"""Vision-language families as tiny random models, built offline from a config like tiny_models' Qwen3-VL.

Each is the family's real architecture class, its image token(s) and its real chat-template format, at the
"tiny" preset's sizes, saved with `save_pretrained` next to a processor; grpo.tools.families registers them
(VISION). Qwen2-VL and Qwen2.5-VL share Qwen3-VL's mechanism (one `<|image_pad|>` per image, expanded to one
token per merged patch of `image_grid_thw`); LLaVA expands `<image>` to a fixed count set by its CLIP tower
(the CLS token dropped: `vision_feature_select_strategy="default"`); Gemma 3 replaces `<start_of_image>`
with a fixed image sequence around its soft tokens (rollout.models.image_sequences).
"""
from __future__ import annotations

import copy
from pathlib import Path

from grpo.tools import tiny_models
from grpo.tools.tiny_models import family_tokenizer

# The real Qwen2-VL / Qwen2.5-VL template (both ship the same one): ChatML, with a default system message.
QWEN2_VL_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# LLaVA-1.5's conversation format (llava-hf): "USER: <image>\n... ASSISTANT: ...</s>", no system role
# header. llava-hf's own template drops string contents and the closing </s>, which the model was trained
# with: this one renders both, as the LLaVA repository's conversation code does.
LLAVA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] + ' ' }}"
    "{% elif message['role'] == 'user' %}{{ 'USER: ' }}"
    "{% if message['content'] is string %}{{ message['content'] + ' ' }}{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' ' }}"
    "{% endfor %}{% endif %}"
    "{% else %}{{ 'ASSISTANT: ' }}{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] }}"
    "{% endfor %}{% endif %}{{ eos_token }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)


def _qwen_tokenizer(p: tiny_models.TinyPreset):
    return family_tokenizer(
        p.vocab_size, tiny_models.SPECIAL_TOKENS, QWEN2_VL_TEMPLATE, eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens={"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
                              "vision_bos_token": "<|vision_start|>", "vision_eos_token": "<|vision_end|>"})


def _qwen_ids(tokenizer) -> dict:
    return {name: tokenizer.convert_tokens_to_ids(tok) for name, tok in [
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>")]}


def _qwen_text(p: tiny_models.TinyPreset, tokenizer) -> dict:
    text = tiny_models._text_config_kwargs(p, tokenizer)
    del text["head_dim"]  # Qwen2's head is hidden / heads, which the preset's head_dim matches
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1_000_000.0,
                               "mrope_section": tiny_models._mrope_section(p.head_dim)}
    return text


def _qwen_processors(p: tiny_models.TinyPreset, processor_cls, video_cls, tokenizer):
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    pixels = {"shortest_edge": 32 * 32, "longest_edge": 1024 * 1024}
    common = dict(patch_size=p.patch_size, temporal_patch_size=2, merge_size=2,
                  image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5], size=pixels)
    return processor_cls(image_processor=Qwen2VLImageProcessor(**common), video_processor=video_cls(**common),
                         tokenizer=tokenizer, chat_template=QWEN2_VL_TEMPLATE)


def _finish(out: Path, model, processor, tokenizer, text: dict, dtype: str) -> Path:
    import torch

    model = model.to(getattr(torch, dtype))
    model.generation_config.eos_token_id = text["eos_token_id"]
    model.generation_config.pad_token_id = text["pad_token_id"]
    tiny_models._save(out, model, processor, tokenizer)
    return out


def build_qwen2_vl(out: Path, seed: int = 0, dtype: str = "float32") -> Path:
    import torch
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    p = tiny_models.PRESETS["tiny"]
    tokenizer = _qwen_tokenizer(p)
    text = _qwen_text(p, tokenizer)
    config = Qwen2VLConfig(
        text_config=text, tie_word_embeddings=False, **_qwen_ids(tokenizer),
        vision_config=dict(depth=p.vision_depth, embed_dim=p.vision_hidden, hidden_size=p.text_hidden,
                           mlp_ratio=p.vision_intermediate // p.vision_hidden, num_heads=p.vision_heads,
                           patch_size=p.patch_size, spatial_merge_size=2, temporal_patch_size=2))
    config.architectures = ["Qwen2VLForConditionalGeneration"]
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(config)
    processor = _qwen_processors(p, Qwen2VLProcessor, Qwen2VLVideoProcessor, tokenizer)
    return _finish(Path(out), model, processor, tokenizer, text, dtype)


def build_qwen2_5_vl(out: Path, seed: int = 0, dtype: str = "float32") -> Path:
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    p = tiny_models.PRESETS["tiny"]
    tokenizer = _qwen_tokenizer(p)
    text = _qwen_text(p, tokenizer)
    config = Qwen2_5_VLConfig(
        text_config=text, tie_word_embeddings=False, **_qwen_ids(tokenizer),
        # window_size 64 px: a 2 x 2 window of merged patches, so the windowed blocks differ from the full one
        vision_config=dict(depth=p.vision_depth, hidden_size=p.vision_hidden, num_heads=p.vision_heads,
                           intermediate_size=p.vision_intermediate, out_hidden_size=p.text_hidden,
                           patch_size=p.patch_size, spatial_merge_size=2, temporal_patch_size=2,
                           window_size=4 * p.patch_size, fullatt_block_indexes=[p.vision_depth - 1]))
    config.architectures = ["Qwen2_5_VLForConditionalGeneration"]
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config)
    processor = _qwen_processors(p, Qwen2_5_VLProcessor, Qwen2VLVideoProcessor, tokenizer)
    return _finish(Path(out), model, processor, tokenizer, text, dtype)


LLAVA_IMAGE_SIZE = 32  # px: with 8 px patches, 16 image tokens per image (the CLS token dropped)


def build_llava(out: Path, seed: int = 0, dtype: str = "float32") -> Path:
    import torch
    from transformers import CLIPImageProcessor, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor

    p = tiny_models.PRESETS["tiny"]
    tokenizer = family_tokenizer(p.vocab_size, ["<unk>", "<s>", "</s>", "<image>"], LLAVA_TEMPLATE,
                                 bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<unk>",
                           extra_special_tokens={"image_token": "<image>"})
    text = tiny_models._text_config_kwargs(p, tokenizer)
    text.update(model_type="llama", bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    patch = 8
    config = LlavaConfig(
        text_config=text, image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        image_seq_length=(LLAVA_IMAGE_SIZE // patch) ** 2, vision_feature_select_strategy="default",
        vision_feature_layer=-2, tie_word_embeddings=False,
        vision_config=dict(model_type="clip_vision_model", hidden_size=p.vision_hidden,
                           intermediate_size=p.vision_intermediate, num_hidden_layers=p.vision_depth,
                           num_attention_heads=p.vision_heads, image_size=LLAVA_IMAGE_SIZE, patch_size=patch,
                           projection_dim=p.vision_hidden))
    config.architectures = ["LlavaForConditionalGeneration"]
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config)
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": LLAVA_IMAGE_SIZE}, crop_size={"height": LLAVA_IMAGE_SIZE, "width": LLAVA_IMAGE_SIZE},
        image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=patch,
                               vision_feature_select_strategy="default", num_additional_image_tokens=1,
                               chat_template=LLAVA_TEMPLATE)
    _finish(Path(out), model, processor, tokenizer, text, dtype)
    _rename_weights(Path(out), "vision_tower.", "vision_tower.vision_model.")
    return Path(out)


def _rename_weights(out: Path, old: str, new: str) -> None:
    """Lay the saved weights out as the published checkpoints are: transformers 5 saves a CLIP tower without
    its `vision_model.` level, which vLLM's loader requires (and transformers reads either way)."""
    from safetensors.torch import load_file, save_file

    for f in out.glob("*.safetensors"):
        tensors = load_file(f)
        save_file({new + k[len(old):] if k.startswith(old) else k: t for k, t in tensors.items()}, f,
                  metadata={"format": "pt"})


# Gemma 3's template (gemma-3-4b-it): no system role (the system prompt opens the first user turn), images
# as <start_of_image>, the assistant is "model".
GEMMA3_VL_TEMPLATE = (
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}{%- if messages[0]['content'] is string -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}{%- else -%}"
    "{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}{%- endif -%}"
    "{%- set loop_messages = messages[1:] -%}{%- else -%}{%- set first_user_prefix = \"\" -%}"
    "{%- set loop_messages = messages -%}{%- endif -%}{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}{%- endif -%}"
    "{%- if (message['role'] == 'assistant') -%}{%- set role = \"model\" -%}{%- else -%}"
    "{%- set role = message['role'] -%}{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}"
    "{%- elif message['content'] is iterable -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '<start_of_image>' }}"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}{%- endfor -%}"
    "{%- else -%}{{ raise_exception(\"Invalid content type\") }}{%- endif -%}"
    "{{ '<end_of_turn>\n' }}{%- endfor -%}{%- if add_generation_prompt -%}{{'<start_of_turn>model\n'}}{%- endif -%}"
)
GEMMA3_IMAGE_SIZE = 32  # px: 4 x 4 SigLIP patches of 8 px, pooled to mm_tokens_per_image = 4 soft tokens


def build_gemma3_vl(out: Path, seed: int = 0, dtype: str = "float32") -> Path:
    import torch
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3Processor
    from transformers.models.gemma3.image_processing_gemma3 import Gemma3ImageProcessor

    p = tiny_models.PRESETS["tiny"]
    # vLLM looks up the one-to-four newline tokens by text to merge them around an image, as the real
    # tokenizer has them.
    tokenizer = family_tokenizer(
        p.vocab_size, ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>",
                       "<end_of_image>", "<image_soft_token>"],
        GEMMA3_VL_TEMPLATE, ["\n", "\n\n", "\n\n\n", "\n\n\n\n"], bos_token="<bos>", eos_token="<eos>",
        pad_token="<pad>", unk_token="<unk>",
        extra_special_tokens={"image_token": "<image_soft_token>", "boi_token": "<start_of_image>",
                              "eoi_token": "<end_of_image>"})
    text = tiny_models._text_config_kwargs(p, tokenizer)
    text.update(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id, **copy.deepcopy(tiny_models.GEMMA3_TEXT))
    ids = {key: tokenizer.convert_tokens_to_ids(tok) for key, tok in [
        ("boi_token_index", "<start_of_image>"), ("eoi_token_index", "<end_of_image>"),
        ("image_token_index", "<image_soft_token>")]}
    config = Gemma3Config(
        text_config=text, mm_tokens_per_image=4, **ids,
        vision_config=dict(hidden_size=p.vision_hidden, intermediate_size=p.vision_intermediate,
                           num_hidden_layers=p.vision_depth, num_attention_heads=p.vision_heads,
                           image_size=GEMMA3_IMAGE_SIZE, patch_size=8, vision_use_head=False))
    config.architectures = ["Gemma3ForConditionalGeneration"]
    torch.manual_seed(seed)
    model = Gemma3ForConditionalGeneration(config)
    image_processor = Gemma3ImageProcessor(size={"height": GEMMA3_IMAGE_SIZE, "width": GEMMA3_IMAGE_SIZE},
                                           image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    processor = Gemma3Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_length=4,
                                chat_template=GEMMA3_VL_TEMPLATE)
    text["eos_token_id"] = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<end_of_turn>")]
    _finish(Path(out), model, processor, tokenizer, text, dtype)
    _rename_weights(Path(out), "vision_tower.", "vision_tower.vision_model.")
    return Path(out)


def _build_qwen3_vl(out: Path, seed: int = 0, dtype: str = "float32") -> Path:
    return tiny_models.build_vl(Path(out), seed, tiny_models.PRESETS["tiny"], dtype)


# (name, build, notes): grpo.tools.families registers them.
VISION = (
    ("qwen3-vl", _build_qwen3_vl, "tiny_models' Qwen3-VL (the maze's model); ChatML, <|image_pad|> per merged patch"),
    ("qwen2-vl", build_qwen2_vl,
     "ChatML with a default system message; <|image_pad|> per merged 2 x 2 patch (image_grid_thw)"),
    ("qwen2.5-vl", build_qwen2_5_vl,
     "as Qwen2-VL, with windowed attention in the vision tower; LoRA on the language model only (the tower's "
     "MLPs share its projection names)"),
    ("gemma3-vl", build_gemma3_vl,
     "no system role; <start_of_image> becomes \\n\\n<start_of_image>, 4 soft tokens, <end_of_image>\\n\\n with "
     "newlines merged (as vLLM does); vLLM's CPU attention has no mm_prefix support, so images are attended "
     "causally on the CPU (Gemma 3 trained them bidirectionally) and the trainer does the same"),
    ("llava", build_llava,
     "LLaVA-1.5 (CLIP tower, Llama): USER: / ASSISTANT: ... </s>, <image> expanded to a fixed count per image; "
     "LoRA on the language model only (the tower's attention shares its projection names)"),
)
