"""Tools around the engine, outside its core: `doctor` (checks a machine or a model) and `tiny_models`
(small models of real architectures, built offline, for tests, examples and benchmarks)."""
