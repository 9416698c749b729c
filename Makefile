# make demo : set up .venv, build torch_llga, run the ResNet-50 demo
# make test : set up .venv, build torch_llga, run the pytest suite
# make test-sanitize : the same with torch_llga built with ASan + UBSan (TORCH_LLGA_SANITIZE=1)
# make bench : set up .venv with requirements-bench.txt too, build torch_llga, run the benchmark
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
DEPS   := $(VENV)/.deps-installed
BENCH_DEPS := $(VENV)/.bench-deps-installed
SO     := $(wildcard torch_llga/_C*.so)
SRCS   := $(shell find csrc -name '*.cpp' -o -name '*.h' -o -name '*.py' -o -name 'sources.txt') setup.py

.PHONY: all venv build build-sanitize demo test test-sanitize bench clean

all: build

$(PY):
	$(PYTHON) -m venv $(VENV)

$(DEPS): requirements.txt requirements-test.txt | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt -r requirements-test.txt
	touch $@

venv: $(DEPS)

# OpenVINO and ONNX Runtime, the bench's other runtimes: benchmark-only, never in the wheel or CI.
$(BENCH_DEPS): requirements-bench.txt $(DEPS)
	$(PY) -m pip install -q -r requirements-bench.txt
	touch $@

# Registered with pip as an editable install (package metadata and the torch_dynamo_backends entry
# point that torch.compile(backend="torch_llga") finds), again whenever setup.py changes.
$(VENV)/.registered: $(DEPS) setup.py
	TORCH_LLGA_METADATA_ONLY=1 $(PY) -m pip install -q --no-build-isolation --no-deps -e .
	touch $@

# Built in place (ninja, incremental). One stamp per build mode, and building one removes the
# other's: the in-place .so is whichever was built last. The sanitized objects live in
# build/*-sanitize (setup.py), so switching back and forth only relinks.
torch_llga/.built: $(DEPS) $(SRCS) $(VENV)/.registered
	MAX_JOBS=$${MAX_JOBS:-2} $(PY) setup.py -q build_ext --inplace
	rm -f torch_llga/.built-sanitize
	touch $@

torch_llga/.built-sanitize: $(DEPS) $(SRCS) $(VENV)/.registered
	TORCH_LLGA_SANITIZE=1 MAX_JOBS=$${MAX_JOBS:-2} $(PY) setup.py -q build_ext --inplace
	rm -f torch_llga/.built
	touch $@

build: torch_llga/.built

build-sanitize: torch_llga/.built-sanitize

demo: build
	$(PY) -m torch_llga.demo

test: build
	$(PY) -m pytest -q test

# The ASan/UBSan runtimes preloaded into python, with the options in test/sanitizers/run.
test-sanitize: build-sanitize
	test/sanitizers/run $(PY) -m pytest -q test

bench: build $(BENCH_DEPS)
	$(PY) -m torch_llga.bench

clean:
	rm -rf build torch_llga/_C*.so torch_llga/.built torch_llga/.built-sanitize *.egg-info
