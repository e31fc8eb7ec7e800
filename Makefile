# Two commands a new user needs: `make demo` (the main job on the shipped tiny model) and `make test`.
# Both create .venv and install the project on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# A CPU build of torch is enough for the demo and the tests; on a GPU machine pass e.g.
# TORCH_SPEC="torch==2.13.0" with the CUDA index of your choice.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed
export RAY_AUTH_MODE ?= disabled
export RAY_USAGE_STATS_ENABLED ?= 0

.PHONY: demo test lint install serve bench bench-quick bench-gpu-smoke clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet "$(TORCH_SPEC)"
	$(VENV)/bin/pip install --quiet -e ".[test,bench]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m pipeline.run --config configs/tiny-cpu.yaml

test: $(STAMP)
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .

serve: $(STAMP)
	$(VENV)/bin/python -m actors.serving configs/serve-tiny.yaml

bench-quick: $(STAMP)
	$(PY) -m research paper --scale quick --device cpu --out benchmarks/results/quick

bench: $(STAMP)
	$(PY) -m research paper --scale full --device cpu --out benchmarks/results/paper

bench-gpu-smoke: $(STAMP)
	$(PY) -m benchmarks gpu --smoke --out benchmarks/results/gpu-smoke

clean:
	rm -rf $(VENV) .pytest_cache
