"""The records a rollout produces and the trainer consumes."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Segment:
    """One token sequence the model ran, in the compact form sent to vLLM (one placeholder per image).

    With the full history kept, an episode is one segment that grows turn by turn. When earlier images leave
    the conversation, each turn's context is no longer a prefix of the next one, so each turn is a segment.
    """
    token_ids: list[int]
    loss_mask: list[int]            # 1 on tokens vLLM sampled, 0 on prompt and observation tokens
    sampler_logprobs: list[float]   # vLLM's logprob of each sampled token; 0.0 where loss_mask is 0
    images: list = field(default_factory=list)  # PIL images, in the order of their placeholders

    def __post_init__(self):
        if not (len(self.token_ids) == len(self.loss_mask) == len(self.sampler_logprobs)):
            raise ValueError("token_ids, loss_mask and sampler_logprobs must have one entry per token")

    @property
    def num_generated(self) -> int:
        return sum(self.loss_mask)


@dataclass
class Trajectory:
    task_id: str
    group_id: int                   # episodes of one task share it; advantages are computed per group
    seed: int
    segments: list[Segment]
    turn_rewards: list[float]
    num_turns: int
    stop_reason: str                # "done" | "max_turns" (the env's or rollout's cap) | "context"
    adapter_version: int | None     # the adapter vLLM sampled with (None: the base model)
    success: bool = False
    parse_errors: int = 0
    actions: list[str] = field(default_factory=list)  # the text the env received each turn
    turn_states: list = field(default_factory=list)  # env.state_key() as each turn began (None: not given)
    info: dict = field(default_factory=dict)
    tool_calls: int = 0                # calls the replies made to the env's tools (envs/tools.py)
    tool_errors: dict = field(default_factory=dict)  # calls that failed, per envs.tools.ERROR_KINDS kind
    # Per reply, in turn order (run k of turn_spans is reply k): its tokens, and whether vLLM cut it at the token
    # limit (finish_reason "length"); empty where the rollout does not record them (an agent's own client).
    reply_tokens: list[int] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)

    @property
    def reward(self) -> float:
        return float(sum(self.turn_rewards))

    @property
    def num_generated(self) -> int:
        return sum(s.num_generated for s in self.segments)

    def turn_spans(self) -> list[list[tuple[int, int]]]:
        """Per segment, the [start, end) token span of each run of generated tokens; over all segments in
        order, run k is turn k (one segment per turn, or one segment holding every turn's reply)."""
        spans = []
        for seg in self.segments:
            runs, start = [], None
            for i, m in enumerate(seg.loss_mask + [0]):
                if m and start is None:
                    start = i
                elif not m and start is not None:
                    runs.append((start, i))
                    start = None
            spans.append(runs)
        return spans


@dataclass
class RolloutStats:
    episodes: int
    turns: int
    generated_tokens: int
    prompt_tokens: int
    engine_calls: int
    wall_s: float
    engine_s: float
    success_rate: float
    mean_reward: float
    mean_turns: float
    parse_errors: int
    stop_reasons: dict
    env_s: float = 0.0      # waiting for env calls (reset, step), all episodes' calls of a turn at once
    env_retries: int = 0    # groups re-run with fresh env instances after their env failed
    # The engine with no request in flight: since this worker's previous rollout call ended (the trainer's
    # turn), plus the waits for env calls inside this one.
    engine_idle_s: float = 0.0
    in_flight_mean: float = 0.0  # requests in flight on the engine, mean over its steps
    # With tools (envs/tools.py): the calls made and the failed ones per kind; None when no env had tools.
    tool_calls: int | None = None
    tool_errors: dict | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def as_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if v is not None or not k.startswith("tool_")}
        d["tokens_per_s"] = self.tokens_per_s
        return d


def merge_stats(parts: list[RolloutStats], sequential: bool = False) -> RolloutStats:
    """One batch's stats from its parts: the slices that workers ran at the same time (the batch took as long
    as the slowest part), or with `sequential` the draws that ran one after another (their times add up)."""
    if len(parts) == 1:
        return parts[0]
    episodes = sum(p.episodes for p in parts)
    weighted = lambda attr: sum(getattr(p, attr) * p.episodes for p in parts) / max(episodes, 1)  # noqa: E731
    took = sum if sequential else max
    reasons: dict = {}
    for p in parts:
        for k, v in p.stop_reasons.items():
            reasons[k] = reasons.get(k, 0) + v
    return RolloutStats(
        episodes=episodes, turns=sum(p.turns for p in parts),
        generated_tokens=sum(p.generated_tokens for p in parts), prompt_tokens=sum(p.prompt_tokens for p in parts),
        engine_calls=sum(p.engine_calls for p in parts), wall_s=took(p.wall_s for p in parts),
        engine_s=took(p.engine_s for p in parts), success_rate=weighted("success_rate"),
        mean_reward=weighted("mean_reward"), mean_turns=weighted("mean_turns"),
        parse_errors=sum(p.parse_errors for p in parts), stop_reasons=reasons,
        env_s=took(p.env_s for p in parts), env_retries=sum(p.env_retries for p in parts),
        engine_idle_s=took(p.engine_idle_s for p in parts), in_flight_mean=weighted("in_flight_mean"),
        **_merged_tool_stats(parts),
    )


def _merged_tool_stats(parts: list[RolloutStats]) -> dict:
    with_tools = [p for p in parts if p.tool_calls is not None]
    if not with_tools:
        return {}
    errors: dict = {}
    for p in with_tools:
        for k, v in p.tool_errors.items():
            errors[k] = errors.get(k, 0) + v
    return {"tool_calls": sum(p.tool_calls for p in with_tools), "tool_errors": errors}
