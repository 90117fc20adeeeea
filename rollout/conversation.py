"""Token ids of a multi-turn conversation, built from the model's own chat template.

Token ids are the source of truth: an episode is the prompt's ids, then per turn the ids vLLM sampled and
the ids of the observation appended through the chat template. The model's text is never decoded and
re-encoded into the sequence. The template pieces come from rendering the template twice and taking the
difference, so any Hugging Face chat template works, not just the tiny models'.
"""
from __future__ import annotations

import json

from envs.base import Observation
from rollout.models import image_token_id, tokenizer_of, vision_token_ids
from rollout.tool_calls import detect_format

_MARK = "\u2063GRPO-MARK\u2063"  # an assistant message no real text contains, to cut the template around


class ChatFormat:
    def __init__(self, processor, system_prompt: str | None = None, tools: list[dict] | None = None):
        self.processor = processor
        self.tok = tokenizer_of(processor)
        self.system_prompt = system_prompt
        # Tool schemas the template renders into the prompt (an env's tools); None: the template's no-tools form.
        self.tools = tools
        self.image_token_id = image_token_id(processor)
        self.vision_ids = set(vision_token_ids(processor))
        if self.tok.chat_template is None and getattr(processor, "chat_template", None) is None:
            raise ValueError(
                f"the tokenizer of {getattr(self.tok, 'name_or_path', '?')} has no chat template: multi-turn "
                "rollouts need one; save the model with a tokenizer that defines `chat_template`")
        self.eos_ids = self._eos_ids()
        self._end = self._conversation_end()
        # What the template writes after an assistant message: the end-of-turn ids.
        history = self._render(self._head() + [{"role": "assistant", "content": _MARK}], False)
        self.close_ids = self._ids(history[history.index(_MARK) + len(_MARK):len(history) - len(self._end)])
        # The family's end-of-turn token (Llama 3's <|eot_id|>, Gemma's <end_of_turn>, Phi's <|end|>) ends a
        # reply as eos does.
        added = self.tok.added_tokens_decoder
        if self.close_ids and self.close_ids[0] in added and added[self.close_ids[0]].special:
            self.eos_ids.add(self.close_ids[0])

    def with_tools(self, tools: list[dict]) -> "ChatFormat":
        """This format with `tools` (OpenAI function schemas) rendered into the prompt; one per tool list."""
        cache = self.__dict__.setdefault("_with_tools", {})
        key = json.dumps(tools, sort_keys=True)
        if key not in cache:
            cache[key] = ChatFormat(self.processor, self.system_prompt, tools)
        return cache[key]

    @property
    def tool_format(self) -> str | None:
        """The tool-call format the chat template writes (rollout.tool_calls.FORMATS), None: it renders none."""
        return detect_format(getattr(self.processor, "chat_template", None) or self.tok.chat_template)

    def _special_id(self, token: str) -> int | None:
        i = self.tok.convert_tokens_to_ids(token)
        return i if isinstance(i, int) and i != self.tok.unk_token_id and i >= 0 else None

    def _eos_ids(self) -> set[int]:
        ids = {self.tok.eos_token_id} if self.tok.eos_token_id is not None else set()
        end = self._special_id("<|im_end|>")
        if end is not None:
            ids.add(end)
        return ids

    def _conversation_end(self) -> str:
        """What the template writes only at the end of a conversation rendered without a generation prompt
        (Phi-3 and Phi-4 write eos there): not part of a turn."""
        eos = self.tok.eos_token or ""
        closed, opened = self._render(self._head(), False), self._render(self._head(), True)
        if eos and closed.endswith(eos) and not opened.startswith(closed):
            return eos
        return ""

    def _head(self) -> list[dict]:
        msgs = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return msgs + [{"role": "user", "content": "x"}]

    def _render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        render = self.processor if getattr(self.processor, "chat_template", None) else self.tok
        if self.tools:
            return render.apply_chat_template(messages, tools=self.tools, tokenize=False,
                                              add_generation_prompt=add_generation_prompt)
        return render.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def _ids(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def _user(self, obs: Observation) -> dict:
        if not obs.images:
            return {"role": "user", "content": obs.text}
        if self.image_token_id is None:
            raise ValueError("the environment returned images but the model has no image token: use a "
                             "vision-language model, or an environment option that renders text only")
        return {"role": "user", "content": [{"type": "image"}] * len(obs.images) + [{"type": "text", "text": obs.text}]}

    def prompt_ids(self, obs: Observation) -> list[int]:
        """The first turn: system prompt (if any), the first observation (or its messages), then the assistant's
        opening."""
        head = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        if obs.messages:
            messages = [dict(m) for m in obs.messages]
            messages[-1] = {**messages[-1], "content": self._user(Observation(messages[-1]["content"],
                                                                               obs.images))["content"]}
            if messages[0].get("role") == "system":
                head = []
            return self._ids(self._render(head + messages, True))
        return self._ids(self._render(head + [self._user(obs)], True))

    def observation_ids(self, obs: Observation, generated: list[int]) -> list[int]:
        """Ids to append after the model's turn: close it, the observation as a user turn, the next opening."""
        return self._after_reply({"role": "assistant", "content": _MARK}, [self._user(obs)], generated)

    def tool_result_ids(self, calls: list[dict], results: list[dict], generated: list[int]) -> list[int]:
        """Ids to append after a reply that called tools: close it, the `tool` messages `results` (role, content,
        tool_call_id) as the template renders them, the next opening. `calls` are the reply's parsed calls as
        `tool_calls` entries (empty when none could be read); the reply itself stays the model's own ids."""
        reply = {"role": "assistant", "content": _MARK}
        if calls:
            try:
                return self._after_reply({**reply, "tool_calls": calls}, results, generated)
            except Exception:  # a template that refuses these calls (Llama 3.1: one per message)
                pass
        return self._after_reply(reply, results, generated)

    def _after_reply(self, reply: dict, following: list[dict], generated: list[int]) -> list[int]:
        before = self._render(self._head() + [reply], False)
        before = before[:len(before) - len(self._end)]
        after = self._render(self._head() + [reply] + following, True)
        if not after.startswith(before):
            # Qwen3 renders the last assistant turn with a think block and drops it once a user turn follows:
            # the model's own ids stand for its turn, so only what the template writes after it must agree.
            before, after = before[before.index(_MARK):], after[after.index(_MARK):]
        if not after.startswith(before):
            raise ValueError("the chat template renders an assistant turn's end differently once a turn is "
                             "added; multi-turn token ids cannot be appended turn by turn with this template")
        suffix = self._ids(after[len(before):])
        close = list(self.close_ids)
        # vLLM keeps the end-of-turn token it sampled; the template's closing must not repeat it.
        if generated and generated[-1] in self.eos_ids and close and close[0] == generated[-1]:
            close = close[1:]
        return close + suffix

    def action_text(self, generated: list[int]) -> str:
        """What the env receives: the sampled ids decoded, without the end-of-turn token.

        Decoded from the ids themselves, not vLLM's streamed text, which holds back a trailing incomplete
        UTF-8 sequence: the env must see exactly what the trajectory's ids say.
        """
        ids = generated[:-1] if generated and generated[-1] in self.eos_ids else generated
        return self.tok.decode(ids)

    def drop_images(self, ids: list[int]) -> list[int]:
        """The same ids with every image placeholder (and its vision start/end markers) removed."""
        return [i for i in ids if i not in self.vision_ids]
