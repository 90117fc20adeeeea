"""The tool example's warm start: the tiny Qwen2.5 (examples/tools/templates.py) trained from scratch on
episodes built exactly as the rollout worker builds them (ChatFormat with the `look` tool's schema: the
prompt, the reply, the `tool` message, the answer), where a share CALL_SHARE of the demonstrations calls
`look` and answers with its result, and the rest guess a color at once. The model learns both habits; its
greedy choice guesses, so greedy success starts near one in four, while sampling calls the tool often
enough that GRPO sees which habit pays.

    python -m examples.tools.sft                  # rebuilds examples/tools/warmstart/
    python -m examples.tools.sft --out /tmp/ws --steps 300

Every `--eval-every` steps, teacher-forced on the eval questions' calling demonstrations: `p_call` (the
probability of opening a call) and `copy_exact` (the share whose every other reply token is the argmax: the
greedy success once the model calls). Training stops at the first evaluation past the copy phase and
SETTLE_STEPS with `copy_exact` >= `--stop-copy`; then greedy success is measured with Hugging Face
`generate` on the worker's exact ids (the shipped warm start: 29.7%, what vLLM's greedy eval measures too).
All of it goes to sft_log.jsonl beside the weights. The model, the data and their order are seeded.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

from envs.base import Observation
from envs.tools import ToolCall, as_toolset
from examples.tools import templates
from examples.tools.task import COLORS, LookEnv, question
from grpo.config import RunConfig
from rollout import tool_calls
from rollout.conversation import ChatFormat

HERE = Path(__file__).resolve().parent
RUN = RunConfig.from_yaml(HERE / "cpu.yaml")
WARMSTART = HERE / "warmstart"
CALL_SHARE = 0.25  # demonstrations that call `look`; the others guess
# The first `--copy-steps` steps call in this share of the demonstrations: answering with the tool's result
# is what the model must learn first, and only calls teach it.
COPY_PHASE_SHARE = 0.9
CALL = '<tool_call>\n{"name": "look", "arguments": {}}\n</tool_call>'
SETTLE_STEPS = 150  # after the copy phase, steps of CALL_SHARE before training may stop


def tool_schemas() -> list[dict]:
    env = LookEnv()
    env.reset(0)
    return as_toolset(env.tools).schemas


def chat_format(tok) -> ChatFormat:
    return ChatFormat(tok, RUN.rollout.system_prompt).with_tools(tool_schemas())


def episode(chat: ChatFormat, seed: int, call: bool) -> tuple[list[int], list[int]]:
    """One demonstration's ids and loss mask (1 on the replies and their end of turn); `call`: the calling habit."""
    text, color = question(seed)
    eot = chat.tok.convert_tokens_to_ids("<|im_end|>")
    ids = chat.prompt_ids(Observation(text))
    mask = [0] * len(ids)

    def reply(s: str) -> list[int]:
        r = chat._ids(s) + [eot]
        ids.extend(r)
        mask.extend([1] * len(r))
        return r

    if call:
        generated = reply(CALL)
        made = ToolCall("look", {}, tool_calls.call_id(0))
        result = [{"role": "tool", "tool_call_id": made.id, "name": made.name, "content": color}]
        suffix = chat.tool_result_ids([made.as_message_call()], result, generated)
        ids.extend(suffix)
        mask.extend([0] * len(suffix))
        reply(color)
    else:
        reply(random.Random(seed).choice(COLORS))  # a guess, right one time in four
    return ids, mask


@torch.no_grad()
def habits(model, chat: ChatFormat, seeds: list[int]) -> dict:
    """On the eval questions' calling demonstrations, teacher-forced: the mean probability of opening a call
    (the habit GRPO should raise), and the share whose every other reply token is the argmax (the greedy
    success once the model always calls)."""
    rows = [episode(chat, s, call=True) for s in seeds]
    ids, mask, attn = _batch(rows, chat.tok.pad_token_id)
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
    target, m = ids[:, 1:], mask[:, 1:].bool()
    first = m.float().argmax(1)
    probs = logits.softmax(-1).gather(2, target.unsqueeze(2)).squeeze(2)
    p_call = probs[torch.arange(len(rows)), first].mean().item()
    right = (logits.argmax(-1) == target) | ~m
    right[torch.arange(len(rows)), first] = True
    return {"p_call": round(p_call, 3), "copy_exact": right.all(1).float().mean().item()}


def _batch(rows, pad: int):
    width = max(len(r[0]) for r in rows)
    ids = torch.tensor([r[0] + [pad] * (width - len(r[0])) for r in rows])
    mask = torch.tensor([r[1] + [0] * (width - len(r[1])) for r in rows], dtype=torch.float32)
    attn = torch.tensor([[1] * len(r[0]) + [0] * (width - len(r[0])) for r in rows])
    return ids, mask, attn


@torch.no_grad()
def greedy_success(model, chat: ChatFormat, seeds: list[int]) -> float:
    """The rollout's greedy episodes on `seeds`, with Hugging Face generate on the same ids."""
    eot = chat.tok.convert_tokens_to_ids("<|im_end|>")
    wins = 0
    for seed in seeds:
        env = LookEnv()
        ids = chat.prompt_ids(env.reset(seed))
        toolset = as_toolset(env.tools)
        for _ in range(RUN.rollout.max_turns):
            out = model.generate(torch.tensor([ids]), max_new_tokens=RUN.rollout.max_tokens_per_turn, do_sample=False,
                                 eos_token_id=eot, pad_token_id=chat.tok.pad_token_id)
            gen = out[0, len(ids):].tolist()
            ids = ids + gen
            action = chat.action_text(gen)
            _, calls = tool_calls.parse(chat.tool_format, action)
            if not calls:
                wins += int(env.step(action).info["success"])
                break
            msgs = [{"role": "tool", "tool_call_id": c.id, "name": c.name or "", "content": toolset.run(c).content}
                    for c in calls]
            readable = [] if any(c.error for c in calls) else [c.as_message_call() for c in calls]
            ids = ids + chat.tool_result_ids(readable, msgs, gen)
    return wins / len(seeds)


def train(out: Path, steps: int, batch: int, lr: float, eval_every: int, copy_steps: int = 0, stop_copy: float = 1.0,
          greedy: bool = True, seed: int = 0) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    base = templates.build("qwen2.5", out.with_name(out.name + ".base"), seed=seed)
    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    chat = chat_format(tok)
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50))
    log, t0, next_seed = [], time.time(), RUN.train_seed_offset
    for step in range(1, steps + 1):
        share = COPY_PHASE_SHARE if step <= copy_steps else CALL_SHARE
        rows = [episode(chat, next_seed + i, rng.random() < share) for i in range(batch)]
        next_seed += batch
        ids, mask, attn = _batch(rows, tok.pad_token_id)
        model.train()
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
        loss = (nll * mask[:, 1:]).sum() / mask[:, 1:].sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % eval_every == 0 or step == steps:
            model.eval()
            rec = {"step": step, "loss": round(loss.item(), 4), "wall_s": round(time.time() - t0, 1),
                   **habits(model, chat, RUN.eval_seeds)}
            last = step == steps or (rec["copy_exact"] >= stop_copy and step >= copy_steps + SETTLE_STEPS)
            if last and greedy:
                rec["greedy_success"] = greedy_success(model, chat, RUN.eval_seeds)
            log.append(rec)
            print(json.dumps(rec), flush=True)
            if last:
                break
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    (tmp / "sft_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    shutil.rmtree(base, ignore_errors=True)
    return log[-1]


def ensure_warmstart() -> Path:
    """The shipped warm start; rebuilt with the defaults when missing."""
    if not (WARMSTART / "model.safetensors").exists():
        main([])
    return WARMSTART


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="SFT warm start of the tool example.")
    ap.add_argument("--out", default=str(WARMSTART))
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--copy-steps", type=int, default=200, help="steps of the copy phase (COPY_PHASE_SHARE)")
    ap.add_argument("--stop-copy", type=float, default=0.95,
                    help="stop at the first evaluation where this share of the calling episodes is copied exactly")
    ap.add_argument("--no-greedy", action="store_true", help="skip the final greedy evaluation (about 2 min)")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    print(json.dumps(train(Path(a.out), a.steps, a.batch, a.lr, a.eval_every, a.copy_steps, a.stop_copy,
                           not a.no_greedy)))


if __name__ == "__main__":
    main()
