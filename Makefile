# The two commands the README promises:
#   make quickstart   set everything up, then run the whole chain on real data (fastdpr quickstart)
#   make test         set everything up, then run the test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# CPU wheel on machines without a GPU; GPU users install their own torch into the venv first and it is kept.
TORCH_SPEC  ?= torch==2.13.0
TRITON_SPEC ?= triton==3.7.1
PYTEST_ARGS ?=

.PHONY: setup build test sanitize quickstart quickstart-fast bench microbench clean

setup: $(VENV)/.fastdpr-installed

$(VENV)/.fastdpr-installed: pyproject.toml CMakeLists.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -c "import triton" 2>/dev/null || $(BIN)/python -m pip install -q "$(TRITON_SPEC)"
	# build requirements of everything installed below with --no-build-isolation: fastdpr itself, and peers that
	# ship only an sdist for some Pythons (hnswlib's setup.py imports numpy and pybind11)
	$(BIN)/python -m pip install -q "scikit-build-core>=0.10" "pybind11>=2.12" "numpy>=1.24" setuptools wheel
	$(BIN)/python -m pip install -q --no-build-isolation -e ".[test,quickstart]"
	# the Lucene peer (tests of BM25 agreement, benchmarks): pyserini's jar only, its other requirements are not needed
	$(BIN)/python -m pip install -q "pyjnius>=1.6"
	$(BIN)/python -m pip install -q --no-deps "pyserini==0.19.2"
	touch $@

# rebuild the C++ extension after editing csrc/
build: setup
	$(BIN)/python -m pip install -q --no-build-isolation --no-deps -e .

test: setup build
	TRITON_INTERPRET=1 HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -n 2 $(PYTEST_ARGS)

# the index and fuzz tests against an AddressSanitizer + UBSan build of the extension (build/sanitize);
# SANITIZE_CLEAN=1 builds it from scratch
sanitize: setup
	TRITON_INTERPRET=1 HF_HUB_OFFLINE=1 bash scripts/sanitize_index.sh $(PYTEST_ARGS)

quickstart: setup
	HF_HUB_OFFLINE=1 $(BIN)/fastdpr quickstart

quickstart-fast: setup
	HF_HUB_OFFLINE=1 $(BIN)/fastdpr quickstart --fast

bench: setup
	$(BIN)/fastdpr bench

# pytest-benchmark micro-benchmarks of the hot paths (benchmarks/micro; never collected by `make test`). Each run is
# compared with the previous saved one, then saved under .benchmarks/. MICROBENCH_ARGS adds options, e.g.
# MICROBENCH_ARGS="--benchmark-compare-fail=median:25%" to fail on a regression, or "-k index".
MICROBENCH_ARGS ?=
microbench: setup
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest benchmarks/micro -q -p no:xdist --benchmark-autosave \
		--benchmark-compare --benchmark-columns=min,median,iqr,rounds --benchmark-sort=name $(MICROBENCH_ARGS)

clean:
	rm -rf build dist *.egg-info
