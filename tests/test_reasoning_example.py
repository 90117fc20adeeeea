"""The reasoning example's data and sets: the shipped rows are the generator's, every question is distinct,
the three sets share none, and the README's table is the one results/grpo.json renders."""
import json
from collections import Counter
from pathlib import Path

import envs
from envs.split import held_out, training_seeds
from examples.reasoning import seeds, tasks
from grpo.config import RunConfig

HERE = Path(__file__).resolve().parents[1] / "examples" / "reasoning"


def test_the_shipped_rows_are_the_generators_and_distinct():
    shipped = [json.loads(line) for line in tasks.DATA.read_text().splitlines()]
    assert shipped == tasks.rows()
    assert len({r["prompt"] for r in shipped}) == len(shipped) == 2048
    # The held-out rows mix the four kinds alike; the products run out at 88, so training has 40 of them.
    assert Counter(r["family"] for r in shipped[:192]) == {"add": 48, "sub": 48, "mul": 48, "max": 48}
    assert Counter(r["family"] for r in shipped)["mul"] == 88
    for r in shipped:
        a = [int(x) for x in r["prompt"].rstrip("?").replace(",", " ").split() if x.isdigit()]
        expected = {"add": a[0] + a[1], "sub": a[0] - a[1], "mul": a[0] * a[1], "max": max(a)}[r["family"]]
        assert r["answer"] == str(expected), r


def test_the_reward_reads_the_replys_last_integer():
    row = {"answer": "101"}
    assert tasks.correct("", "99 + 2 equals 101.", row) == 1.0
    assert tasks.correct("", "101 is close, but 99 + 2 = 102", row) == 0.0
    assert tasks.correct("", "no number here", row) == 0.0
    assert tasks.correct("", "the sum is 1,01", row) == 1.0  # thousands commas are dropped before parsing
    assert tasks.correct("", "-5", {"answer": "-5"}) == 1.0


def test_training_never_draws_a_validation_or_test_question():
    cfg = RunConfig.from_yaml(HERE / "cpu.yaml")
    assert (cfg.eval_seeds, cfg.test_seeds) == (list(range(64)), list(range(64, 192)))
    env = envs.make(cfg.env.name, **cfg.env.options)
    drawn, _ = training_seeds(env, cfg.train_seed_offset, 5000, held_out(env, cfg.held_out_seeds))
    rows = {env.task_key(s) for s in drawn}
    assert min(rows) == 192 and rows == set(range(192, 2048))


def test_the_readme_table_is_the_results_rendered():
    res = json.loads(seeds.RESULTS.read_text())
    text = seeds.README.read_text()
    block = text.split(seeds.BEGIN, 1)[1].split(seeds.END, 1)[0].strip()
    assert block == seeds.table(res)
    assert [r["seed"] for r in res["seeds"]] == list(seeds.SEEDS)
    top = seeds.TOP_README.read_text().split(seeds.HEADLINE[0], 1)[1].split(seeds.HEADLINE[1], 1)[0].strip()
    assert top == seeds.headline(res)
