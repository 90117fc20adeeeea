"""The model families people post-train with GRPO, as tiny random models built offline from a config.

Each family is its real architecture class at tiny_models' "tiny" sizes, saved next to a byte-level BPE
tokenizer trained on tiny_models' corpus with the family's own special tokens and its published chat-template
format (written as a Jinja string into the tokenizer), and a generation config whose eos ids hold the family's
end-of-turn token, as the real instruct checkpoints ship it. `grpo.tools.model_check` runs the support matrix
on them; docs/models.md is its table.

    python -m grpo.tools.families --family llama3 --out runs/models/llama3 [--seed 0] [--dtype bfloat16]
"""
from __future__ import annotations

import argparse
import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from grpo.tools import tiny_models


@dataclass(frozen=True)
class Family:
    name: str
    kind: str  # "text" or "vision"
    build: Callable[..., Path]  # build(out_dir, seed=0, dtype="float32") -> out_dir
    notes: str = ""


FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    FAMILIES[family.name] = family
    return family


# Qwen2.5-Instruct's template without its tool branch: ChatML with a default system message.
QWEN2_5_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' -%}"
    "{{ '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else -%}"
    "{{ '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] != 'system' or not loop.first -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)

# Qwen3's template without its tool branch: an assistant turn before the last user message loses its
# <think>...</think> reasoning; the ones after it keep it. enable_thinking=false opens an empty think block.
QWEN3_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' -%}"
    "{{ '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) -%}"
    "{%- for message in messages[::-1] -%}"
    "{%- set index = (messages|length - 1) - loop.index0 -%}"
    "{%- if ns.multi_step_tool and message['role'] == 'user' -%}"
    "{%- set ns.multi_step_tool = false -%}{%- set ns.last_query_index = index -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' or (message['role'] == 'system' and not loop.first) -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{%- set content = message['content'] -%}"
    "{%- set reasoning_content = '' -%}"
    "{%- if message['reasoning_content'] is string -%}"
    "{%- set reasoning_content = message['reasoning_content'] -%}"
    "{%- elif '</think>' in content -%}"
    "{%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}"
    "{%- endif -%}"
    "{%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) -%}"
    "{{ '<|im_start|>assistant\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n'"
    " + content.lstrip('\\n') }}"
    "{%- else -%}"
    "{{ '<|im_start|>assistant\\n' + content }}"
    "{%- endif -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif -%}"
    "{%- endif -%}"
)

# Meta-Llama-3-8B-Instruct's template.
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)

# Gemma 3's template, text part: no system role (the system prompt opens the first user turn), the
# assistant is "model".
GEMMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}"
    "{{ '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)

# Mistral-7B-Instruct-v0.3's template: the system prompt is written into the last user turn.
MISTRAL_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set system_message = messages[0]['content'] -%}{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{{- bos_token -}}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{- raise_exception('After the optional system message, conversation roles must alternate "
    "user/assistant/user/assistant/...') -}}"
    "{%- endif -%}"
    "{%- if message['role'] == 'user' -%}"
    "{%- if loop.last and system_message is defined -%}"
    "{{- '[INST] ' + system_message + '\\n\\n' + message['content'] + '[/INST]' -}}"
    "{%- else -%}{{- '[INST] ' + message['content'] + '[/INST]' -}}{%- endif -%}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{{- ' ' + message['content'] + eos_token -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
)

# Phi-3-mini-4k-instruct's template: a conversation rendered without a generation prompt ends with eos.
PHI3_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{'<|system|>\\n' + message['content'] + '<|end|>\\n'}}"
    "{% elif message['role'] == 'user' %}{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}"
    "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\\n' + message['content'] + '<|end|>\\n'}}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}"
)


@dataclass(frozen=True)
class TextSpec:
    """What differs between the text families: classes, tokens, template, extra config."""
    config_class: str
    model_class: str
    special: list[str]
    template: str
    tokens: dict  # bos_token / eos_token / pad_token / unk_token -> token
    end_of_turn: str  # the token that ends an assistant turn; the generation config stops on it
    added: list[str] = field(default_factory=list)  # added tokens that are not special (Qwen3's think tags)
    config: dict = field(default_factory=dict)


def build_text(spec: TextSpec, out: Path, seed: int = 0, dtype: str = "float32") -> Path:
    import torch
    import transformers

    p = tiny_models.PRESETS["tiny"]
    tok = tiny_models.family_tokenizer(p.vocab_size, spec.special, spec.template, spec.added, **spec.tokens)
    kwargs = tiny_models._text_config_kwargs(p, tok)
    kwargs.update(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                  **copy.deepcopy(spec.config))  # a config may rewrite its rope dicts: the spec stays as written
    config = getattr(transformers, spec.config_class)(**kwargs)
    config.architectures = [spec.model_class]
    torch.manual_seed(seed)
    model = getattr(transformers, spec.model_class)(config).to(getattr(torch, dtype))
    stops = [tok.eos_token_id, tok.convert_tokens_to_ids(spec.end_of_turn)]
    model.generation_config.eos_token_id = sorted(set(stops)) if len(set(stops)) > 1 else stops[0]
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.bos_token_id = tok.bos_token_id
    tiny_models._save(out, model, None, tok)
    return out


_ROPE = {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
_QWEN_ROPE = {"rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0}}
TEXT_SPECS = {
    "qwen2.5": TextSpec(
        "Qwen2Config", "Qwen2ForCausalLM", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], QWEN2_5_TEMPLATE,
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": "<|endoftext|>"}, "<|im_end|>",
        config=_QWEN_ROPE),
    "qwen3": TextSpec(
        "Qwen3Config", "Qwen3ForCausalLM", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], QWEN3_TEMPLATE,
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": "<|endoftext|>"}, "<|im_end|>",
        added=["<think>", "</think>"], config=_QWEN_ROPE),
    "llama3": TextSpec(
        "LlamaConfig", "LlamaForCausalLM",
        ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        LLAMA3_TEMPLATE,
        # Llama 3 ships no pad token; the trainer pads batches, so the tiny one names <|end_of_text|>.
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "pad_token": "<|end_of_text|>"},
        "<|eot_id|>", config=_ROPE),
    "gemma3": TextSpec(
        "Gemma3TextConfig", "Gemma3ForCausalLM",
        ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"], GEMMA3_TEMPLATE,
        {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}, "<end_of_turn>",
        config=tiny_models.GEMMA3_TEXT),
    "mistral": TextSpec(
        "MistralConfig", "MistralForCausalLM", ["<unk>", "<s>", "</s>", "[INST]", "[/INST]"], MISTRAL_TEMPLATE,
        # No pad token either; <unk> pads, as many Mistral fine-tunes set it.
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<unk>"}, "</s>",
        config={**_ROPE, "sliding_window": None}),
    "phi3": TextSpec(
        "Phi3Config", "Phi3ForCausalLM",
        ["<unk>", "<s>", "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"], PHI3_TEMPLATE,
        {"bos_token": "<s>", "eos_token": "<|endoftext|>", "unk_token": "<unk>", "pad_token": "<|endoftext|>"},
        "<|end|>", config=_ROPE),
}

_NOTES = {
    "qwen2.5": "ChatML; a default system message when none is given",
    "qwen3": "ChatML; the template drops the `<think>` reasoning of turns before the last user message",
    "llama3": "header tokens per turn, `<|eot_id|>` ends a turn; no pad token in the real tokenizer",
    "gemma3": "no system role: the system prompt opens the first user turn; `<end_of_turn>` ends a turn",
    "mistral": "`[INST] ... [/INST]`; the template writes the system prompt into the last user turn only, the "
               "splice into every user turn",
    "phi3": "`<|user|> ... <|end|>`; a render without a generation prompt ends with eos",
}


def _text_builder(name: str) -> Callable[..., Path]:
    def build_family(out: Path, seed: int = 0, dtype: str = "float32") -> Path:
        return build_text(TEXT_SPECS[name], Path(out), seed, dtype)
    return build_family


for _name in TEXT_SPECS:
    register(Family(_name, "text", _text_builder(_name), _NOTES[_name]))


def build(family: str, out_dir: str | Path, seed: int = 0, dtype: str = "float32") -> Path:
    """Build and save a family's tiny model; a folder that already holds the same build is reused."""
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}: use one of {sorted(FAMILIES)}")
    if dtype not in tiny_models.DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: use one of {list(tiny_models.DTYPES)}")
    stamp = {"family": family, "seed": seed, "dtype": dtype}
    return tiny_models.build_once(Path(out_dir), stamp, lambda tmp: FAMILIES[family].build(tmp, seed, dtype))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Build a tiny random model of a family people post-train with GRPO.")
    ap.add_argument("--family", choices=sorted(FAMILIES), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=tiny_models.DTYPES, default="float32")
    a = ap.parse_args(argv)
    path = build(a.family, a.out, a.seed, a.dtype)
    print(json.dumps({"path": str(path), "family": a.family, "seed": a.seed, "dtype": a.dtype}))


from grpo.tools import families_vl  # noqa: E402  the vision families

for _name, _build, _notes in families_vl.VISION:
    register(Family(_name, "vision", _build, _notes))

if __name__ == "__main__":
    main()
