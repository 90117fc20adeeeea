"""Dataset tasks: one prompt per row, one reply, scored by reward functions (TRL's `reward_funcs`).

    env = DatasetEnv([{"prompt": "What is 3+4?", "answer": "7"}], rewards={"correct": correct, "format": fmt},
                     weights={"correct": 1.0, "format": 0.2})

A reward function is either TRL's, batched, `fn(prompts, completions, **kwargs) -> list[float]` with the row's
columns as keyword arguments, or this package's own `fn(prompt, completion, row) -> float`; which one is read
from its signature (`reward_style`). A value of None means "not applicable", as in TRL: it adds nothing to the
episode's reward and is left out of that function's mean. The episode's reward is the weighted sum, and
`info["rewards"]` holds each function's own value (the trainer logs their means as `reward/<name>`).

A prompt is a string, or TRL's conversational form: a list of messages ({"role", "content"}, a system message
first if any, the user's last), which reach the model through its chat template as those messages. TRL-style
functions then get each completion as TRL gives it, a list of one assistant message.

Rows come from a list of dicts, a `.jsonl` or `.json` file, a folder a Hugging Face `datasets` dataset was saved
to (`save_to_disk`), or a dataset on the Hub by name (`data: org/name` with `split`, read from the local
datasets cache when offline); the last two need `pip install datasets`. Reward functions may be given as
"module:function" strings, so a run's config.yaml names them and `grpo eval` rebuilds the env from it;
functions given as Python objects are recorded by the same name (`function_name`).

The seed names the row, so evaluation and training draws work as for any env: seeds 0..n-1 are rows 0..n-1
(the eval seeds 0-63 are the first 64 rows), and larger seeds, the trainer's draw from `train_seed_offset`
up, cycle through rows `holdout`..n-1. The row is the task (`task_key`), so the trainer skips every row that
`eval.seeds` or `eval.test_seeds` score, whatever `holdout` says: with the defaults a dataset of 1,000 rows
trains on rows 64..999. A dataset with no row left to train on is refused before the run starts.
"""
from __future__ import annotations

import importlib
import inspect
import json
import math
import re
import warnings
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence, Union

from envs.base import Env, Observation, StepResult

RewardFn = Callable[..., Optional[float]]  # fn(prompt, completion, row) or TRL's fn(prompts, completions, **columns)
RewardSpec = Union[RewardFn, str]

# What TRL's GRPOTrainer passes every reward function besides the dataset's columns (trl/trainer/grpo_trainer.py,
# _calculate_rewards, v1.9): only `prompts` and `completions` can be given here, from inside one episode.
TRL_PASSED = ("prompts", "completions")
TRL_NOT_PASSED = {
    "completion_ids": "the env receives the reply's text, not its token ids",
    "trainer_state": "the env runs in a rollout worker, which holds no trainer state",
    "log_extra": "no completions table to add columns to (samples.jsonl keeps info['rewards'])",
    "log_metric": "an env's metrics are its info['rewards'] values, logged as reward/<name>",
    "environments": "TRL's environment objects do not exist here",
}
ROLES = ("system", "user", "assistant")

_loaded: dict = {}  # file rows by (path, mtime, size, split): envs are built once per episode


class DatasetEnv(Env):
    def __init__(self, data: Union[str, Path, Sequence[Mapping]],
                 rewards: Union[RewardSpec, Sequence[RewardSpec], Mapping[str, RewardSpec]],
                 weights: Union[Sequence[float], Mapping[str, float], None] = None, prompt_key: str = "prompt",
                 holdout: int = 0, success: str | None = None, success_threshold: float = 1.0,
                 image_key: str | None = None, split: str | None = None):
        self.rows = load_rows(data, split)
        first = self.rows[0]
        self.rewards = reward_functions(rewards, columns=[k for k in first if k != prompt_key]
                                        if isinstance(first, Mapping) else None, prompt_key=prompt_key)
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
        prompt = self.row.get(self.prompt_key) if isinstance(self.row, Mapping) else None
        if isinstance(prompt, str):
            return Observation(prompt, self._images())
        if isinstance(prompt, (list, tuple)):
            messages = conversation(prompt, f"row {self.index}, {self.prompt_key!r}")
            return Observation(messages[-1]["content"], self._images(), messages=messages)
        keys = list(self.row) if isinstance(self.row, Mapping) else type(self.row).__name__
        raise ValueError(f"row {self.index} has no prompt under prompt_key={self.prompt_key!r} (it holds {keys}): "
                         "every row must be a mapping with the prompt under that key, a string or a list of "
                         "messages {role, content}")

    def step(self, action_text: str) -> StepResult:
        if self.row is None:
            raise RuntimeError("step() before reset(seed): reset picks the row")
        scores = score(self.rewards, self.row[self.prompt_key], action_text, self.row, self.index)
        applied = {name: value for name, value in scores.items() if value is not None}
        if not applied:
            warnings.warn("every reward function returned None (not applicable) on a reply: its reward is 0, as in "
                          "TRL; make at least one function score every row", stacklevel=2)
        total = sum(self.weights[name] * value for name, value in applied.items())
        success = applied.get(self.success, -math.inf) >= self.success_threshold
        return StepResult(Observation(""), total, True, {"rewards": applied, "success": success, "row": self.index})

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


def score(rewards: Mapping[str, RewardFn], prompt, completion: str, row: Mapping, index=None) -> dict:
    """Each function's value on one reply (None: not applicable); an error names the function and the row."""
    scores = {}
    for name, fn in rewards.items():
        try:
            value = fn(prompt, completion, row)
        except Exception as e:
            raise RuntimeError(f"reward function {name!r} failed on row {index}: {type(e).__name__}: {e}") from e
        if isinstance(value, (list, tuple)) and getattr(fn, "batched", False):
            if len(value) != 1:
                raise ValueError(f"reward function {name!r} returned {len(value)} values for one completion on row "
                                 f"{index}: a TRL-style function returns one value per completion it is given")
            value = value[0]
        elif getattr(fn, "batched", False):
            raise ValueError(f"reward function {name!r} returned {value!r} on row {index}: a TRL-style function "
                             "returns a list, one float (or None) per completion")
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value)):
            raise ValueError(f"reward function {name!r} returned {value!r} on row {index}: it must return a "
                             "finite number (float), or None where it does not apply")
        scores[name] = None if value is None else float(value)
    return scores


def reward_functions(spec, columns: Optional[Sequence[str]] = None, prompt_key: str = "prompt") -> dict[str, RewardFn]:
    """{name: function} from a function, a "module:function" string, a list of them, or a {name: either}; a
    TRL-style function comes wrapped to take (prompt, completion, row). `columns`: the row's columns besides the
    prompt (`prompt_key`), the keyword arguments a TRL-style function may require."""
    if isinstance(spec, Mapping):
        named = [(str(k), v) for k, v in spec.items()]
    else:
        items = [spec] if callable(spec) or isinstance(spec, str) else list(spec or [])
        named = [(_name_of(v), v) for v in items]
    if not named:
        raise ValueError("rewards is empty: give at least one reward function, TRL's fn(prompts, completions, "
                         "**kwargs) -> list[float] or fn(prompt, completion, row) -> float")
    names = [n for n, _ in named]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"two reward functions are named {duplicates[0]!r}: pass a mapping {{name: function}}")
    out = {}
    for name, fn in named:
        fn = _resolve(fn)
        out[name] = TrlReward(fn, prompt_key) if reward_style(fn, name, columns) == "trl" else fn
    return out


def reward_style(fn, name: str, columns: Optional[Sequence[str]] = None) -> str:
    """"trl" for TRL's batched `fn(prompts, completions, **kwargs)`, "row" for `fn(prompt, completion, row)`,
    read from the signature: TRL's names `completions` or `prompts`, or takes **kwargs and requires nothing
    but the row's columns; ours takes three positional arguments. Both or neither: refused."""
    fix = ("write it as TRL's fn(prompts, completions, **kwargs) -> list[float] (the row's columns come as "
           "keyword arguments) or as fn(prompt, completion, row) -> float")
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        raise ValueError(f"reward function {name!r}: its signature cannot be read, so how to call it is unknown; "
                         f"{fix}") from None
    required = [p.name for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    names = {p.name for p in params}
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params)
    known = set(TRL_PASSED) | set(columns or ())
    trl = bool(names & set(TRL_PASSED)) or (takes_any and all(r in known for r in required))
    try:
        inspect.signature(fn).bind(None, None, None)
        row = not names & set(TRL_PASSED)
    except TypeError:
        row = False
    if trl and row:
        raise ValueError(f"reward function {name!r} takes any arguments, so whether it is TRL's batched kind or "
                         f"fn(prompt, completion, row) cannot be told; {fix}")
    if not trl and not row:
        raise ValueError(f"reward function {name!r} takes ({', '.join(p.name for p in params)}): neither TRL's "
                         f"fn(prompts, completions, **kwargs) nor fn(prompt, completion, row); {fix}")
    if trl:
        for r in required:
            if r in TRL_NOT_PASSED:
                raise ValueError(f"reward function {name!r} requires `{r}`, which TRL passes and this env cannot "
                                 f"({TRL_NOT_PASSED[r]}): give it a default (`{r}=None`) or leave it to **kwargs")
            if r not in known:
                raise ValueError(f"reward function {name!r} requires `{r}`, which is no column of the dataset "
                                 f"(columns: {sorted(columns or [])}): TRL passes the columns as keyword arguments")
    return "trl" if trl else "row"


class TrlReward:
    """A TRL-style reward function called on one episode as TRL calls it on a batch: prompts=[prompt],
    completions=[completion] (a list of one assistant message when the prompt is conversational), and each
    column of the row but the prompt as a list of one value (TRL leaves out `prompt`, `completion` and
    `completion_ids`)."""

    batched = True

    def __init__(self, fn, prompt_key: str = "prompt"):
        self.fn, self.prompt_key = fn, prompt_key
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)

    def __call__(self, prompt, completion: str, row: Mapping):
        conversational = isinstance(prompt, (list, tuple))
        reply = [{"role": "assistant", "content": completion}] if conversational else completion
        columns = {k: [v] for k, v in row.items() if k not in (self.prompt_key, "completion", "completion_ids")}
        return self.fn(prompts=[prompt], completions=[reply], **columns)


def conversation(messages, where: str) -> list[dict]:
    """A conversational prompt, checked: a list of {role, content} messages with string content, ending with the
    user's message (the model replies to it)."""
    out = []
    for i, m in enumerate(messages):
        if not (isinstance(m, Mapping) and m.get("role") in ROLES and isinstance(m.get("content"), str)):
            raise ValueError(f"{where}: message {i} is {m!r}: each message must be {{'role': one of {ROLES}, "
                             "'content': a string}")
        out.append({"role": m["role"], "content": m["content"]})
    if not out or out[-1]["role"] != "user":
        raise ValueError(f"{where}: a conversational prompt must end with the user's message (the model replies "
                         f"to it), got {[m['role'] for m in out]}")
    return out


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
    if isinstance(data, str) and not Path(data).exists() and _HUB_NAME.fullmatch(data):
        key = ("hub", data, split)
        if key not in _loaded:
            _loaded[key] = _hub_dataset(data, split)
        rows = _loaded[key]
    elif isinstance(data, (str, Path)):
        path = Path(data)
        if not path.exists():
            raise FileNotFoundError(f"dataset {str(path)!r} does not exist: give a .jsonl or .json file, a "
                                    "folder written by datasets' save_to_disk, or a Hub dataset's name org/name")
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


_HUB_NAME = re.compile(r"[\w.-]+/[\w.-]+")  # org/name, as the Hub spells a dataset


def _datasets(what: str):
    try:
        import datasets
    except ImportError:
        raise ImportError(f"{what} needs the `datasets` package: `pip install datasets` (or give the rows as a "
                          ".jsonl file)") from None
    return datasets


def _one_split(datasets, ds, where: str, split: str | None):
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise ValueError(f"{where} holds the splits {sorted(ds)}: choose one with split=..., got {split!r}")
        ds = ds[split]
    return ds


def _saved_dataset(path: Path, split: str | None):
    datasets = _datasets(f"{path} is a folder, read as a Hugging Face dataset saved with save_to_disk, which")
    return _one_split(datasets, datasets.load_from_disk(str(path)), str(path), split)


def _hub_dataset(name: str, split: str | None):
    """A dataset on the Hub by name, as `datasets.load_dataset` gives it: from the local datasets cache when
    the Hub is offline (HF_HUB_OFFLINE=1, as runs set it)."""
    datasets = _datasets(f"dataset {name!r}, read as a Hugging Face Hub dataset,")
    try:
        ds = datasets.load_dataset(name)
    except (ConnectionError, FileNotFoundError) as e:  # offline and not cached; online: no such dataset
        raise FileNotFoundError(
            f"dataset {name!r} is no file and is not in the Hugging Face datasets cache "
            f"({datasets.config.HF_DATASETS_CACHE}): fetch it once with network access, `python -c \"import "
            f"datasets; datasets.load_dataset('{name}')\"` with the same HF_HOME, or give a local file "
            f"({type(e).__name__}: {e})") from None
    return _one_split(datasets, ds, f"dataset {name!r}", split)


def _name_of(fn) -> str:
    if isinstance(fn, str):
        return fn.rsplit(":", 1)[-1]
    return getattr(fn, "__name__", type(fn).__name__)


def _resolve(fn) -> RewardFn:
    if callable(fn):
        return fn
    if not isinstance(fn, str) or fn.count(":") != 1:
        raise ValueError(f"reward function {fn!r} must be a callable or a 'package.module:function' string")
    try:
        resolved = _load(fn)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"reward function {fn!r} cannot be loaded: {e}") from e
    if not callable(resolved):
        raise ValueError(f"reward function {fn!r} is a {type(resolved).__name__}, not a function")
    return resolved


def _load(spec: str):
    module, qualname = spec.split(":")
    obj = importlib.import_module(module)
    for attr in qualname.split("."):
        obj = getattr(obj, attr)
    return obj


def function_name(fn) -> str:
    """"module:qualname", the string that names `fn` in a config (and loads it back), for a function a fresh
    process can import; anything else is refused with how to fix it (config.yaml must rebuild the run)."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    fix = ("define it at the top level of an importable module (a file on the Python path, not the script "
           "being run) and pass it, or its 'module:function' name")
    if not isinstance(module, str) or not isinstance(qualname, str):
        raise ValueError(f"{fn!r} has no module-level name that a config could record; {fix}")
    if module == "__main__":
        raise ValueError(f"{qualname} is defined in the script being run (__main__), which another process "
                         f"(a rollout worker, `grpo eval`) cannot import by that name; {fix}")
    if "<" in qualname:  # <lambda>, <locals>
        raise ValueError(f"{module}.{qualname} is a lambda or a function defined inside a function, which no "
                         f"process can import by name; {fix}")
    name = f"{module}:{qualname}"
    try:
        found = _load(name)
    except (ImportError, AttributeError):
        found = None
    if found is not fn:
        raise ValueError(f"{name} does not load back to {fn!r}; {fix}")
    return name
