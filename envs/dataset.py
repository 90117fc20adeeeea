"""Dataset tasks: one prompt per row, one reply, scored by reward functions (TRL's `reward_funcs`).

    env = DatasetEnv([{"prompt": "What is 3+4?", "answer": "7"}], rewards={"correct": correct, "format": fmt},
                     weights={"correct": 1.0, "format": 0.2})

A reward function is `fn(prompt, completion, row) -> float`; the episode's reward is the weighted sum, and
`info["rewards"]` holds each function's own value (the trainer logs their means as `reward/<name>`). Rows come
from a list of dicts, a `.jsonl` or `.json` file, or a folder a Hugging Face `datasets` dataset was saved to
(`save_to_disk`; needs `pip install datasets`). Reward functions may be given as "module:function" strings,
so a run's config.yaml names them and `grpo eval` rebuilds the env from it.

The seed names the row, so evaluation and training draws work as for any env: seeds 0..n-1 are rows 0..n-1
(the eval seeds 0-63 are the first 64 rows), and larger seeds, the trainer's draw from `train_seed_offset`
up, cycle through rows `holdout`..n-1. The row is the task (`task_key`), so the trainer skips every row that
`eval.seeds` or `eval.test_seeds` score, whatever `holdout` says: with the defaults a dataset of 1,000 rows
trains on rows 64..999. A dataset with no row left to train on is refused before the run starts.
"""
from __future__ import annotations

import importlib
import json
import math
from pathlib import Path
from typing import Callable, Mapping, Sequence, Union

from envs.base import Env, Observation, StepResult

RewardFn = Callable[[str, str, Mapping], float]
RewardSpec = Union[RewardFn, str]

_loaded: dict = {}  # file rows by (path, mtime, size, split): envs are built once per episode


class DatasetEnv(Env):
    def __init__(self, data: Union[str, Path, Sequence[Mapping]],
                 rewards: Union[RewardSpec, Sequence[RewardSpec], Mapping[str, RewardSpec]],
                 weights: Union[Sequence[float], Mapping[str, float], None] = None, prompt_key: str = "prompt",
                 holdout: int = 0, success: str | None = None, success_threshold: float = 1.0,
                 image_key: str | None = None, split: str | None = None):
        self.rows = load_rows(data, split)
        self.rewards = reward_functions(rewards)
        self.weights = reward_weights(weights, list(self.rewards))
        n = len(self.rows)
        if not (isinstance(holdout, int) and 0 <= holdout < n):
            raise ValueError(f"holdout={holdout!r} must be an integer from 0 to {n - 1} (the dataset has {n} rows): "
                             "the number of leading rows kept for evaluation, at least one row left to train on")
        self.holdout = holdout
        self.success = success if success is not None else next(iter(self.rewards))
        if self.success not in self.rewards:
            raise ValueError(f"success={success!r} is not a reward function's name; names: {list(self.rewards)}")
        self.success_threshold = float(success_threshold)
        self.prompt_key, self.image_key = prompt_key, image_key
        self.index, self.row = None, None

    def row_index(self, seed: int) -> int:
        n = len(self.rows)
        return seed if 0 <= seed < n else self.holdout + seed % (n - self.holdout)

    def task_key(self, seed: int) -> int:
        return self.row_index(int(seed))

    def reset(self, seed: int) -> Observation:
        self.index = self.row_index(int(seed))
        self.row = self.rows[self.index]
        if not isinstance(self.row, Mapping) or not isinstance(self.row.get(self.prompt_key), str):
            keys = list(self.row) if isinstance(self.row, Mapping) else type(self.row).__name__
            raise ValueError(f"row {self.index} has no text under prompt_key={self.prompt_key!r} (it holds {keys}): "
                             "every row must be a mapping with the prompt string under that key")
        return Observation(self.row[self.prompt_key], self._images())

    def step(self, action_text: str) -> StepResult:
        if self.row is None:
            raise RuntimeError("step() before reset(seed): reset picks the row")
        scores = score(self.rewards, self.row[self.prompt_key], action_text, self.row, self.index)
        total = sum(self.weights[name] * value for name, value in scores.items())
        success = scores[self.success] >= self.success_threshold
        return StepResult(Observation(""), total, True, {"rewards": scores, "success": success, "row": self.index})

    def _images(self) -> list:
        if self.image_key is None:
            return []
        value = self.row.get(self.image_key)
        items = value if isinstance(value, (list, tuple)) else [value]
        from PIL import Image

        images = []
        for item in items:
            if isinstance(item, (str, Path)):
                item = Image.open(item)
            if not isinstance(item, Image.Image):
                raise ValueError(f"row {self.index}: {self.image_key!r} holds {type(item).__name__}: give a PIL "
                                 "image, an image file's path, or a list of them")
            images.append(item.convert("RGB"))
        return images


def score(rewards: Mapping[str, RewardFn], prompt: str, completion: str, row: Mapping, index=None) -> dict[str, float]:
    """Each function's value on one reply; an error names the function and the row."""
    scores = {}
    for name, fn in rewards.items():
        try:
            value = fn(prompt, completion, row)
        except Exception as e:
            raise RuntimeError(f"reward function {name!r} failed on row {index}: {type(e).__name__}: {e}") from e
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"reward function {name!r} returned {value!r} on row {index}: it must return a "
                             "finite number (float)")
        scores[name] = float(value)
    return scores


def reward_functions(spec) -> dict[str, RewardFn]:
    """{name: function} from a function, a "module:function" string, a list of them, or a {name: either}."""
    if isinstance(spec, Mapping):
        named = [(str(k), v) for k, v in spec.items()]
    else:
        items = [spec] if callable(spec) or isinstance(spec, str) else list(spec or [])
        named = [(_name_of(v), v) for v in items]
    if not named:
        raise ValueError("rewards is empty: give at least one reward function fn(prompt, completion, row) -> float")
    names = [n for n, _ in named]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"two reward functions are named {duplicates[0]!r}: pass a mapping {{name: function}}")
    return {name: _resolve(fn) for name, fn in named}


def reward_weights(weights, names: list[str]) -> dict[str, float]:
    """One weight per reward function: 1.0 each by default, a list in the functions' order, or a mapping."""
    if weights is None:
        return {n: 1.0 for n in names}
    if isinstance(weights, Mapping):
        unknown = sorted(set(weights) - set(names))
        if unknown:
            raise ValueError(f"weights names {unknown[0]!r}, which is no reward function; names: {names}")
        out = {n: weights.get(n, 1.0) for n in names}
    else:
        weights = list(weights)
        if len(weights) != len(names):
            raise ValueError(f"weights has {len(weights)} values for {len(names)} reward functions {names}: give "
                             "one per function, in order, or a mapping {name: weight}")
        out = dict(zip(names, weights))
    for n, w in out.items():
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w):
            raise ValueError(f"weights[{n!r}]={w!r} must be a finite number")
    return {n: float(w) for n, w in out.items()}


def load_rows(data, split: str | None = None):
    """The rows as an indexable sequence of mappings."""
    if isinstance(data, (str, Path)):
        path = Path(data)
        if not path.exists():
            raise FileNotFoundError(f"dataset {str(path)!r} does not exist: give a .jsonl or .json file, or a "
                                    "folder written by datasets' save_to_disk")
        stat = path.stat()
        key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size, split)
        if key not in _loaded:
            _loaded[key] = _read(path, split)
        rows = _loaded[key]
    elif isinstance(data, Mapping) or not hasattr(data, "__getitem__") or not hasattr(data, "__len__"):
        raise ValueError(f"data must be a list of dicts, a file path or a datasets.Dataset, got {type(data).__name__}")
    else:
        rows = data
    if len(rows) == 0:
        raise ValueError(f"dataset {data if isinstance(data, (str, Path)) else ''!s} has no rows")
    return rows


def _read(path: Path, split: str | None):
    if path.is_dir():
        return _saved_dataset(path, split)
    if path.suffix == ".jsonl":
        lines = path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]
    if path.suffix == ".json":
        rows = json.loads(path.read_text())
        if not isinstance(rows, list):
            raise ValueError(f"{path}: a .json dataset must hold a list of rows, got {type(rows).__name__}")
        return rows
    raise ValueError(f"dataset {str(path)!r}: unknown format; give a .jsonl or .json file, or a folder written "
                     "by datasets' save_to_disk")


def _saved_dataset(path: Path, split: str | None):
    try:
        import datasets
    except ImportError:
        raise ImportError(f"{path} is a folder, read as a Hugging Face dataset saved with save_to_disk, which "
                          "needs the `datasets` package: `pip install datasets` (or give the rows as a .jsonl file)"
                          ) from None
    ds = datasets.load_from_disk(str(path))
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise ValueError(f"{path} holds the splits {sorted(ds)}: choose one with split=..., got {split!r}")
        ds = ds[split]
    return ds


def _name_of(fn) -> str:
    if isinstance(fn, str):
        return fn.rsplit(":", 1)[-1]
    return getattr(fn, "__name__", type(fn).__name__)


def _resolve(fn) -> RewardFn:
    if callable(fn):
        return fn
    if not isinstance(fn, str) or fn.count(":") != 1:
        raise ValueError(f"reward function {fn!r} must be a callable or a 'package.module:function' string")
    module, attr = fn.split(":")
    try:
        resolved = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"reward function {fn!r} cannot be loaded: {e}") from e
    if not callable(resolved):
        raise ValueError(f"reward function {fn!r} is a {type(resolved).__name__}, not a function")
    return resolved
