"""benchmarks/objectives.py's bookkeeping (arms the configs take or refuse, kept runs, the cells) and its table
block, from hand-written runs: nothing trains here."""
import json

import pytest

from benchmarks import objectives as O
from benchmarks import table


def _run(task, arm, seed, before, after, wall):
    return {"task": task, "arm": arm, "seed": seed, "exit_code": 0, "test_before": before, "test_after": after,
            "wall_s": wall, "cpu": "EPYC Y", "date": "2026-12-05T01:00:00Z"}


def test_the_maze_refuses_the_sequence_level_arms_and_takes_the_rest():
    refused = {(t, a) for t in O.TASKS for a in O.ARMS if O.refusal(t, a)}
    assert refused == {("maze", "gspo"), ("maze", "is_sequence_mask"), ("maze", "is_geometric_mask")}
    assert "rollout.history='none'" in O.refusal("maze", "gspo")


def test_cells_give_mean_and_range_only_once_every_seed_ran():
    runs = [_run("reasoning", "cispo", s, 0.2, a, w) for s, a, w in ((0, 0.6, 500), (1, 0.7, 700), (2, 0.5, 600))]
    runs.append(_run("reasoning", "sapo", 0, 0.2, 0.4, 100))
    cells = O.summarize(runs, {"maze/gspo": "no"})
    cispo = cells["reasoning/cispo"]
    assert cispo["complete"] and cispo["test_after_mean"] == 0.6 and cispo["test_after_range"] == [0.5, 0.7]
    assert cispo["gain_mean"] == 0.4 and cispo["gain_range"] == [0.3, 0.5] and cispo["wall_s_mean"] == 600
    assert cells["reasoning/sapo"] == {"seeds": [0], "complete": False}
    assert cells["maze/gspo"] == {"refused": "no"}


def test_a_kept_run_is_taken_under_its_protocol_and_refused_under_another(tmp_path):
    wanted = O.protocol("reasoning", "cispo", 1)
    assert wanted["overrides"] == ["--algorithm.loss_type=cispo", "--seed", "1", "--train.seed", "1"]
    run = _run("reasoning", "cispo", 1, 0.2, 0.6, 500)
    assert O.kept(tmp_path, "reasoning-cispo-seed1", wanted) is None
    O.keep(tmp_path, run, wanted)
    assert not list(tmp_path.glob("*.tmp"))
    assert O.kept(tmp_path, "reasoning-cispo-seed1", wanted)["run"] == run
    with pytest.raises(SystemExit, match="another protocol \\(differs in config_sha256\\)"):
        O.kept(tmp_path, "reasoning-cispo-seed1", {**wanted, "config_sha256": "0"})


def test_only_a_clean_run_with_both_test_figures_is_kept():
    assert O.clean(_run("maze", "grpo", 0, 0.4, 0.9, 500))
    assert not O.clean({**_run("maze", "grpo", 0, 0.4, 0.9, 500), "exit_code": 1})
    assert not O.clean({**_run("maze", "grpo", 0, 0.4, None, 500)})
    assert O.last_json('progress\n{"test_before": 0.2, "test_after": 0.5}\nwall time 3 s\n') == {
        "test_before": 0.2, "test_after": 0.5}
    assert O.last_json("Traceback\n{not json\n") is None


def test_the_block_gives_complete_cells_refusals_and_seeds_still_to_run(tmp_path):
    runs = [_run("reasoning", "cispo", s, 0.2, a, w) for s, a, w in ((0, 0.6, 500), (1, 0.7, 700), (2, 0.5, 600))]
    runs.append(_run("maze", "cispo", 0, 0.4, 0.9, 300))
    cells = O.summarize(runs, {"maze/gspo": "refused"})
    (tmp_path / "objectives.json").write_text(json.dumps({
        "quick": False, "tasks": O.TASKS, "arms": O.ARMS, "seeds": [0, 1, 2], "cells": cells,
        "verdicts": O.verdicts(cells, runs), "runs": runs}))
    lines = table.objectives(tmp_path).splitlines()
    assert lines[0] == ("| arm | reasoning: test after | reasoning: gain | reasoning: wall s | maze: test after | "
                        "maze: gain | maze: wall s |")
    (cispo,) = [line for line in lines if line.startswith("| cispo ")]
    assert cispo == "| cispo | 60.0% (50.0%-70.0%) | +40.0% (+30.0% to +50.0%) | 600 | 1 of 3 seeds run |  |  |"
    (gspo,) = [line for line in lines if line.startswith("| gspo ")]
    assert gspo.endswith("| refused by the config |  |  |")
    assert lines[-4:] == ["Runs kept: 4, on EPYC Y (2026-12-05).", "",
                          "- reasoning: 1 of 9 arms complete, none beside its baseline yet.",
                          "- maze: 0 of 8 arms complete, none beside its baseline yet."]


def test_verdicts_name_an_arm_only_when_every_seed_is_above_or_below_its_baseline():
    def cell(task, arm, afters):
        return [_run(task, arm, s, 0.2, a, 100) for s, a in enumerate(afters)]

    runs = (cell("reasoning", "grpo", (0.5, 0.55, 0.6)) + cell("reasoning", "cispo", (0.61, 0.65, 0.7))
            + cell("reasoning", "sapo", (0.3, 0.4, 0.49)) + cell("reasoning", "dr_grpo", (0.45, 0.58, 0.7))
            + cell("reasoning", "stale", (0.4, 0.5, 0.6)) + cell("reasoning", "is_token_truncate", (0.55, 0.6, 0.61))
            + cell("maze", "grpo", (0.8, 0.85, 0.9)) + cell("maze", "cispo", (0.69, 0.93, 0.93))
            + [_run("maze", "sapo", 0, 0.4, 0.0, 1100), _run("maze", "sapo", 1, 0.4, 0.4, 500)])
    v = O.verdicts(O.summarize(runs, {"maze/gspo": "no", "maze/is_sequence_mask": "no"}), runs)
    # dr_grpo's range holds grpo's, is_token_truncate's overlaps stale's: neither is named. On the maze grpo and
    # cispo tie for the highest mean (their float sums differ in the last bit): both are named.
    assert v["reasoning"] == ("reasoning: 6 of 9 arms complete (dr_grpo, cispo, sapo, stale, is_token_truncate "
                              "beside their baselines): cispo above grpo, sapo below grpo at every seed; highest "
                              "mean test accuracy after, cispo (65.3%).")
    assert v["maze"] == ("maze: 2 of 7 arms complete (cispo beside its baseline): no arm is above or below its "
                         "baseline at every seed (the ranges overlap): no winner; highest mean test accuracy after, "
                         "grpo and cispo (85.0%). sapo seed 0 ended below its start (40.0% -> 0.0%).")


def test_a_seed_outside_the_protocol_is_refused_before_anything_runs(capsys):
    with pytest.raises(SystemExit):
        O.main(["--arms", "cispo", "--tasks", "maze", "--seeds", "3"])
    assert "--seeds 3: the protocol's seeds are 0,1,2" in capsys.readouterr().err
