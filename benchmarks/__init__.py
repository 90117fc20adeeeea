"""The benchmarks, each run from the repository root as `python -m benchmarks.NAME` (the `_` modules are the
parts they share); each writes its result with the machine it ran on to benchmarks/results/ (_machine.py)."""
