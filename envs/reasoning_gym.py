"""reasoning-gym's procedural tasks as an env (`pip install 'grpo[reasoning-gym]'`), scored by their own scorers.

    env: {name: reasoning_gym, options: {tasks: {basic_arithmetic: 1.0, chain_sum: 1.0}, seed: 0}}

`tasks` names reasoning-gym datasets (`reasoning_gym.factory.DATASETS`), as a list (weight 1 each) or a
mapping to a weight, or to `{weight: w, config: {...}}` with the dataset's own options (its `*Config` fields,
`min_terms: 2` for chain_sum): the fields of reasoning-gym's `DatasetSpec`. They are drawn through its
composite dataset, so an item's task follows the weights and the item is reasoning-gym's own for that index.

The env seed names the item: item `seed % size` of the composite dataset seeded with `seed` (size None: item
`seed` of an unbounded one), so every machine sees the same question for a seed. The model's reply is scored
by the task's `score_answer` on what it wrote inside `<answer>...</answer>` (reasoning-gym's
`extract_answer`; `answer_tag: null` scores the whole reply), and told so by reasoning-gym's system prompt
(`system_prompt`: a key of `reasoning_gym.utils.SYSTEM_PROMPTS`, literal text, or null for none, which leaves
`rollout.system_prompt` in charge). `info["rewards"]` holds the score under the task's name, so the trainer
logs each task's mean as `reward/<task>`; success is a full score.

The question is the task (`task_key`): the trainer skips every training seed whose question an eval or test
seed asks, so the three sets never share an item even where a generator repeats its questions.
"""
from __future__ import annotations

import json
import threading
from typing import Mapping, Optional, Sequence, Union

from envs.base import Env, Observation, StepResult

TaskSpec = Union[str, Sequence[str], Mapping[str, Union[float, Mapping]]]

_built: dict = {}  # composite datasets by their options: envs are built once per episode
_lock = threading.Lock()


def _reasoning_gym():
    try:
        import reasoning_gym
    except ImportError:
        raise ImportError("env 'reasoning_gym' needs the reasoning-gym package: pip install 'grpo[reasoning-gym]' "
                          "(or pip install reasoning-gym)") from None
    return reasoning_gym


def task_specs(tasks: TaskSpec) -> list[dict]:
    """reasoning-gym DatasetSpec fields {name, weight, config} for each task, checked against its registry."""
    from reasoning_gym.factory import DATASETS

    if isinstance(tasks, str):
        tasks = [tasks]
    items = tasks.items() if isinstance(tasks, Mapping) else ((name, 1.0) for name in tasks or ())
    specs = []
    for name, spec in items:
        if name not in DATASETS or name == "composite":
            known = ", ".join(sorted(n for n in DATASETS if n != "composite"))
            raise ValueError(f"tasks names {name!r}, which is no reasoning-gym dataset; known: {known}")
        spec = dict(spec) if isinstance(spec, Mapping) else {"weight": spec}
        unknown = sorted(set(spec) - {"weight", "config"})
        if unknown:
            raise ValueError(f"tasks[{name!r}] has {unknown[0]!r}: give a weight, or {{weight: w, config: {{...}}}} "
                             "with the dataset's own options under config")
        weight, config = spec.get("weight", 1.0), spec.get("config") or {}
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
            raise ValueError(f"tasks[{name!r}] weight={weight!r} must be a number > 0")
        if not isinstance(config, Mapping):
            raise ValueError(f"tasks[{name!r}] config={config!r} must be a mapping of the dataset's options")
        specs.append({"name": name, "weight": float(weight), "config": dict(config)})
    if not specs:
        raise ValueError("tasks is empty: name at least one reasoning-gym dataset, e.g. {basic_arithmetic: 1.0}")
    return specs


def composite(specs: list[dict], size: int, seed: int):
    """reasoning-gym's composite dataset of `specs`, built once a process for the same options."""
    key = json.dumps([specs, size, seed], sort_keys=True)
    with _lock:
        if key not in _built:
            rg = _reasoning_gym()
            from reasoning_gym.composite import DatasetSpec

            try:
                _built[key] = rg.create_dataset("composite", size=size, seed=seed,
                                                datasets=[DatasetSpec(**s) for s in specs])
            except (AssertionError, TypeError, ValueError) as e:  # a dataset's own config check
                raise ValueError(f"reasoning-gym refused the tasks {[s['name'] for s in specs]}: "
                                 f"{type(e).__name__}: {e}") from e
        return _built[key]


class ReasoningGymEnv(Env):
    keep_images = False
    blocking = False  # items are generated and scored in microseconds

    def __init__(self, tasks: TaskSpec, size: Optional[int] = None, seed: int = 0,
                 answer_tag: Optional[str] = "answer", system_prompt: Optional[str] = "default"):
        _reasoning_gym()
        if size is not None and not (isinstance(size, int) and not isinstance(size, bool) and size >= 1):
            raise ValueError(f"size={size!r} must be a whole number >= 1 (the items seeds cycle through), or None")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed={seed!r} must be a whole number >= 0 (reasoning-gym's dataset seed)")
        from reasoning_gym.utils import SYSTEM_PROMPTS

        self.specs, self.size, self.answer_tag = task_specs(tasks), size, answer_tag
        self.system_prompt = SYSTEM_PROMPTS.get(system_prompt, system_prompt) if system_prompt else None
        # reasoning-gym wants a size; an unbounded env indexes far past it, which its generators allow.
        self.dataset = composite(self.specs, size or 1_000_000, seed)
        self.item: dict | None = None

    def index(self, seed: int) -> int:
        return int(seed) % self.size if self.size else int(seed)

    def task_key(self, seed: int):
        item = self.dataset[self.index(seed)]
        return item["metadata"]["source_dataset"], item["question"]

    def reset(self, seed: int) -> Observation:
        self.item = self.dataset[self.index(seed)]
        question = self.item["question"]
        if self.system_prompt is None:
            return Observation(question)
        return Observation(question, messages=[{"role": "system", "content": self.system_prompt},
                                               {"role": "user", "content": question}])

    def step(self, action_text: str) -> StepResult:
        if self.item is None:
            raise RuntimeError("step() before reset(seed): reset picks the item")
        from reasoning_gym.utils import extract_answer

        answer = extract_answer(action_text, self.answer_tag) if self.answer_tag else action_text.strip()
        value = float(self.dataset.score_answer(answer, self.item))
        task = self.item["metadata"]["source_dataset"]
        return StepResult(Observation(""), value, True, {"rewards": {task: value}, "success": value >= 1.0,
                                                         "parse_error": answer is None, "answer": answer})
