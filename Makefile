# make demo : set up .venv, build torch_llga, run the ResNet-50 demo
# make test : set up .venv, build torch_llga, run the pytest suite
# make test TORCH=2.15.0 : the same on another torch, in .venv-torch2.15.0 (supported: 2.12 to 2.15;
#     TORCH=2.13.0+cpu for the CPU-only build, with TORCH_INDEX=https://download.pytorch.org/whl/cpu
#     where pip does not already see that wheel)
# make test-sanitize : the same with torch_llga built with ASan + UBSan (TORCH_LLGA_SANITIZE=1)
# make bench : set up .venv with requirements-bench.txt too, build torch_llga, run the benchmark
# make openvino-venv : .venv-openvino, the LLM bench's openvino backend (requirements-bench-llm.txt)
PYTHON ?= python3
TORCH  ?=
ifeq ($(TORCH),)
VENV   ?= .venv
else
VENV   ?= .venv-torch$(TORCH)
endif
PY     := $(VENV)/bin/python
DEPS   := $(VENV)/.deps-installed
BENCH_DEPS := $(VENV)/.bench-deps-installed
SRCS   := $(shell find csrc -name '*.cpp' -o -name '*.h' -o -name '*.py' -o -name 'sources.txt') setup.py

# The torchvision release built for each supported torch (none exists for 2.15 yet, nor for the
# CPU-only wheels on PyPI: the tests that need it skip).
TORCHVISION_2.12.1 := 0.27.1
TORCHVISION_2.13.0 := 0.28.0
TORCHVISION_2.14.1 := 0.29.1
TORCHVISION := $(TORCHVISION_$(TORCH))
# Another torch than the pin comes from the package index, past any pip constraint that caps torch
# (an empty PIP_CONSTRAINT does not override a configured one; /dev/null does).
TORCH_PIP := PIP_CONSTRAINT=/dev/null $(PY) -m pip install -q $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))

.PHONY: all venv build build-sanitize demo test test-sanitize bench openvino-venv clean

all: build

$(PY):
	$(PYTHON) -m venv $(VENV)

$(DEPS): requirements.txt requirements-test.txt | $(PY)
	$(PY) -m pip install -q --upgrade pip
ifeq ($(TORCH),)
	$(PY) -m pip install -q -r requirements.txt -r requirements-test.txt
else
	grep -hvE '^torch(vision)?==' requirements.txt requirements-test.txt > $(VENV)/requirements-other-torch.txt
	$(TORCH_PIP) torch==$(TORCH) $(if $(TORCHVISION),torchvision==$(TORCHVISION)) -r $(VENV)/requirements-other-torch.txt
endif
	touch $@

venv: $(DEPS)

# OpenVINO and ONNX Runtime, the bench's other runtimes: benchmark-only, never in the wheel or CI.
$(BENCH_DEPS): requirements-bench.txt $(DEPS)
	$(PY) -m pip install -q -r requirements-bench.txt
	touch $@

# The LLM bench's openvino backend: optimum-intel pins an older transformers than the tests use, so
# it lives in a venv of its own, which sees .venv's packages (torch) after its own (a .pth file).
OV_VENV := .venv-openvino
$(OV_VENV)/.installed: requirements-bench-llm.txt $(DEPS)
	$(PYTHON) -m venv $(OV_VENV)
	$(PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > \
	  "$$($(OV_VENV)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/zz_torch_llga_venv.pth"
	$(OV_VENV)/bin/python -m pip install -q --no-deps -r requirements-bench-llm.txt
	touch $@

openvino-venv: $(OV_VENV)/.installed

# Registered with pip as an editable install (package metadata, requiring the torch it is built
# for, and the torch_dynamo_backends entry point that torch.compile(backend="torch_llga") finds),
# again whenever setup.py changes.
$(VENV)/.registered: $(DEPS) setup.py
	TORCH_LLGA_METADATA_ONLY=1 PIP_CONSTRAINT=/dev/null $(PY) -m pip install -q --no-build-isolation --no-deps -e .
	touch $@

# Built in place (ninja, incremental): torch_llga/_C*.so is whichever venv and mode built last.
# One stamp per venv and mode, and building one removes the others'. The objects live in build/
# per torch version and mode (setup.py), so switching back and forth only relinks or copies.
$(VENV)/.built: $(DEPS) $(SRCS) $(VENV)/.registered
	MAX_JOBS=$${MAX_JOBS:-2} $(PY) setup.py -q build_ext --inplace
	rm -f .venv*/.built .venv*/.built-sanitize
	touch $@

$(VENV)/.built-sanitize: $(DEPS) $(SRCS) $(VENV)/.registered
	TORCH_LLGA_SANITIZE=1 MAX_JOBS=$${MAX_JOBS:-2} $(PY) setup.py -q build_ext --inplace
	rm -f .venv*/.built .venv*/.built-sanitize
	touch $@

build: $(VENV)/.built

build-sanitize: $(VENV)/.built-sanitize

demo: build
	$(PY) -m torch_llga.tools.demo

# TORCH_LLGA_OTHER_TORCH_PYTHON: the pinned venv's python, when testing another torch, so that
# test_build_info.py imports this build under a torch it was not built for.
test: build
	$(if $(TORCH),$(if $(wildcard .venv/bin/python),TORCH_LLGA_OTHER_TORCH_PYTHON=$(abspath .venv/bin/python))) \
	$(PY) -m pytest -q test

# The ASan/UBSan runtimes preloaded into python, with the options in test/sanitizers/run.
test-sanitize: build-sanitize
	test/sanitizers/run $(PY) -m pytest -q test

bench: build $(BENCH_DEPS)
	$(PY) -m torch_llga.tools.bench

clean:
	rm -rf build torch_llga/_C*.so .venv*/.built .venv*/.built-sanitize *.egg-info
