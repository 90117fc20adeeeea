"""A batch shaped like a maze step's, without a rollout: the bench for the update on the maze (benchmarks/update.py).

Episodes of the maze env (examples/maze/cpu.yaml's options) played by a noisy expert (a random move one time in
four), one segment a turn as `make maze` trains them (history none: each turn's context is the rules, the
last feedback and the current image), with the reply's tokens as generated. Turn counts, lengths and images
are those of a maze step's episodes; the logprobs and advantages are made up (the update's cost does not
depend on their values).
"""
from __future__ import annotations

import random


def recipe_mazes() -> dict:
    """What the maze recipe shows the model (examples/maze/cpu.yaml), read by the parent: a child running the
    trainer before issue 21 cannot read today's cpu.yaml with that commit's config classes. The reward's
    options are left out (the baseline's env predates some of them)."""
    from examples.maze import maze_config

    return {"options": {k: maze_config.ENV_OPTIONS[k] for k in ("size", "cell_px", "max_turns")},
            "seed_base": maze_config.TRAIN_SEED_BASE}


def maze_batch(processor, episodes: int, mazes: dict, seed: int = 0) -> tuple[list, list[float]]:
    """`mazes`: recipe_mazes()."""
    from envs.maze.env import MazeEnv, action_text, expert_action
    from rollout.conversation import ChatFormat
    from rollout.trajectory import Segment, Trajectory

    chat, rng = ChatFormat(processor), random.Random(seed)
    trajs = []
    for e in range(episodes):
        env = MazeEnv(**mazes["options"])
        obs, segments, done = env.reset(mazes["seed_base"] + seed * 100_000 + e // 8), [], False
        while not done:
            action = expert_action(env.maze, env.position) if rng.random() > 0.25 else action_text(rng.randrange(4))
            prompt = chat.prompt_ids(obs)
            reply = chat.tok.encode(action, add_special_tokens=False) + [chat.tok.eos_token_id]
            mask = [0] * len(prompt) + [1] * len(reply)
            lps = [-rng.uniform(0.01, 2.0) if m else 0.0 for m in mask]
            segments.append(Segment(prompt + reply, mask, lps, list(obs.images)))
            result = env.step(action)
            obs, done = result.observation, result.done
        trajs.append(Trajectory(task_id=str(e // 8), group_id=e // 8, seed=e, segments=segments,
                                turn_rewards=[0.0] * len(segments), num_turns=len(segments), stop_reason="done",
                                adapter_version=None))
    return trajs, [rng.uniform(-1, 1) for _ in range(episodes)]
