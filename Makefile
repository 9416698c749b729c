# make demo : set up .venv, build torch_llga, run the ResNet-50 demo
# make test : set up .venv, build torch_llga, run the pytest suite
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
DEPS   := $(VENV)/.deps-installed
SO     := $(wildcard torch_llga/_C*.so)
SRCS   := $(shell find csrc -name '*.cpp' -o -name '*.h' -o -name 'sources.txt') setup.py

.PHONY: all venv build demo test bench clean

all: build

$(PY):
	$(PYTHON) -m venv $(VENV)

$(DEPS): requirements.txt requirements-test.txt | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt -r requirements-test.txt
	touch $@

venv: $(DEPS)

# Built in place (ninja, incremental), then registered with pip as an editable install once.
torch_llga/.built: $(DEPS) $(SRCS)
	MAX_JOBS=$${MAX_JOBS:-2} $(PY) setup.py -q build_ext --inplace
	$(PY) -m pip show -q torch_llga >/dev/null 2>&1 || $(PY) -m pip install -q --no-build-isolation --no-deps -e .
	touch $@

build: torch_llga/.built

demo: build
	$(PY) -m torch_llga.demo

test: build
	$(PY) -m pytest -q test

bench: build
	$(PY) -m torch_llga.bench

clean:
	rm -rf build torch_llga/_C*.so torch_llga/.built *.egg-info
