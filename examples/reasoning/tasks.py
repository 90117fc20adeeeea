"""The reasoning example's tasks: short arithmetic questions with one integer answer, and their reward.

Four families, chosen by measuring SmolLM2-135M-Instruct's greedy accuracy (the last integer of its reply,
64 questions each, 2026-12-03): a two-digit number plus a digit 17%, minus a digit 36%, a product of small
numbers 31%, the largest of three numbers 25% (it names the right one in 73% of replies, but not last). So
the model starts with signal on each, and part of what it can learn is to end its reply with the answer.

Every question appears once (rows are deduplicated by their text), so the validation rows (0-63), the test
rows (64-191) and the training rows (the rest) share no item: the dataset env's row is the task, and the
trainer's draw skips the held-out rows (envs/split.py).

    python -m examples.reasoning.tasks --write     # regenerates examples/reasoning/data.jsonl
"""
from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data.jsonl"
ROWS = 2048
SEED = 0


FAMILIES = ("add", "sub", "mul", "max")


def _question(rng: random.Random, family: str) -> tuple[str, int]:
    if family == "add":
        a, b = rng.randint(10, 99), rng.randint(1, 9)
        return f"What is {a} + {b}?", a + b
    if family == "sub":
        a, b = rng.randint(10, 99), rng.randint(1, 9)
        return f"What is {a} - {b}?", a - b
    if family == "mul":
        a, b = rng.randint(2, 12), rng.randint(2, 9)
        return f"What is {a} times {b}?", a * b
    a, b, c = rng.sample(range(1, 100), 3)
    return f"Which is the largest of {a}, {b} and {c}?", max(a, b, c)


def rows(n: int = ROWS, seed: int = SEED) -> list[dict]:
    """n distinct questions, the families in turn, so every stretch of rows mixes them alike; a family whose
    questions run out (the products: 88 in all) leaves the rotation."""
    rng, seen, out, families = random.Random(seed), set(), [], list(FAMILIES)
    while len(out) < n and families:
        for family in list(families):
            for _ in range(1000):
                prompt, answer = _question(rng, family)
                if prompt not in seen:
                    seen.add(prompt)
                    out.append({"prompt": prompt, "answer": str(answer), "family": family})
                    break
            else:
                families.remove(family)
    return out[:n]


def final_integer(text: str) -> str | None:
    found = re.findall(r"-?\d+", text.replace(",", ""))
    return found[-1] if found else None


def correct(prompt: str, completion: str, row) -> float:
    """1 when the reply's last integer is the answer: the reply may reason first, and must end on it."""
    return float(final_integer(completion) == row["answer"])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"write {DATA.name}")
    args = ap.parse_args(argv)
    text = "".join(json.dumps(r) + "\n" for r in rows())
    if args.write:
        DATA.write_text(text)
    print(f"{ROWS} rows, {len(text)} bytes" + (f", written to {DATA}" if args.write else ""))


if __name__ == "__main__":
    main()
