"""Run any GRPO config: `python -m grpo.train CONFIG.yaml [--section.field VALUE ...] [--dry-run]`.

--dry-run loads and validates the config and prints it resolved, without starting Ray, vLLM or a GPU.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 epilog="overrides: --algo.clip_high 0.28 --steps 10 --rollout.temperature=0.7")
    ap.add_argument("config", help="a YAML file of RunConfig fields")
    ap.add_argument("--dry-run", action="store_true", help="validate and print the resolved config, then exit")
    args, overrides = ap.parse_known_args(argv)

    from grpo.algo.config import ConfigError
    from grpo.config import RunConfig

    try:
        config = RunConfig.from_yaml(args.config, overrides)
    except (ConfigError, ValueError, FileNotFoundError) as e:
        print(f"grpo.train: bad config {args.config}: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        import envs

        try:
            envs.make(config.env.name, **config.env.options)
        except (ValueError, TypeError) as e:
            print(f"grpo.train: bad env options in {args.config}: {e}", file=sys.stderr)
            return 2
        print(config.to_yaml())
        model_ok = (Path(config.model) / "config.json").is_file()
        print(json.dumps({"valid": True, "model_found": model_ok, "output_dir": config.output_dir}))
        if not model_ok:
            print(f"note: model folder {config.model!r} is not on this machine; a real run needs it",
                  file=sys.stderr)
        return 0

    import envs
    from grpo.driver.trainer import Trainer

    try:
        trainer = Trainer(config)
    except (FileNotFoundError, ValueError, envs.EnvError) as e:
        print(f"grpo.train: {e}", file=sys.stderr)
        return 2
    summary = trainer.fit()
    print(json.dumps({k: summary[k] for k in ("eval_before", "eval_after", "unseen_after", "steps", "grpo_wall_s")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
