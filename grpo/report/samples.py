"""What a step's episodes did, readable: decoded episodes (samples.jsonl, eval_samples.jsonl) and the mean of
each reward function an env reports (`reward/<name>` in metrics).

Decoding is for display only: training reads the trajectories' token ids and never re-encodes this text.
"""
from __future__ import annotations

import json
import threading
from pathlib import Path

from grpo.report.metrics import append, json_safe


def decode_episode(traj, tokenizer, vision_ids=()) -> dict:
    """One episode as text: the first prompt, then per turn the reply, its reward and the env's feedback (the
    tokens the next turn's context added, chat-template markers included: what the model saw). The last
    turn's feedback is None: the episode ended, its final observation never entered a context."""
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    contexts, replies = _contexts_and_replies(traj, set(vision_ids))
    feedback = [decode(ids) for ids in contexts[1:]] + [None]
    turns = [{"reply": decode(r), "reward": rw, "feedback": fb}
             for r, rw, fb in zip(replies, traj.turn_rewards, feedback)]
    return {"seed": traj.seed, "group": traj.group_id, "adapter_version": traj.adapter_version,
            "reward": traj.reward, "success": bool(traj.success), "stop_reason": traj.stop_reason,
            "num_turns": traj.num_turns, "parse_errors": traj.parse_errors,
            "rewards": (traj.info or {}).get("rewards"), "prompt": decode(contexts[0]) if contexts else None,
            "images": sum(len(s.images) for s in traj.segments),
            "turns": turns, "info": json_safe(traj.info or {})}


def _contexts_and_replies(traj, vision_ids: set) -> tuple[list[list[int]], list[list[int]]]:
    """The prompt and each turn's new context tokens, and each turn's reply tokens.

    With the whole history kept an episode is one segment: context, reply, context, reply, ... With one segment
    per turn, turn k's new tokens are what its context adds to the previous segment with images dropped
    (history "text"), or to the first prompt (history "none": each turn re-renders the first observation)."""
    contexts, replies = [], []
    first = None
    previous = None
    for seg, spans in zip(traj.segments, traj.turn_spans()):
        ids, pos = seg.token_ids, 0
        for start, end in spans:
            context = ids[pos:start]
            if pos == 0 and previous is not None:
                kept = [i for i in previous if i not in vision_ids]
                base = kept if context[:len(kept)] == kept else first
                context = context[_common_prefix(context, base):]
            if first is None:
                first = context
            contexts.append(context)
            replies.append(ids[start:end])
            pos = end
        previous = ids
    return contexts, replies


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def pick(trajs: list, n: int) -> list:
    """`n` episodes spread evenly over the batch (so over its groups), in order."""
    if n <= 0 or not trajs:
        return []
    n = min(n, len(trajs))
    return [trajs[i * len(trajs) // n] for i in range(n)]


def reward_components(trajs) -> dict[str, float]:
    """The mean of each reward function an env reports in its final `info["rewards"]`, over the episodes that
    report it: {} for envs that report none."""
    totals: dict[str, list[float]] = {}
    for t in trajs:
        for name, value in ((t.info or {}).get("rewards") or {}).items():
            totals.setdefault(str(name), []).append(float(value))
    return {name: sum(v) / len(v) for name, v in totals.items()}


_DECODERS: dict[str, tuple] = {}
_DECODERS_LOCK = threading.Lock()


def decoder(model: str) -> tuple:
    """The model's tokenizer and its vision marker ids, loaded once a process."""
    with _DECODERS_LOCK:
        if model not in _DECODERS:
            from transformers import AutoTokenizer

            from rollout.models import vision_token_ids

            tokenizer = AutoTokenizer.from_pretrained(model)
            _DECODERS[model] = (tokenizer, vision_token_ids(tokenizer))
        return _DECODERS[model]


def _preload(model: str) -> None:
    try:
        decoder(model)
    except Exception:  # write() loads it again, and raises there, where the error can be acted on
        pass


class SampleWriter:
    """Appends decoded episodes to a JSONL file, one line an episode, with the fields given (step, label).

    The tokenizer loads in a background thread from construction: in a training driver the first write, the
    eval before training, would otherwise wait for transformers' import (about 2 s) before the first step."""

    def __init__(self, path: str | Path, model: str):
        self.path, self.model = Path(path), model
        threading.Thread(target=_preload, args=(model,), name="grpo-sample-decoder", daemon=True).start()

    def write(self, trajs, **fields) -> int:
        if not trajs:
            return 0
        tokenizer, vision_ids = decoder(self.model)
        lines = [json.dumps(dict(fields, **decode_episode(t, tokenizer, vision_ids)), ensure_ascii=False) + "\n"
                 for t in trajs]
        append(self.path, "".join(lines).encode())
        return len(trajs)
