"""Decoded episodes (samples.jsonl), per-function reward means, the progress warnings and the end-of-run table."""
import json
import re

import pytest

from envs.base import Observation
from grpo.report.samples import SampleWriter, decode_episode, pick, reward_components
from grpo.report.table import step_warnings, summary_rows, table
from rollout.conversation import ChatFormat
from rollout.trajectory import Segment, Trajectory

FIRST, SECOND = "Find the way to the red square.", "You hit a wall."


@pytest.fixture(scope="module")
def chat(tiny_text):
    from transformers import AutoTokenizer

    return ChatFormat(AutoTokenizer.from_pretrained(tiny_text))


def _reply(chat, text):
    return chat.tok(text, add_special_tokens=False)["input_ids"] + [chat.tok.convert_tokens_to_ids("<|im_end|>")]


def _episode(chat, history: str) -> Trajectory:
    """Two turns as the rollout worker builds them for `history`: the ids are the source, text only for display."""
    r0, r1 = _reply(chat, "('move', 0)"), _reply(chat, "('stop', 'stop')")
    p0 = chat.prompt_ids(Observation(FIRST))
    if history == "full":
        obs = chat.observation_ids(Observation(SECOND), r0)
        ids = p0 + r0 + obs + r1
        segments = [Segment(ids, [0] * len(p0) + [1] * len(r0) + [0] * len(obs) + [1] * len(r1), [0.0] * len(ids))]
    else:
        ctx1 = (chat.drop_images(p0 + r0) + chat.observation_ids(Observation(SECOND), r0) if history == "text"
                else chat.prompt_ids(Observation(f"{FIRST}\n{SECOND}")))
        segments = [Segment(p0 + r0, [0] * len(p0) + [1] * len(r0), [0.0] * (len(p0) + len(r0))),
                    Segment(ctx1 + r1, [0] * len(ctx1) + [1] * len(r1), [0.0] * (len(ctx1) + len(r1)))]
    return Trajectory(task_id="maze:7", group_id=0, seed=7, segments=segments, turn_rewards=[0.0, 1.0], num_turns=2,
                      stop_reason="done", adapter_version=3, success=True,
                      info={"success": True, "rewards": {"task": 1.0}, "position": (1, 2)})


@pytest.mark.parametrize("history", ["full", "text", "none"])
def test_decoded_episode_shows_prompt_replies_and_feedback(chat, history):
    d = decode_episode(_episode(chat, history), chat.tok, chat.vision_ids)
    assert FIRST in d["prompt"] and SECOND not in d["prompt"]
    assert [t["reply"] for t in d["turns"]] == ["('move', 0)<|im_end|>", "('stop', 'stop')<|im_end|>"]
    assert [t["reward"] for t in d["turns"]] == [0.0, 1.0]
    # Turn 1's feedback is what turn 2's context added: the env's text, not the first prompt again.
    assert SECOND in d["turns"][0]["feedback"] and FIRST not in d["turns"][0]["feedback"]
    assert d["turns"][1]["feedback"] is None  # the episode ended: no observation entered a context
    assert (d["seed"], d["reward"], d["success"], d["stop_reason"], d["adapter_version"]) == (7, 1.0, True, "done", 3)
    assert d["rewards"] == {"task": 1.0} and d["info"]["position"] == [1, 2]
    json.dumps(d)


def test_sample_writer_appends_one_line_an_episode(tmp_path, chat, tiny_text):
    writer = SampleWriter(tmp_path / "samples.jsonl", str(tiny_text))
    assert writer.write([_episode(chat, "full"), _episode(chat, "none")], step=4) == 2
    writer.write([_episode(chat, "text")], step=5)
    lines = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [4, 4, 5] and all(FIRST in x["prompt"] for x in lines)


def test_a_writer_loads_its_tokenizer_in_the_background_and_a_bad_model_still_fails_its_write(tmp_path, chat,
                                                                                                tiny_text):
    import threading

    from grpo.report import samples

    model = str(tiny_text)
    samples._DECODERS.pop(model, None)
    SampleWriter(tmp_path / "samples.jsonl", model)
    for t in threading.enumerate():
        if t.name == "grpo-sample-decoder":
            t.join()
    assert model in samples._DECODERS  # loaded before any write asked for it
    missing = SampleWriter(tmp_path / "other.jsonl", str(tmp_path / "no-model"))
    with pytest.raises(OSError):
        missing.write([_episode(chat, "none")])
    assert not (tmp_path / "other.jsonl").exists()


def _traj(seed, rewards):
    return Trajectory(task_id=f"d:{seed}", group_id=seed, seed=seed, segments=[], turn_rewards=[0.0], num_turns=1,
                      stop_reason="done", adapter_version=1, info={"rewards": rewards} if rewards is not None else {})


def test_reward_components_average_over_the_episodes_that_report_them():
    trajs = [_traj(0, {"correct": 1.0, "format": 1.0}), _traj(1, {"correct": 0.0, "format": 0.5}), _traj(2, None)]
    assert reward_components(trajs) == {"correct": 0.5, "format": 0.75}
    assert reward_components([_traj(0, None)]) == {}


def test_pick_spreads_over_the_groups():
    assert pick(list(range(64)), 4) == [0, 16, 32, 48]
    assert pick([1, 2], 4) == [1, 2] and pick([1, 2], 0) == []


def test_step_warnings_in_plain_words():
    quiet = {"step": 3, "zero_signal_groups": 8, "rollout": {"episodes": 64, "turns": 384, "parse_errors": 384,
                                                              "mean_reward": 0.0, "stop_reasons": {"max_turns": 64}}}
    (only,) = step_warnings(quiet, group_size=8)
    assert "all 8 groups had equal rewards" in only and "384 of 384 replies did not parse" in only
    # Step-level advantages still rank the moves of equal-reward groups: no warning then.
    assert step_warnings(dict(quiet, step_adv_abs_mean=0.3), group_size=8) == []
    assert step_warnings(dict(quiet, zero_signal_groups=7), group_size=8) == []
    cut = {"step": 1, "zero_signal_groups": 0, "rollout": {"episodes": 16, "stop_reasons": {"context": 5, "done": 11}}}
    (only,) = step_warnings(cut, group_size=4, max_model_len=1024)
    assert "5 of 16 episodes ended at the context limit (engine.max_model_len=1024)" in only


def test_summary_table():
    summary = {"eval_before": 0.3125, "eval_after": 0.96875, "steps": 4, "grpo_wall_s": 206.4,
               "adapter_path": "runs/maze/store/adapters/v000005",
               "eval_after_detail": {"episodes": 64, "mean_reward": 1.2, "stop_reasons": {"done": 62, "max_turns": 2}},
               "test_before": 0.5, "test_after_detail": {"episodes": 64, "success_rate": 0.9375}}
    text = table(summary_rows(summary))
    lines = text.splitlines()
    assert lines[0].split("  ")[0] == "greedy success, 64 validation seeds, before training"
    assert lines[0].endswith("  31.2%") and lines[1].endswith("  96.9%")
    assert re.search(r"\ngreedy success, 64 test seeds, before training +50\.0%\n", text)
    assert re.search(r"\ngreedy success, 64 test seeds, after training +93\.8%\n", text)
    assert "eval episodes ended by" in text and "done 62, max_turns 2" in text
    assert re.search(r"\nGRPO wall time +206 s\n", text)
    assert len({line.rindex("  ") for line in lines}) == 1  # one column of values
