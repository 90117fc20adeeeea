"""The whole run's configuration: typed sections, loadable from YAML, overridable from the command line.

    config = RunConfig.from_yaml("examples/maze/cpu.yaml", overrides=["--algo.clip_high", "0.28"])

Every section validates itself when built, so a bad value fails before Ray or vLLM start, with an error
that names the field (`AlgorithmConfig.clip_low`), the value and what is allowed. The rollout and engine
sections are rollout.worker.RolloutConfig and rollout.engine.VllmConfig themselves; docs/config.md lists every
field (`python -m grpo.tools.config_reference --write docs/config.md`).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from envs.seeds import parse_seeds
from grpo.algo.config import AlgorithmConfig, ConfigError, check_bool, check_number, require
from grpo.driver.fault import FaultConfig
from grpo.learner.config import TrainConfig
from grpo.learner.lora import LoraConfig
from rollout.engine import EngineConfig, VllmConfig
from rollout.worker import RolloutConfig

# Short names accepted on the command line and in YAML for the long section names.
ALIASES = {"algo": "algorithm", "opt": "train"}


@dataclass(frozen=True)
class EnvConfig:
    name: str = "maze"                           # a registered env (envs.registry)
    options: dict = field(default_factory=dict)  # keyword arguments of the env's constructor, e.g. {size: 9}

    def __post_init__(self):
        require(self, "name", isinstance(self.name, str) and bool(self.name), "a registered env name, e.g. 'maze'")
        require(self, "options", isinstance(self.options, dict), "a mapping of the env's options")
        try:  # functions among the options are written to config.yaml by name: one that has none is refused now
            _plain(self.options)
        except ValueError as e:
            raise ConfigError(self, "options", self.options, f"a function among them cannot be named: {e}") from None


@dataclass(frozen=True)
class EvalConfig:
    seeds: Any = "0-63"          # the validation set (greedy): evaluated every `every` steps, stops the run
    test_seeds: Any = None       # the test set: scored before and after training, used for nothing else
    every: int = 0               # evaluate every k steps (0: only before and after training)
    target_success: Optional[float] = None  # stop training once eval success reaches it
    # The adapter the test set scores and summary.json names: "last" (the final step's) or "best" (of the
    # start, every periodic eval and the last step, the one with the highest validation success; a tie goes to
    # the earliest)
    select: str = "last"

    def __post_init__(self):
        try:
            parse_seeds(self.seeds)
            parse_seeds(self.test_seeds or [])
        except ValueError:
            raise ConfigError(self, "seeds", self.seeds, "a seed list like '0-63' or '0-3,10'") from None
        require(self, "seeds", bool(parse_seeds(self.seeds)), "at least one seed, e.g. '0-63', '0-3,10' or [0] (a "
                "number n means the first n seeds, so 0 means none): the evals before and after training need one")
        shared = sorted(set(parse_seeds(self.seeds)) & set(parse_seeds(self.test_seeds or [])))
        require(self, "test_seeds", not shared, f"seeds apart from eval.seeds (both hold {shared[:5]}): the test "
                "set is reported and nothing else, eval.seeds stops runs")
        check_number(self, "every", integer=True, ge=0)
        check_number(self, "target_success", ge=0, le=1, optional=True)
        require(self, "select", self.select in ("last", "best"), "'last' (the final step's adapter) or 'best' "
                "(the adapter with the highest validation success; eval.every sets how many are compared)")


@dataclass(frozen=True)
class CheckpointConfig:
    every: int = 10   # steps between checkpoints; one is always written at the end
    keep: int = 2     # checkpoints kept on disk, the newest

    def __post_init__(self):
        check_number(self, "every", integer=True, ge=1)
        check_number(self, "keep", integer=True, ge=1)


@dataclass(frozen=True)
class ClusterConfig:
    address: Optional[str] = None   # an existing Ray cluster ("auto", "ray://..."); None starts one here
    rollout_workers: int = 1        # one vLLM engine each (one per GPU on a cluster)
    # FSDP ranks. "auto": from the cluster Ray finds (grpo/driver/resources.py): one a GPU, colocated or not
    # (less the rollout workers' GPUs when not); 2 on a cluster without GPUs.
    train_ranks: int | str = "auto"
    colocate: bool = True           # rollout engines share the trainer's devices (vLLM sleeps while training)
    # Extra Ray resources each rollout worker / each train rank asks for, e.g. {"rollout_node": 1}: with
    # custom resources on the nodes (`ray start --resources`) they put rollout and training on chosen nodes.
    rollout_resources: dict = field(default_factory=dict)
    train_resources: dict = field(default_factory=dict)  # as rollout_resources, for each train rank

    def __post_init__(self):
        check_number(self, "rollout_workers", integer=True, ge=1)
        if self.train_ranks != "auto":
            check_number(self, "train_ranks", integer=True, ge=1, hint="or 'auto', resolved from the cluster's GPUs")
        check_bool(self, "colocate")
        for name in ("rollout_resources", "train_resources"):
            value = getattr(self, name)
            require(self, name, isinstance(value, dict) and all(
                isinstance(k, str) and k not in ("CPU", "GPU") and isinstance(v, (int, float))
                and not isinstance(v, bool) and v > 0 for k, v in value.items()),
                "a mapping of custom Ray resource names to positive amounts, e.g. {'rollout_node': 1} "
                "(CPU and GPU are set by the trainer)")


@dataclass(frozen=True)
class PipelineConfig:
    # Steps the rollouts may run ahead of the trainer. 0: on-policy, each step samples with the adapter the
    # last step published. k >= 1: the workers sample the next k steps' episodes while the trainer trains, so
    # a step may train on episodes sampled up to k adapter versions ago (docs/pipeline.md); it needs the two
    # sides on their own resources (cluster.colocate: false) and an off-policy correction.
    max_staleness: int = 0

    def __post_init__(self):
        check_number(self, "max_staleness", integer=True, ge=0, hint="0 is the on-policy loop")


@dataclass(frozen=True)
class WandbConfig:
    """Weights & Biases logging, optional (`pip install 'grpo[wandb]'`). mode "auto" logs online when an API
    key is configured (WANDB_API_KEY or `wandb login`) and the W&B server answers, else offline into the run
    folder, from where `wandb sync RUN/wandb/offline-run-*` uploads it later."""
    project: str = ""               # the W&B project to log to (required)
    mode: str = "auto"              # "auto" | "online" | "offline"
    entity: Optional[str] = None    # the W&B team or user; None: the key's default entity
    name: Optional[str] = None      # the run's display name; None: the run folder's name
    group: Optional[str] = None     # W&B's run group, e.g. one per sweep
    tags: tuple = ()                # W&B's run tags

    def __post_init__(self):
        require(self, "project", isinstance(self.project, str) and bool(self.project),
                "the W&B project to log to, e.g. 'maze-grpo'")
        require(self, "mode", self.mode in ("auto", "online", "offline"), "one of 'auto', 'online', 'offline'")
        for name in ("entity", "name", "group"):
            value = getattr(self, name)
            require(self, name, value is None or (isinstance(value, str) and bool(value)), "a non-empty string or None")
        require(self, "tags", isinstance(self.tags, (list, tuple)) and all(isinstance(t, str) for t in self.tags),
                "a list of strings")


@dataclass(frozen=True)
class MetricsConfig:
    tensorboard: bool = True                # write TensorBoard events into the run folder
    prometheus_port: Optional[int] = None   # serve /metrics while running (Grafana scrapes it)
    plots: bool = True                      # draw the run's curves (PNG) into the run folder at the end
    samples_per_step: int = 4   # decoded episodes a step written to samples.jsonl (0: none)
    wandb: Optional[WandbConfig] = None   # e.g. {project: maze-grpo}; None: no W&B

    def __post_init__(self):
        check_bool(self, "tensorboard")
        check_number(self, "prometheus_port", integer=True, ge=1, le=65535, optional=True)
        check_number(self, "samples_per_step", integer=True, ge=0)
        if isinstance(self.wandb, dict):
            object.__setattr__(self, "wandb", _build(WandbConfig, self.wandb, "metrics.wandb"))
        require(self, "wandb", self.wandb is None or isinstance(self.wandb, WandbConfig),
                "a mapping like {project: maze-grpo, mode: offline}, or None")
        # W&B is an optional dependency: say how to get it before Ray and vLLM start, not after.
        require(self, "wandb", self.wandb is None or importlib.util.find_spec("wandb") is not None,
                "set, but the wandb package is not installed: pip install 'grpo[wandb]' (or pip install wandb), "
                "or remove metrics.wandb")


SECTIONS = {
    "env": EnvConfig, "lora": LoraConfig, "algorithm": AlgorithmConfig, "train": TrainConfig,
    "rollout": RolloutConfig, "engine": VllmConfig, "eval": EvalConfig, "checkpoint": CheckpointConfig,
    "cluster": ClusterConfig, "metrics": MetricsConfig, "fault": FaultConfig, "pipeline": PipelineConfig,
}


@dataclass(frozen=True)
class RunConfig:
    model: str = ""                     # a local Hugging Face model folder or a Hub id, ORG/NAME (required)
    output_dir: str = "runs/grpo"       # the run folder: metrics, checkpoints, samples; a run there resumes
    steps: int = 100                    # GRPO steps (one rollout batch and one update each); the schedule's length
    tasks_per_step: int = 8             # tasks a step; each is rolled out algorithm.group_size times
    seed: int = 0                       # the vLLM engines' sampling seed (train.seed seeds the trainer)
    train_seed_offset: int = 1_000_000  # training draws task seeds from here on, skipping evaluated tasks
    adapter: Optional[str] = None       # start from this LoRA adapter folder instead of a fresh one
    env: EnvConfig = field(default_factory=EnvConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    engine: VllmConfig = field(default_factory=VllmConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)

    def __post_init__(self):
        # Plain dicts (YAML, keyword arguments) become their typed sections, and an env may be just a name.
        for name, cls in SECTIONS.items():
            value = getattr(self, name)
            if name == "env" and isinstance(value, str):
                value = {"name": value}
            if isinstance(value, dict):
                object.__setattr__(self, name, _build(cls, value, name))
            elif not isinstance(value, cls):
                raise ConfigError(self, name, value, f"a {cls.__name__} or a mapping of its fields")
        require(self, "model", isinstance(self.model, str) and bool(self.model),
                "the path of a local Hugging Face model folder, or a Hub id (ORG/NAME)")
        check_number(self, "steps", integer=True, ge=0)
        check_number(self, "tasks_per_step", integer=True, ge=1)
        check_number(self, "seed", integer=True, ge=0)
        check_number(self, "train_seed_offset", integer=True, ge=0)
        if not self.rollout.temperature > 0:
            raise ConfigError(self, "rollout.temperature", self.rollout.temperature,
                              "a number > 0 (training samples at it; greedy (0) is for evaluation)")
        if self.rollout.top_p < 1:
            raise ConfigError(self, "rollout.top_p", self.rollout.top_p,
                              "1 for training: vLLM's logprobs are renormalised over the nucleus and the trainer "
                              "scores the full softmax, which biases the sampler mismatch and shrinks the TIS "
                              "weights; set rollout.top_p: 1 and control exploration with rollout.temperature "
                              "(evaluation is greedy and unaffected)")
        self._check_reply_limit()
        object.__setattr__(self, "algorithm", self.algorithm.for_run(self.rollout.max_tokens_per_turn,
                                                                     self.rollout.history))
        self.train.check_length(self, "steps")
        self._check_pipeline()

    def _check_reply_limit(self) -> None:
        """rollout.max_tokens_per_turn: None is half the context (engine.max_model_len), room for long replies
        and for the prompt; a limit of the whole context would end every episode before its first token."""
        limit, context = self.rollout.max_tokens_per_turn, self.engine.max_model_len
        if limit is None:
            object.__setattr__(self, "rollout", dataclasses.replace(self.rollout, max_tokens_per_turn=context // 2))
        elif limit >= context:
            raise ConfigError(self, "rollout.max_tokens_per_turn", limit,
                              f"fewer tokens than engine.max_model_len={context}, which holds the prompt too; "
                              f"raise engine.max_model_len or leave max_tokens_per_turn unset ({context // 2})")

    def _check_pipeline(self) -> None:
        k = self.pipeline.max_staleness
        if k == 0:
            return
        why = f"pipeline.max_staleness={k} samples while the trainer trains"
        if self.cluster.colocate:
            raise ConfigError(self, "cluster.colocate", True, f"false: {why}, so rollouts and training need devices "
                              "of their own (colocated engines sleep while the trainer trains); or set "
                              "pipeline.max_staleness: 0")
        if self.algorithm.tis_cap is None and self.algorithm.old_logprobs != "sampler":
            raise ConfigError(self, "algorithm.tis_cap", None, f"a cap such as 2.0: {why}, so its episodes come "
                              "from an older adapter and the loss needs the sampler's logprobs to correct for it; "
                              "or set algorithm.old_logprobs: sampler (docs/pipeline.md)")
        if self.algorithm.dynamic_sampling:
            raise ConfigError(self, "algorithm.dynamic_sampling", True, f"false: {why}, and the extra draws of "
                              "dynamic sampling would wait for each other; or set pipeline.max_staleness: 0")

    @property
    def group_size(self) -> int:
        return self.algorithm.group_size

    @property
    def eval_seeds(self) -> list[int]:
        return parse_seeds(self.eval.seeds)

    @property
    def test_seeds(self) -> list[int]:
        return parse_seeds(self.eval.test_seeds or [])

    @property
    def held_out_seeds(self) -> list[int]:
        """The seeds whose tasks training never draws (envs/split.py): the validation and the test set."""
        return self.eval_seeds + self.test_seeds

    def engine_config(self) -> EngineConfig:
        """The vLLM engine this run asks for: the trainer's rollout workers and grpo.eval start the same."""
        return EngineConfig(model=self.model, max_lora_rank=self.lora.rank, seed=self.seed,
                            **dataclasses.asdict(self.engine))

    # ----------------------------------------------------------------------------------------- loading
    @classmethod
    def from_dict(cls, data: dict) -> "RunConfig":
        data = {ALIASES.get(k, k): v for k, v in (data or {}).items()}
        return _build(cls, data, "")

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: list[str] = ()) -> "RunConfig":
        import yaml

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"config file {str(path)!r} does not exist")
        data = yaml.load(path.read_text(), Loader=_loader()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: the top level must be a mapping of fields, got {type(data).__name__}")
        apply_overrides(data, overrides)
        return cls.from_dict(data)

    def to_dict(self) -> dict:
        return _plain(dataclasses.asdict(self))

    def to_yaml(self) -> str:
        import yaml

        return yaml.safe_dump(self.to_dict(), sort_keys=False)


# Fields that were stated twice: an old config that sets one learns where the value lives now.
MOVED = {
    "train.temperature": "not a field any more: the run has one temperature, rollout.temperature (vLLM samples "
                         "at it and the trainer scores at it); set that instead",
    "train.total_steps": "not a field any more: the cosine schedule runs over the run's `steps`; set steps",
    **{f"rollout.{name}": f"not a field of rollout any more: the vLLM engine's settings are one section, set "
                          f"engine.{name} instead" for name in (f.name for f in dataclasses.fields(VllmConfig))},
}


def apply_overrides(data: dict, overrides: list[str]) -> None:
    """`--algo.clip_high 0.28` or `--algo.clip_high=0.28`: values are read as YAML (numbers, lists, null)."""
    import yaml

    items = list(overrides)
    i = 0
    while i < len(items):
        arg = items[i]
        if not arg.startswith("--"):
            raise ValueError(f"override {arg!r} is not of the form --section.field VALUE")
        if "=" in arg:
            key, raw = arg[2:].split("=", 1)
            i += 1
        else:
            if i + 1 >= len(items):
                raise ValueError(f"override {arg} has no value: write {arg} VALUE")
            key, raw = arg[2:], items[i + 1]
            i += 2
        parts = [p.replace("-", "_") for p in key.split(".")]
        parts[0] = ALIASES.get(parts[0], parts[0])
        node = data
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ValueError(f"override --{key}: {p} is not a section")
        node[parts[-1]] = yaml.load(raw, Loader=_loader())


def _loader():
    """PyYAML's safe loader, except that `1e-3` is a number (YAML 1.1 wants `1.0e-3` and reads `1e-3` as a
    string, which every learning rate typed by hand runs into)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(
        r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"), list("-+0123456789."))
    return Loader


def _build(cls, data: dict, where: str):
    names = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(names))
    for key in unknown:
        if f"{where}.{key}" in MOVED:
            raise ConfigError(where, key, data[key], MOVED[f"{where}.{key}"])
    if unknown:
        section = f"the {where} section" if where else "the run config"
        raise ConfigError(cls.__name__, unknown[0], data[unknown[0]],
                          f"not a field of {section}; known fields: {', '.join(sorted(names))}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for k, v in data.items():
        if isinstance(v, list) and _is_tuple(hints.get(k)):
            v = tuple(v)
        kwargs[k] = v
    return cls(**kwargs)


def _is_tuple(hint) -> bool:
    return hint is tuple or typing.get_origin(hint) is tuple


def _plain(value):
    """The config as YAML holds it; a function as its "module:qualname" name (envs.dataset.function_name)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if callable(value):
        from envs.dataset import function_name

        return function_name(value)
    return value
