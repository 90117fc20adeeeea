"""How fast can on-policy RL climb from the warm start? A minimal GRPO-style loop in Hugging Face only.

LoRA on the language model (as the real trainer does), G sampled episodes per training maze at temperature
1, advantage = success - group mean, one on-policy gradient step per batch (so the PPO ratio is 1 and the
clipped loss is REINFORCE), token-mean loss over all generated tokens of the batch. Greedy success on the
64 eval mazes every few steps. Not the engine: a probe to size group and batch for the real one.

    python -m examples.maze.experiments.reinforce_probe --minutes 10 --mazes 8 --group 8
"""
from __future__ import annotations

import argparse
import json
import random
import time

import torch

import envs
from examples.maze import maze_config as mc
from examples.maze import sft


def sample_episodes(model, enc, seeds, group: int, temperature: float):
    """Every episode's turns as (prompt text, image, generated ids) and its success, all live turns batched."""
    from grpo.forward import expand

    eps = []
    for s in seeds:
        for _ in range(group):
            env = envs.make(mc.ENV, **mc.ENV_OPTIONS)
            first = env.reset(s)
            eps.append({"env": env, "first": first, "text": first.text, "image": first.images[0], "turns": [],
                        "seed": s, "success": False})
    live = eps
    model.eval()
    with torch.no_grad():
        while live:
            seqs = [expand(enc.processor, enc.prompt(e["text"]), [e["image"]]) for e in live]
            width = max(len(q.input_ids) for q in seqs)
            pad = enc.tok.pad_token_id
            ids = torch.full((len(seqs), width), pad, dtype=torch.long)
            attn = torch.zeros_like(ids)
            for i, q in enumerate(seqs):
                ids[i, width - len(q.input_ids):] = q.input_ids
                attn[i, width - len(q.input_ids):] = 1
            out = model.generate(
                input_ids=ids, attention_mask=attn, pixel_values=torch.cat([q.pixel_values for q in seqs]),
                image_grid_thw=torch.cat([q.image_grid_thw for q in seqs]),
                mm_token_type_ids=(ids == enc.processor.image_token_id).long(),
                max_new_tokens=mc.MAX_TOKENS_PER_TURN, do_sample=True, temperature=temperature, top_k=0,
                top_p=1.0, suppress_tokens=sorted(enc.chat.vision_ids),
                eos_token_id=enc.tok.eos_token_id, pad_token_id=pad)
            still = []
            for e, row in zip(live, out):
                gen = row[width:].tolist()
                if enc.tok.eos_token_id in gen:
                    gen = gen[: gen.index(enc.tok.eos_token_id) + 1]
                else:
                    gen = [t for t in gen if t != pad]
                e["turns"].append((e["text"], e["image"], gen))
                res = e["env"].step(enc.tok.decode(gen, skip_special_tokens=True))
                if res.done:
                    e["success"] = bool(res.info["success"])
                else:
                    e["text"] = f"{e['first'].text}\n{res.observation.text}"
                    e["image"] = res.observation.images[0]
                    still.append(e)
            live = still
    model.train()
    return eps


def policy_step(model, enc, opt, eps, group: int, micro: int) -> dict:
    from grpo.forward import collate, expand, token_logprobs

    rewards = torch.tensor([float(e["success"]) for e in eps]).view(-1, group)
    adv = (rewards - rewards.mean(1, keepdim=True)).view(-1)
    items = [(a.item(), t) for a, e in zip(adv, eps) if a != 0 for t in e["turns"]]
    n_tokens = sum(len(t[2]) for _, t in items)
    opt.zero_grad(set_to_none=True)
    for i in range(0, len(items), micro):
        chunk = items[i:i + micro]
        seqs = []
        for a, (text, image, gen) in chunk:
            p = enc.prompt(text)
            seqs.append(expand(enc.processor, p + gen, [image], [torch.tensor([0] * len(p) + [1] * len(gen))]))
        batch = collate(enc.processor, seqs, enc.tok.pad_token_id)
        lp = token_logprobs(model, batch, mask=batch.per_token[0])
        a = torch.tensor([a for a, _ in chunk])
        (-(lp.sum(1) * a).sum() / max(n_tokens, 1)).backward()
    if items:
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        opt.step()
    mixed = int(((rewards > 0).any(1) & (rewards < 1).any(1)).sum())
    return {"sampled_success": rewards.mean().item(), "mixed_groups": mixed, "trained_turns": len(items)}


def main(argv=None):
    from grpo.forward import load_model, load_processor
    from grpo.lora import LoraSettings, apply_lora

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(mc.WARMSTART))
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--mazes", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--micro", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)
    enc = sft.Encoder(load_processor(a.model))
    model = apply_lora(load_model(a.model), LoraSettings(rank=a.rank, alpha=2.0 * a.rank))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=a.lr, weight_decay=0.0)
    t0 = time.perf_counter()

    def evaluate(step):
        te = time.perf_counter()
        s = sft.summarize(sft.greedy_episodes(model, enc, mc.EVAL_SEEDS, mc.ENV_OPTIONS))
        eval_s[0] += time.perf_counter() - te
        print(json.dumps({"step": step, "eval_success": s["success"], "ended": s["ended"],
                          "eval_s": round(time.perf_counter() - te, 1),
                          "train_wall_s": round(time.perf_counter() - t0 - eval_s[0], 1)}), flush=True)

    eval_s = [0.0]
    evaluate(0)
    step = 0
    while time.perf_counter() - t0 - eval_s[0] < a.minutes * 60:
        seeds = [rng.randrange(2_000_000, 3_000_000) for _ in range(a.mazes)]
        tr = time.perf_counter()
        eps = sample_episodes(model, enc, seeds, a.group, a.temperature)
        rollout_s = time.perf_counter() - tr
        tu = time.perf_counter()
        stats = policy_step(model, enc, opt, eps, a.group, a.micro)
        step += 1
        print(json.dumps({"step": step, **stats, "rollout_s": round(rollout_s, 1),
                          "update_s": round(time.perf_counter() - tu, 1)}), flush=True)
        if step % a.eval_every == 0:
            evaluate(step)
    evaluate(step)


if __name__ == "__main__":
    main()
