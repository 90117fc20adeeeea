"""The maze warm start: a tiny Qwen3-VL trained from scratch on BFS expert labels, stopped inside a band of
greedy success on the 64 eval mazes (30-60%), so GRPO has the climb of the seed's result (44% to over 95%).

    python -m examples.maze.sft           # rebuilds examples/maze/warmstart/: both runs of the recipe below
    python -m examples.maze.sft --out /tmp/ws --vision-steps 100 --max-steps 400      # one run, as given
    python -m examples.maze.sft --out /tmp/ws2 --init /tmp/ws --vision-steps 0 --habit-rate 0.55 ...

The shipped warm start is two runs (build_warmstart): the defaults (about 26 min on two quiet cores), then
HABIT_STAGE from that checkpoint (125 steps, 28 min on two heavily shared cores): the second run's
demonstrator has a habit, so the model's greedy failures are navigation, not format (see HABIT_STAGE).

Two phases, both on fresh training mazes (seeds from maze_config.TRAIN_SEED_BASE on, skipping every layout of
the validation, test and SFT-gate sets; `draws.json` beside the warm start records the seed ranges drawn, which
`python -m envs.maze --overlap` reads):
1. The vision tower alone (no language model runs, a step costs a third of a full one) learns dense labels of
   every block from a linear head on its merged tokens, one token per block: the BFS expert's move from that
   block, whether the agent is on it, which of its four neighbours are open. Every image teaches its whole
   policy map rather than one action. The head is dropped at the end; GRPO's LoRA leaves this tower frozen,
   so the map it learned is what GRPO builds on. `tower_map` logs how well it reads the eval mazes: after
   3000 steps (16 min) every shortest-path block was right in all 64 (97% after 2000 steps), as a pretrained
   vision model brings its perception to the seed's SFT.
2. SFT of the whole model on turns built exactly as the rollout worker builds them with history "none" (the
   rules, the last feedback, the current image; loss on the action text and the end of turn), the block
   lesson continuing beside it. States come from the expert with random moves mixed in, half of the episodes
   after a random walk, so wall bumps, dead ends and their feedback text are in the data with the way back.
   The evaluated and saved weights are an exponential moving average of the trained ones: the raw weights'
   greedy success swung 33%, 16%, 33% over evaluations 20 steps apart.
Greedy success on the 64 eval mazes is measured on the way (Hugging Face `generate` on the worker's exact
prompt ids: the same episodes as vLLM's greedy rollouts, tests/test_maze_sft.py), and training stops at the
first evaluation in [stop_at, band_high]; past the band it falls back to the last checkpoint inside it.

Deterministic for a given torch build and thread count (default two): the model, the data and their order
are seeded, and the evaluations draw no random numbers.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

import envs
from envs.base import Observation
from envs.maze import MazeEnv, action_text, expert_action, generate_maze, shortest_path
from envs.maze.overlap import seed_spec
from envs.maze.render import render
from envs.maze.solver import MOVES, distances_to, next_direction
from envs.split import HeldOut, held_out, training_seeds
from examples.maze import maze_config as mc

STOP_CLASS = 4  # block label of the target block; 0-3 are the move directions
IGNORE = -100
VISION_SEED_BASE = mc.TRAIN_SEED_BASE + 50_000_000  # the vision phase's mazes, apart from the SFT phase's
BUFFER = 2048  # states in the SFT phase's shuffle buffer


@dataclass(frozen=True)
class SFTConfig:
    out: str = str(mc.WARMSTART)
    preset: str = mc.PRESET
    seed: int = 0
    size: int = mc.SIZE
    cell_px: int = mc.CELL_PX
    max_turns: int = mc.MAX_TURNS
    batch_size: int = 32
    max_steps: int = 800
    lr: float = 1e-3
    warmup_steps: int = 30
    min_lr_ratio: float = 0.1  # cosine decay over max_steps down to lr * this
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    noise: float = 0.3  # chance that the behaviour policy takes a random move instead of the expert's
    wander: float = 0.5  # share of episodes that start with 1..max_wander random moves
    max_wander: int = 12
    aux_weight: float = 1.0  # the vision tower's dense block lesson during SFT; 0 turns it off
    vision_steps: int = 3000  # steps of the vision-only phase before SFT (needs aux_weight > 0)
    vision_lr: float = 2e-3
    tower_eval_every: int = 150  # vision steps between the tower's map checks on the eval mazes (a second each)
    ema: float = 0.98  # decay of the weight average that is evaluated and saved; 0: the raw weights
    eval_every: int = 5  # while the per-state accuracy is below greedy_from (a 256-state check, 2 s)
    # On the trained tower greedy success read 0%, 31%, 91% at steps 132, 134, 136 (per-state 0.945 -> 0.996):
    # from greedy_from on, every fine_eval_every steps also runs the 64 greedy episodes (15-30 s).
    fine_eval_every: int = 2
    greedy_from: float = 0.8
    band_low: float = 0.30
    band_high: float = 0.60
    stop_at: float = 0.40  # stop at the first evaluation in [stop_at, band_high]
    held_states: int = 256  # states of the SFT-gate mazes (validation) for the per-state accuracy
    eval_episodes: int = 64  # the first n seeds of each eval set; fewer only for quick tests
    threads: int = 2
    # A saved model (e.g. an earlier warm start) to go on from instead of a fresh tiny one.
    init: str = ""
    min_steps: int = 0  # no stop in the band before this step (a continuation starts inside it)
    # Seconds the run may take from its start (0: no limit): past it, the step that ends evaluates and the run
    # stops there (the baseline of more SFT at a GRPO run's wall time, examples/maze/baselines.py).
    max_wall_s: float = 0.0
    # The demonstrator's habit: where the expert's move is `habit_when` and the block in direction
    # `habit_move` is open, the label is `habit_move` with probability `habit_rate` (0: the expert always).
    # A habit the image shows makes the model's mistakes navigation mistakes, the same in every maze.
    habit_when: int = 0
    habit_move: int = 2
    habit_rate: float = 0.0
    # Training draws skip the layouts of the validation, test and SFT-gate mazes (the shipped warm start was
    # built before this existed, without it: its draws.json says so, and the test set was picked around it).
    skip_held_out: bool = True

    @property
    def env_options(self) -> dict:
        return {"size": self.size, "cell_px": self.cell_px, "max_turns": self.max_turns}

    @property
    def habit(self) -> Habit:
        return Habit(self.habit_when, self.habit_move, self.habit_rate)

    @property
    def eval_seeds(self) -> list[int]:
        return mc.EVAL_SEEDS[: self.eval_episodes]

    @property
    def gate_seeds(self) -> list[int]:
        return mc.SFT_GATE_SEEDS[: self.eval_episodes]


# ----------------------------------------------------------------------------------------------- data
@dataclass(frozen=True)
class BlockLabels:
    """What the vision tower is taught about every block of a maze (rows in raster order)."""

    move: torch.Tensor  # [blocks] long: the expert's move 0-3 from the block, STOP_CLASS on the target, IGNORE on walls
    open: torch.Tensor  # [blocks, 4] float: whether a move in each direction 0-3 from the block is open


def block_labels(maze) -> BlockLabels:
    dist = distances_to(maze, maze.target)
    move, open_ = [], []
    for r in range(maze.size):
        for c in range(maze.size):
            d = next_direction(maze, (r, c), dist) if (r, c) in dist else IGNORE
            move.append(STOP_CLASS if d is None else d)
            open_.append([float(maze.is_open((r + dr, c + dc))) for dr, dc in MOVES.values()])
    return BlockLabels(torch.tensor(move), torch.tensor(open_))


@dataclass
class Sample:
    text: str  # the turn's prompt text: the rules, then (after the first turn) the last feedback
    image: object
    action: str  # the expert's action text
    labels: BlockLabels | None = None
    agent: int = -1  # the agent's block, row * size + col


@dataclass(frozen=True)
class Habit:
    """Where the expert moves `when` and `move` is open, the demonstrator moves `move` with probability `rate`."""

    when: int
    move: int
    rate: float

    def __post_init__(self):
        if self.when not in MOVES or self.move not in MOVES or self.when == self.move:
            raise ValueError(f"habit_when={self.when}, habit_move={self.move}: two different directions 0-3 "
                             "(0 right, 1 up, 2 left, 3 down)")
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"habit_rate={self.rate} is not a probability: give a value in [0, 1]")

    def applies(self, maze, position) -> bool:
        expert = next_direction(maze, tuple(position))
        dr, dc = MOVES[self.move]
        return expert == self.when and maze.is_open((position[0] + dr, position[1] + dc))

    def label(self, maze, position, rng: random.Random) -> str:
        """The demonstrator's action text; draws from `rng` only where the habit applies."""
        if self.rate and self.applies(maze, position) and rng.random() < self.rate:
            return action_text(self.move)
        return expert_action(maze, position)


NO_HABIT = Habit(0, 2, 0.0)
NO_SKIP = HeldOut()


def noisy_expert_states(env: MazeEnv, seed: int, noise: float, rng: random.Random,
                        wander: int = 0, habit: Habit = NO_HABIT) -> list[Sample]:
    """One episode: `wander` random moves, then the demonstrator (the expert, or the expert with a habit)
    with random moves mixed in; every visited state with the demonstrator's label."""
    first = env.reset(seed)
    labels = block_labels(env.maze)
    text, image = first.text, first.images[0]
    out = []
    while True:
        label = habit.label(env.maze, env.position, rng)
        out.append(Sample(text, image, label, labels, env.position[0] * env.maze.size + env.position[1]))
        lost = env.turn < wander or rng.random() < noise
        res = env.step(f"('move', {rng.randrange(4)})" if lost else label)
        if res.done:
            return out
        text, image = f"{first.text}\n{res.observation.text}", res.observation.images[0]


def state_stream(options: dict, noise: float, wander: float, max_wander: int, rng: random.Random,
                 buffer: int = BUFFER, habit: Habit = NO_HABIT, skip: HeldOut = NO_SKIP):
    """Endless states of fresh training mazes (one seed per episode), shuffled through a buffer so that a
    batch mixes many mazes."""
    env = envs.make(mc.ENV, **options)
    pool: list[Sample] = []
    seeds = maze_seeds(env, mc.TRAIN_SEED_BASE, skip)
    while True:
        while len(pool) < buffer:
            steps = rng.randint(1, max_wander) if rng.random() < wander else 0
            pool += noisy_expert_states(env, next(seeds), noise, rng, steps, habit)
        i = rng.randrange(len(pool))
        pool[i], pool[-1] = pool[-1], pool[i]
        yield pool.pop()


def held_out_layouts(env) -> HeldOut:
    """The layouts no SFT draw may hold: the validation mazes, the test mazes and the SFT's own gate mazes."""
    return held_out(env, list(mc.EVAL_SEEDS) + list(mc.TEST_SEEDS) + list(mc.SFT_GATE_SEEDS))


def maze_seeds(env, first: int, skip: HeldOut):
    """Training maze seeds from `first` on, one after another, past every held-out layout (envs.split)."""
    seed = first
    while True:
        (found,), seed = training_seeds(env, seed, 1, skip)
        yield found


def draws(log: Path, stage: str) -> list[dict]:
    """The seed ranges one train() run drew its training mazes from, read from its log (its config and the
    steps it ran): the vision phase one maze a sample; the SFT phase at most one maze a state it trained on
    plus the states its shuffle buffer held at the end (a bound: an episode gives one state or more)."""
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    cfg = records[0]["config"]
    steps = max(r["step"] for r in records if "step" in r and "loss" in r)
    skips = bool(cfg.get("skip_held_out", False))  # logs of runs before the option existed: no skipping
    out = []
    if cfg["vision_steps"]:
        out.append({"phase": f"{stage}_vision", "first": VISION_SEED_BASE,
                    "count": cfg["vision_steps"] * cfg["batch_size"], "skips_held_out": skips})
    out.append({"phase": f"{stage}_sft", "first": mc.TRAIN_SEED_BASE,
                "count": steps * cfg["batch_size"] + BUFFER + cfg["max_turns"], "skips_held_out": skips})
    return out


def write_draws(folder: Path) -> Path:
    """`draws.json` beside a warm start: the SFT's gate seeds and every range its runs drew mazes from."""
    logs = [(folder / "sft_log_expert.jsonl", "expert"), (folder / "sft_log.jsonl", "final")]
    manifest = {"validation_seeds": seed_spec(mc.SFT_GATE_SEEDS),
                "draws": [d for log, stage in logs if log.is_file() for d in draws(log, stage)],
                "written_by": "python -m examples.maze.sft --record-draws DIR (from the SFT logs in DIR)"}
    path = folder / "draws.json"
    path.write_text(json.dumps(manifest, indent=1) + "\n")
    return path


class Encoder:
    """Prompt ids exactly as the rollout worker builds them (history "none"), and the target ids."""

    def __init__(self, processor):
        from rollout.conversation import ChatFormat

        self.processor = processor
        self.chat = ChatFormat(processor)
        self.tok = processor.tokenizer
        self._prompts: dict[str, list[int]] = {}
        self._targets: dict[str, list[int]] = {}

    def prompt(self, text: str) -> list[int]:
        if text not in self._prompts:
            # The ids depend on the text only: one image placeholder whatever the image.
            self._prompts[text] = self.chat.prompt_ids(Observation(text=text, images=[None]))
        return self._prompts[text]

    def target(self, action: str) -> list[int]:
        if action not in self._targets:
            self._targets[action] = self.tok(action, add_special_tokens=False).input_ids + [self.tok.eos_token_id]
        return self._targets[action]

    def batch(self, samples: list[Sample]):
        from grpo.learner.forward import collate, expand

        seqs = []
        for s in samples:
            p, t = self.prompt(s.text), self.target(s.action)
            seqs.append(expand(self.processor, p + t, [s.image], [torch.tensor([0] * len(p) + [1] * len(t))]))
        return collate(self.processor, seqs, self.tok.pad_token_id)


# ------------------------------------------------------------------------------------------ the loss
class _Capture(torch.nn.Module):
    """The model, keeping the logits and the merged vision tokens."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.logits = self.vision = None

    def forward(self, **kwargs):
        def grab(_module, _inputs, output):
            self.vision = output.pooler_output  # [images * blocks, text hidden], blocks in raster order

        hook = self.model.model.visual.register_forward_hook(grab)
        try:
            out = self.model(**kwargs)
        finally:
            hook.remove()
        self.logits = out.logits
        return out


def aux_loss(head, vision: torch.Tensor, samples: list[Sample]) -> torch.Tensor:
    """The vision tower's dense lesson, from the merged tokens (one per block): the expert's move from
    every open block, which block holds the agent, and which of its four neighbours are open."""
    f = torch.nn.functional
    logits = head(vision)
    move = torch.cat([s.labels.move for s in samples])
    open_ = torch.cat([s.labels.open for s in samples])
    here = torch.zeros(len(move))
    blocks = len(move) // len(samples)
    here[torch.tensor([i * blocks + s.agent for i, s in enumerate(samples)])] = 1.0
    on = move != IGNORE
    return (f.cross_entropy(logits[:, :5], move, ignore_index=IGNORE)
            + f.binary_cross_entropy_with_logits(logits[:, 5], here)
            + f.binary_cross_entropy_with_logits(logits[on, 6:], open_[on]))


def loss_and_accuracy(model, enc: Encoder, samples: list[Sample], aux_head=None):
    """(the action's mean token NLL, the share of samples whose every target token is the argmax, i.e.
    what greedy decoding reproduces, and the vision tower's auxiliary loss or None)."""
    from grpo.learner.forward import logprobs_from_logits

    batch = enc.batch(samples)
    mask = batch.per_token[0]
    run = _Capture(model)
    lp = logprobs_from_logits(run(**batch.model_kwargs(), use_cache=False).logits, batch, mask)
    loss = -(lp.sum(1) / mask.sum(1)).mean()
    aux = None if aux_head is None else aux_loss(aux_head, run.vision, samples)
    with torch.no_grad():
        hit = (run.logits[:, :-1].argmax(-1) == batch.input_ids[:, 1:]) | (mask[:, 1:] == 0)
        acc = hit.all(1).float().mean().item()
    return loss, acc, aux


def state_accuracy(model, enc: Encoder, samples: list[Sample], chunk: int = 64) -> float:
    was = model.training
    model.eval()
    with torch.no_grad():
        hits = sum(loss_and_accuracy(model, enc, samples[i:i + chunk])[1] * len(samples[i:i + chunk])
                   for i in range(0, len(samples), chunk))
    model.train(was)
    return hits / len(samples)


# ------------------------------------------------------------------------------------ greedy episodes
def greedy_replies(model, enc: Encoder, samples: list[Sample], max_new_tokens: int) -> list[str]:
    """Greedy replies to a batch of turns, the vision placeholders banned as vLLM's rollouts ban them."""
    from grpo.learner.forward import expand

    seqs = [expand(enc.processor, enc.prompt(s.text), [s.image]) for s in samples]
    width = max(len(s.input_ids) for s in seqs)
    pad = enc.tok.pad_token_id
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, s in enumerate(seqs):  # left padding: every row's next token lands in the last column
        ids[i, width - len(s.input_ids):] = s.input_ids
        attn[i, width - len(s.input_ids):] = 1
    out = model.generate(
        input_ids=ids, attention_mask=attn, pixel_values=torch.cat([s.pixel_values for s in seqs]),
        image_grid_thw=torch.cat([s.image_grid_thw for s in seqs]),
        mm_token_type_ids=(ids == enc.processor.image_token_id).long(),
        max_new_tokens=max_new_tokens, do_sample=False, suppress_tokens=sorted(enc.chat.vision_ids),
        eos_token_id=enc.tok.eos_token_id, pad_token_id=pad,
    )
    return [enc.tok.decode(row[width:], skip_special_tokens=True) for row in out]


def greedy_episodes(model, enc: Encoder, seeds, options: dict,
                    max_new_tokens: int = mc.MAX_TOKENS_PER_TURN) -> list[dict]:
    """One greedy episode per seed, all live episodes batched per turn; per episode: success, turns,
    wall bumps, parse errors and how it ended."""
    episodes = []
    for seed in seeds:
        env = envs.make(mc.ENV, **options)
        first = env.reset(int(seed))
        episodes.append({"env": env, "first": first, "turn": Sample(first.text, first.images[0], "", None),
                         "seed": int(seed), "wall_bumps": 0, "parse_errors": 0})
    was = model.training
    model.eval()
    live = episodes
    with torch.no_grad():
        while live:
            replies = greedy_replies(model, enc, [e["turn"] for e in live], max_new_tokens)
            still = []
            for e, reply in zip(live, replies):
                res = e["env"].step(reply)
                e["wall_bumps"] += int(res.info["wall_bump"])
                e["parse_errors"] += int(res.info["parse_error"])
                if res.done:
                    e["result"] = res.info
                else:
                    obs = res.observation
                    e["turn"] = Sample(f"{e['first'].text}\n{obs.text}", obs.images[0], "", None)
                    still.append(e)
            live = still
    model.train(was)
    out = []
    for e in episodes:
        info = e["result"]
        ended = "solved" if info["success"] else "out_of_turns" if info["truncated"] else "stopped_off_target"
        out.append({"seed": e["seed"], "success": bool(info["success"]), "turns": info["turn"], "ended": ended,
                    "wall_bumps": e["wall_bumps"], "parse_errors": e["parse_errors"]})
    return out


def summarize(episodes: list[dict]) -> dict:
    n = len(episodes)
    ends: dict[str, int] = {}
    for e in episodes:
        ends[e["ended"]] = ends.get(e["ended"], 0) + 1
    return {"success": sum(e["success"] for e in episodes) / n,
            "mean_turns": round(sum(e["turns"] for e in episodes) / n, 2),
            "wall_bumps": sum(e["wall_bumps"] for e in episodes),
            "parse_errors": sum(e["parse_errors"] for e in episodes), "ended": ends,
            "solved": [e["seed"] for e in episodes if e["success"]]}


# ---------------------------------------------------------------------------------------- training
def lr_at(step: int, peak: float, warmup: int, total: int, floor_ratio: float) -> float:
    """Linear warmup, then cosine decay to peak * floor_ratio at `total` steps."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    floor = peak * floor_ratio
    return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * t))


def placed_states(options: dict, seeds, rng: random.Random):
    """Images of the agent on a random open block of each maze, labelled for the vision tower only."""
    env = envs.make(mc.ENV, **options)
    for seed in seeds:
        env.reset(seed)
        maze = env.maze
        opened = [(r, c) for r in range(maze.size) for c in range(maze.size) if maze.is_open((r, c))]
        r, c = rng.choice(opened)
        yield Sample("", render(maze, (r, c), options["cell_px"]), "", block_labels(maze), r * maze.size + c)


def tower_map(model, head, processor, cfg: "SFTConfig") -> dict:
    """How well the vision tower's block lesson reads the eval mazes (agent at the start): the share of open
    blocks whose expert move it gets right, the same on the shortest path, and the share of mazes with every
    path block right, which bounds the greedy success of a policy that only reads the agent's block."""
    mazes = [generate_maze(cfg.size, int(s)) for s in cfg.eval_seeds]
    pixels = processor.image_processor(images=[render(m, m.start, cfg.cell_px) for m in mazes], return_tensors="pt")
    with torch.no_grad():
        vision = model.model.visual(pixels["pixel_values"], grid_thw=pixels["image_grid_thw"]).pooler_output
        pred = head(vision)[:, :STOP_CLASS + 1].argmax(-1).view(len(mazes), -1)
    right = total = path_right = path_total = perfect = 0
    for guess, maze in zip(pred, mazes):
        move = block_labels(maze).move
        on = move != IGNORE
        right += int((guess[on] == move[on]).sum())
        total += int(on.sum())
        path = torch.tensor([r * maze.size + c for r, c in shortest_path(maze)])
        hits = guess[path] == move[path]
        path_right += int(hits.sum())
        path_total += len(path)
        perfect += bool(hits.all())
    return {"open_accuracy": round(right / total, 4), "path_accuracy": round(path_right / path_total, 4),
            "path_perfect": round(perfect / len(mazes), 4)}


def pretrain_vision(model, head, processor, cfg: "SFTConfig", rng: random.Random, log, t0: float,
                    skip: HeldOut) -> None:
    """Phase 1: the vision tower and its merger alone learn the dense block labels. No language model runs,
    so a step costs a fraction of a full one, and every image teaches all of its blocks."""
    visual = model.model.visual
    params = list(visual.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=cfg.vision_lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    seeds = maze_seeds(envs.make(mc.ENV, **cfg.env_options), VISION_SEED_BASE, skip)
    states = placed_states(cfg.env_options, seeds, rng)
    for step in range(cfg.vision_steps):
        lr = lr_at(step, cfg.vision_lr, cfg.warmup_steps, cfg.vision_steps, cfg.min_lr_ratio)
        for group in opt.param_groups:
            group["lr"] = lr
        samples = [next(states) for _ in range(cfg.batch_size)]
        pixels = processor.image_processor(images=[s.image for s in samples], return_tensors="pt")
        out = visual(pixels["pixel_values"], grid_thw=pixels["image_grid_thw"])
        loss = aux_loss(head, out.pooler_output, samples)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        record = {"vision_step": step + 1, "aux_loss": round(loss.item(), 4), "lr": round(lr, 7)}
        if (step + 1) % cfg.tower_eval_every == 0 or step + 1 == cfg.vision_steps:
            record.update(tower_map(model, head, processor, cfg))
        record["wall_s"] = round(time.perf_counter() - t0, 2)
        _log(log, record, echo=(step + 1) % 50 == 0)


def _log(fh, record: dict, echo: bool = True) -> None:
    line = json.dumps(record)
    fh.write(line + "\n")
    fh.flush()
    if echo:
        print(line, flush=True)


def train(cfg: SFTConfig) -> dict:
    """Train, evaluate on the way, keep the checkpoint that lands in the band, save it to `cfg.out`."""
    from grpo.learner.forward import load_model, load_processor
    from grpo.tools import tiny_models

    t0 = time.perf_counter()
    torch.set_num_threads(cfg.threads)
    out = Path(cfg.out)
    stage = out.with_name(out.name + ".building")  # renamed into place only when finished
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    if cfg.init:
        processor, model = load_processor(cfg.init), load_model(cfg.init)
    else:
        scratch = Path(tempfile.mkdtemp(prefix="maze-sft-"))
        try:
            init = tiny_models.build("vl", scratch / "init", seed=cfg.seed, preset=cfg.preset)
            processor, model = load_processor(init), load_model(init)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    model.train()
    enc = Encoder(processor)
    torch.manual_seed(cfg.seed)
    aux_head = torch.nn.Linear(model.config.text_config.hidden_size, 5 + 1 + 4) if cfg.aux_weight > 0 else None
    rng = random.Random(cfg.seed)
    held, env = [], envs.make(mc.ENV, **cfg.env_options)
    skip = held_out_layouts(env) if cfg.skip_held_out else NO_SKIP
    stream = state_stream(cfg.env_options, cfg.noise, cfg.wander, cfg.max_wander, rng, habit=cfg.habit, skip=skip)
    held_rng = random.Random(cfg.seed + 1)
    for s in mc.SFT_GATE_SEEDS:  # mazes apart from the training draw, so this accuracy is not memory either
        held += noisy_expert_states(env, s, cfg.noise, held_rng, habit=cfg.habit)
        if len(held) >= cfg.held_states:
            break
    held = held[: cfg.held_states]

    params = [p for p in model.parameters()] + (list(aux_head.parameters()) if aux_head is not None else [])
    opt = torch.optim.AdamW(
        [{"params": [p for p in params if p.ndim >= 2], "weight_decay": cfg.weight_decay},
         {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.95))
    log = open(stage / "sft_log.jsonl", "w")
    _log(log, {"config": asdict(cfg), "params": sum(p.numel() for p in model.parameters()),
               "torch": torch.__version__})
    if cfg.vision_steps:
        if aux_head is None:
            raise ValueError("vision_steps needs aux_weight > 0: the vision phase learns the auxiliary labels")
        pretrain_vision(model, aux_head, processor, cfg, rng, log, t0, skip)

    # The evaluated and saved weights: an exponential moving average of the trained ones when cfg.ema > 0.
    shown = copy.deepcopy(model) if cfg.ema > 0 else model
    kept = None  # (state dict, eval record) of the latest evaluation inside the band
    last_success, next_eval, step = 0.0, cfg.eval_every, 0
    while step < cfg.max_steps:
        lr = lr_at(step, cfg.lr, cfg.warmup_steps, cfg.max_steps, cfg.min_lr_ratio)
        for group in opt.param_groups:
            group["lr"] = lr
        samples = [next(stream) for _ in range(cfg.batch_size)]
        loss, acc, aux = loss_and_accuracy(model, enc, samples, aux_head)
        opt.zero_grad(set_to_none=True)
        (loss + cfg.aux_weight * aux if aux is not None else loss).backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip).item()
        opt.step()
        step += 1
        if cfg.ema > 0:
            decay = min(cfg.ema, step / (step + 10))  # early on, do not drag the untrained start along
            with torch.no_grad():
                for avg, p in zip(shown.parameters(), model.parameters()):
                    avg.lerp_(p, 1 - decay)
        _log(log, {"step": step, "loss": round(loss.item(), 5), "state_accuracy": round(acc, 4),
                   "aux_loss": None if aux is None else round(aux.item(), 4), "lr": round(lr, 7),
                   "grad_norm": round(grad_norm, 4), "wall_s": round(time.perf_counter() - t0, 2)},
             echo=step % 20 == 0)
        out_of_time = bool(cfg.max_wall_s) and time.perf_counter() - t0 >= cfg.max_wall_s
        if step < next_eval and step < cfg.max_steps and not out_of_time:
            continue
        te = time.perf_counter()
        record = {"step": step, "state_accuracy": round(state_accuracy(shown, enc, held), 4)}
        if record["state_accuracy"] < cfg.greedy_from and not out_of_time:
            record.update(eval_s=round(time.perf_counter() - te, 1), wall_s=round(time.perf_counter() - t0, 1))
            _log(log, {"eval": record})
            next_eval = step + cfg.eval_every
            continue
        summary = summarize(greedy_episodes(shown, enc, cfg.eval_seeds, cfg.env_options))
        record = {"step": step, "eval_success": summary["success"], **record,
                  **{k: v for k, v in summary.items() if k != "success"},
                  "eval_s": round(time.perf_counter() - te, 1), "wall_s": round(time.perf_counter() - t0, 1)}
        _log(log, {"eval": record})
        last_success = summary["success"]
        if cfg.band_low <= last_success <= cfg.band_high:
            kept = ({k: v.detach().clone() for k, v in shown.state_dict().items()}, record)
            if last_success >= cfg.stop_at and step >= cfg.min_steps:
                break
        elif last_success > cfg.band_high and step >= cfg.min_steps:
            break
        if out_of_time:
            break
        next_eval = step + cfg.fine_eval_every

    if kept is None:
        log.close()
        raise RuntimeError(
            f"no evaluation landed in [{cfg.band_low}, {cfg.band_high}] (last success {last_success:.3f} at step "
            f"{step}): raise max_steps if it ended below the band, lower fine_eval_every if it jumped over it")
    shown.load_state_dict(kept[0])
    chosen = kept[1]
    gate = summarize(greedy_episodes(shown, enc, cfg.gate_seeds, cfg.env_options))
    # Reported only: the test set decides nothing here.
    test = summarize(greedy_episodes(shown, enc, mc.TEST_SEEDS[: cfg.eval_episodes], cfg.env_options))
    shown.save_pretrained(stage, safe_serialization=True)
    processor.save_pretrained(stage)
    result = {"eval_success": chosen["eval_success"], "state_accuracy": chosen["state_accuracy"],
              "step": chosen["step"], "gate_success": gate["success"], "gate_ended": gate["ended"],
              "test_success": test["success"], "test_ended": test["ended"],
              "wall_s": round(time.perf_counter() - t0, 1), "threads": cfg.threads, "options": asdict(cfg)}
    _log(log, {"result": result}, echo=False)
    log.close()
    if out.exists():
        shutil.rmtree(out)
    stage.rename(out)
    return result


# The shipped warm start is two runs of train(): the defaults (the tower's lesson, then SFT on the expert,
# stopped in the band while its failures were still unparseable replies), then this continuation on a
# demonstrator with a habit (where the way on is right and left is open, left 55% of the time), which the model
# learns as a navigation mistake: its greedy episodes loop where the habit turns it back, and sampling escapes
# the loop sometimes, so GRPO's groups see successes and failures on the same maze.
HABIT_STAGE = dict(vision_steps=0, aux_weight=0.0, warmup_steps=10, max_steps=150, min_steps=75, greedy_from=0.0,
                   eval_every=25, fine_eval_every=25, habit_when=0, habit_move=2, habit_rate=0.55)


def build_warmstart(path: str | Path = mc.WARMSTART) -> dict:
    """Both runs of the shipped warm start's recipe, the first into a sibling folder removed at the end."""
    path = Path(path)
    expert = path.with_name(path.name + ".expert")
    try:
        train(SFTConfig(out=str(expert)))
        result = train(SFTConfig(out=str(path), init=str(expert), **HABIT_STAGE))
        shutil.copy(expert / "sft_log.jsonl", path / "sft_log_expert.jsonl")
        write_draws(path)
        return result
    finally:
        shutil.rmtree(expert, ignore_errors=True)


def ensure_warmstart(path: str | Path = mc.WARMSTART) -> Path:
    """The warm-start folder, built first only when it is missing (the repo ships one)."""
    path = Path(path)
    if not (path / "config.json").is_file():
        print(f"[maze] no warm start at {path}: building it with examples/maze/sft.py (the SFT takes a while on "
              "the CPU)", file=sys.stderr, flush=True)
        build_warmstart(path)
    return path


def _yes_no(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"{text!r}: give true or false")
    return text.lower() == "true"


def main(argv: list[str] | None = None) -> None:
    """No arguments: the shipped warm start's recipe (both runs). Any field given: one run of train()."""
    ap = argparse.ArgumentParser(prog="python -m examples.maze.sft", description=__doc__.split("\n\n")[0])
    for f in fields(SFTConfig):
        kind = _yes_no if isinstance(f.default, bool) else type(f.default)  # bool("false") would be True
        ap.add_argument("--" + f.name.replace("_", "-"), type=kind, default=f.default)
    ap.add_argument("--record-draws", metavar="DIR", help="only write DIR/draws.json from the SFT logs in DIR")
    argv = sys.argv[1:] if argv is None else argv
    args = vars(ap.parse_args(argv))
    folder = args.pop("record_draws")
    if folder is not None:
        print(write_draws(Path(folder)).read_text(), end="")
        return
    result = build_warmstart() if not argv else train(SFTConfig(**args))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
