from dataclasses import dataclass

import numpy as np
import pytest

from grpo.algo.config import AlgorithmConfig, ConfigError, check_choice, check_number, require


def test_defaults_are_valid():
    c = AlgorithmConfig()
    assert (c.group_size, c.scale_rewards, c.baseline, c.loss_agg) == (8, "group", "mean", "token_mean")
    assert (c.kl_coef, c.tis_cap, c.dual_clip) == (0.0, None, None)
    assert AlgorithmConfig(group_size=np.int64(4)).group_size == 4  # numpy integers from a sweep are integers


@pytest.mark.parametrize(
    "field, value, allowed",
    [
        ("group_size", 1, "an integer >= 2"),
        ("group_size", 2.5, "an integer >= 2"),
        ("group_size", True, "an integer >= 2"),
        ("scale_rewards", "batch", "one of 'group', 'none'"),
        ("baseline", "median", "one of 'mean', 'leave_one_out'"),
        ("eps", 0.0, "a number > 0"),
        ("eps", "1e-6", "a number > 0"),  # what YAML makes of 1e-6
        ("drop_zero_signal_groups", "yes", "True or False"),
        ("clip_low", -0.1, "a number >= 0 and < 1"),
        ("clip_low", 1.0, "a number >= 0 and < 1"),
        ("clip_high", -0.2, "a number >= 0"),
        ("clip_high", float("nan"), "a number >= 0"),
        ("dual_clip", 1.0, "a number > 1, or None"),
        ("loss_agg", "mean", "one of 'token_mean', 'sequence_mean', 'seq_sum_norm'"),
        ("seq_sum_norm_len", 0, "an integer >= 1, or None"),
        ("kl_coef", -0.01, "a number >= 0"),
        ("kl_estimator", "k4", "one of 'k1', 'k2', 'k3'"),
        ("tis_cap", 0.5, "a number >= 1, or None"),
        ("old_logprobs", "vllm", "one of 'trainer', 'sampler'"),
    ],
)
def test_bad_value_names_field_value_and_what_is_allowed(field, value, allowed):
    with pytest.raises(ConfigError) as e:
        AlgorithmConfig(**{field: value})
    assert isinstance(e.value, ValueError)
    assert (e.value.field, e.value.value) == (f"AlgorithmConfig.{field}", value)
    message = str(e.value)
    assert f"AlgorithmConfig.{field}={value!r}" in message and allowed in message


def test_seq_sum_norm_needs_its_length():
    with pytest.raises(ConfigError, match=r"AlgorithmConfig\.seq_sum_norm_len=None .*loss_agg='seq_sum_norm'"):
        AlgorithmConfig(loss_agg="seq_sum_norm")
    assert AlgorithmConfig(loss_agg="seq_sum_norm", seq_sum_norm_len=512).seq_sum_norm_len == 512


def test_k1_is_a_metric_not_a_penalty():
    with pytest.raises(ConfigError, match=r"AlgorithmConfig\.kl_estimator='k1' .*zero expected gradient.*'k3'.*'k2'"):
        AlgorithmConfig(kl_coef=0.05, kl_estimator="k1")
    assert AlgorithmConfig(kl_estimator="k1").kl_coef == 0.0


def test_sampler_old_logprobs_refuse_tis():
    # TIS weighs by exp(old - sampler): with the sampler's logprobs as the old ones that is 1 on every token.
    refused = (r"AlgorithmConfig\.old_logprobs='sampler' .*algorithm\.tis_cap=2\.0.*does nothing; "
               r"set algorithm\.tis_cap: null.*algorithm\.old_logprobs: trainer")
    with pytest.raises(ConfigError, match=refused):
        AlgorithmConfig(old_logprobs="sampler", tis_cap=2.0)
    assert AlgorithmConfig().old_logprobs == "trainer"
    assert AlgorithmConfig(old_logprobs="sampler").tis_cap is None
    assert AlgorithmConfig(old_logprobs="trainer", tis_cap=2.0).tis_cap == 2.0


def test_helpers_serve_other_config_classes():
    @dataclass
    class LoraConfig:
        rank: int = 8
        dropout: float = 0.0
        target: str = "all-linear"

        def __post_init__(self):
            check_number(self, "rank", integer=True, ge=1, hint="e.g. 8 or 16")
            check_number(self, "dropout", ge=0, lt=1)
            check_choice(self, "target", ("all-linear", "attention"))
            require(self, "rank", self.rank % 2 == 0, "an even integer")

    LoraConfig()
    with pytest.raises(ConfigError, match=r"^LoraConfig\.rank=0 is not allowed: an integer >= 1 \(e\.g\. 8 or 16\)$"):
        LoraConfig(rank=0)
    with pytest.raises(ConfigError, match=r"LoraConfig\.rank=3 is not allowed: an even integer"):
        LoraConfig(rank=3)
    with pytest.raises(ConfigError, match=r"LoraConfig\.target='mlp' is not allowed: one of 'all-linear', 'attent"):
        LoraConfig(target="mlp")
