"""Seed lists as people write them: on a command line, in YAML, in a config."""
from __future__ import annotations


def parse_seeds(spec) -> list[int]:
    """"0-63", "0-3,10,20-21", a list of ints, or an int count meaning 0..n-1."""
    if isinstance(spec, int) and not isinstance(spec, bool):
        return list(range(spec))
    if isinstance(spec, (list, tuple, range)):
        return [int(s) for s in spec]
    seeds: list[int] = []
    for part in str(spec).split(","):
        part = part.strip()
        if "-" in part[1:]:
            lo, hi = part.split("-", 1) if not part.startswith("-") else (part, part)
            seeds.extend(range(int(lo), int(hi) + 1))
        elif part:
            seeds.append(int(part))
    return seeds
