# ruff: noqa: E501  the templates are the published ones, line for line
"""The published chat templates of three families with their tool branches, for the tiny family builds
(grpo/tools/families.py writes the templates without tools): each renders `tools`, an assistant message's
`tool_calls` and `tool` messages as the real instruct checkpoint's template does.

- Qwen2.5-Instruct: tools in the system turn, calls as `<tool_call>` JSON, results as `<tool_response>` in a
  user turn (the Hermes format; Qwen3's template writes the same).
- Llama 3.1-Instruct: tools in the first user turn, a call is the reply `{"name": ..., "parameters": ...}`,
  results in an `ipython` turn.
- Mistral-7B-Instruct-v0.3: `[AVAILABLE_TOOLS]` before the last user turn, calls after `[TOOL_CALLS]`,
  results in `[TOOL_RESULTS]`.

And one that is not published: SMOLLM2, a tool branch of our own for the real SmolLM2-Instruct, whose
template has none (`pretrained_with_tools` writes it into a folder of the pulled model).

    python -m examples.tools.templates --family qwen2.5 --out runs/models/qwen2.5-tools
"""
from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

QWEN2_5 = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

# SmolLM2-Instruct's published template is plain ChatML with no tool branch: this one is ours, QWEN2_5's Hermes
# form with SmolLM2's default system prompt. Without tools it renders exactly as SmolLM2's own (the same ChatML,
# that default when the conversation has no system turn); with tools, the tools go in the system turn inside
# <tools></tools>, calls as `<tool_call>` JSON, results as `<tool_response>` in a user turn.
SMOLLM2 = QWEN2_5.replace("You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
                          "You are a helpful AI assistant named SmolLM, trained by Hugging Face")

# Llama 3.1-Instruct's template, the custom-tools part (no built-in tools, no date lines).
LLAMA3_1 = """{{- bos_token }}
{%- if not tools_in_user_message is defined %}{%- set tools_in_user_message = true %}{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{%- if system_message or (tools is not none and not tools_in_user_message) %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- endif %}
{%- if tools_in_user_message and not tools is none %}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
    {%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable and message.content is not string %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

MISTRAL_V0_3 = """{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}
{%- for message in loop_messages | rejectattr("role", "equalto", "tool") | rejectattr("role", "equalto", "tool_results") | selectattr("tool_calls", "undefined") %}
    {%- if (message["role"] == "user") != (loop.index0 % 2 == 0) %}
        {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif %}
{%- endfor %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
        {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\\n\\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
"""

TEMPLATES = {"qwen2.5": QWEN2_5, "llama3": LLAMA3_1, "mistral": MISTRAL_V0_3}


def build(family: str, out: str | Path, seed: int = 0) -> Path:
    """The tiny `family` model (grpo.tools.families) with its published tool-calling template; a folder that
    already holds the same build is reused."""
    from transformers import AutoTokenizer

    from grpo.tools import families, tiny_models

    if family not in TEMPLATES:
        raise ValueError(f"no tool template for family {family!r}: use one of {sorted(TEMPLATES)}")
    template = TEMPLATES[family]
    stamp = {"family": family, "seed": seed, "tool_template": hashlib.sha256(template.encode()).hexdigest()[:16]}

    def make(tmp: Path) -> None:
        families.FAMILIES[family].build(tmp, seed, "float32")
        tok = AutoTokenizer.from_pretrained(tmp)
        tok.chat_template = template
        tok.save_pretrained(tmp)

    return tiny_models.build_once(Path(out), stamp, make)


def pretrained_with_tools(name: str = "smollm2-135m-instruct", out: str | Path | None = None) -> Path:
    """The pulled pretrained model `name` (rollout/pretrained.py) with SMOLLM2, our tool branch, as its chat
    template: a folder of links to its weights and config beside the re-saved tokenizer, reused while the
    template is the same."""
    from transformers import AutoTokenizer

    from grpo.tools import tiny_models
    from rollout import pretrained

    if name != "smollm2-135m-instruct":
        raise ValueError(f"no tool template for {name!r}: only smollm2-135m-instruct has one here (SMOLLM2)")
    src = pretrained.resolve(name).resolve()
    out = Path(out or f"runs/models/{name}-tools")
    stamp = {"model": name, "source": str(src), "tool_template": hashlib.sha256(SMOLLM2.encode()).hexdigest()[:16]}

    def make(tmp: Path) -> None:
        tmp.mkdir(parents=True)
        # The weights are linked, not copied (270 MB): only the tokenizer's template differs.
        for f in src.iterdir():
            if f.suffix == ".safetensors" or f.name in ("config.json", "generation_config.json", pretrained.SOURCE_FILE):
                (tmp / f.name).symlink_to(f)
        tok = AutoTokenizer.from_pretrained(src)
        tok.chat_template = SMOLLM2
        tok.save_pretrained(tmp)

    return tiny_models.build_once(out, stamp, make)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="A tiny family model with its published tool-calling template.")
    ap.add_argument("--family", choices=sorted(TEMPLATES), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    print(json.dumps({"path": str(build(a.family, a.out, a.seed)), "family": a.family}))


if __name__ == "__main__":
    main()
