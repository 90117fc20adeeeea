"""`python -m grpo.train CONFIG.yaml [...]`: the same as `grpo train CONFIG.yaml [...]` (grpo.cli)."""
from __future__ import annotations

import sys

from grpo.cli import train


def main(argv: list[str] | None = None) -> int:
    return train(sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":
    sys.exit(main())
