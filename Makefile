# The README's commands. `make run` creates .venv with what the job needs (ringcomp, mpi4py
# and the MPICH wheel as the embedded MPI); `make test` (and `make setup`) adds PyTorch and
# the test tools. Each installs on first use; re-runs only reinstall when setup.cfg or
# pyproject.toml changed.
#
#   make run          the main job: a short training run under mpiexec (4 ranks)
#   make test         the whole test suite (serial + MPI at 1..5 ranks)
#   make bench        the full benchmark table at 4 ranks
#   make convergence  the convergence study (CONVERGENCE_NP ranks, default 8; TASKS, default
#                     mlp; results/convergence-p8*)
#   make network      the network study on emulated 4-host links (root; results/network-p4*)
#   make lint         ruff
#   make horovod-examples HOROVOD=<checkout>   Horovod's PyTorch examples by their import line
#
# Variables: PYTHON (interpreter for the venv, default python3), NP (ranks, default 4),
# STUDY_ARGS (extra options of hops, convergence, network, time-to-accuracy: e.g. --quick),
# MPI=site to use a site MPI (mpi4py built against the mpicc on PATH, no MPICH wheel).

PYTHON ?= python3
VENV   ?= .venv
CONVERGENCE_NP ?= 8
TASKS ?= mlp
NP     ?= 4
MPI    ?= embedded
# the torch the tests run against: the extra allows a range; this pin picks the CPU build a
# package mirror serves quickly (an unpinned torch can pull the multi-GB CUDA build)
TORCH_PIN ?= torch==2.13.0
# the OpenBLAS kernels the value studies (hops, convergence) run under: their records'
# digests are checked under these (ringcomp/experiments/digests.py: DIGEST_BLAS)
DIGEST_BLAS ?= Haswell

BIN   := $(abspath $(VENV))/bin
STAMP := $(VENV)/.installed-$(MPI)
export PATH := $(BIN):$(PATH)
# MPICH's shared-memory collectives may busy-spin below MPI_THREAD_MULTIPLE (README, pitfalls)
export MPIR_CVAR_POSIX_NUM_COLLS_THRESHOLD ?= 1000000000

# what `make run` installs (RUN_STAMP), and what everything else adds (STAMP)
RUN_STAMP := $(VENV)/.installed-$(MPI)-run
ifeq ($(MPI),site)
RUN_EXTRAS :=
EXTRAS := test,torch
PIP_MPI := --no-binary=mpi4py --no-cache-dir mpi4py
else
RUN_EXTRAS := mpich
EXTRAS := mpich,test,torch
PIP_MPI :=
endif

.PHONY: run test bench lint info clean setup hops convergence network time-to-accuracy \
        horovod-examples

setup: $(STAMP)

# the venv, pip and (MPI=site) mpi4py built against the site's MPI; then the stamps of
# another MPI go
define venv
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || { \
	  echo "python3 -m venv failed: on Debian run 'apt-get install -y python3-venv'"; exit 1; }
	$(BIN)/python -m pip install -q --upgrade pip
	$(if $(PIP_MPI),$(BIN)/python -m pip install -q $(PIP_MPI))
	@find $(VENV) -maxdepth 1 -name '.installed-*' ! -name '.installed-$(MPI)*' -delete
endef

# an environment `make test` set up holds everything `make run` needs: no second install
# (which, run from another directory, would also rewrite the console scripts' paths)
FULL_IS_FRESH := $(shell [ -f $(STAMP) ] && [ $(STAMP) -nt setup.cfg ] && \
                   [ $(STAMP) -nt pyproject.toml ] && echo yes)

$(RUN_STAMP): setup.cfg pyproject.toml
ifneq ($(FULL_IS_FRESH),yes)
	$(venv)
	$(BIN)/python -m pip install -q -e '.$(if $(RUN_EXTRAS),[$(RUN_EXTRAS)])'
endif
	@touch $@

$(STAMP): setup.cfg pyproject.toml
	$(venv)
	$(BIN)/python -m pip install -q -e '.[$(EXTRAS)]' $(TORCH_PIN)
	@touch $@ $(RUN_STAMP)

run: $(RUN_STAMP)
	mpiexec -n $(NP) python -m ringcomp.train $(TRAIN_ARGS)

test: $(STAMP)
	python tests/run_suite.py

bench: $(RUN_STAMP)
	mpiexec -n $(NP) python -m ringcomp.bench $(BENCH_ARGS)

hops: $(STAMP)
	@mkdir -p results
	OPENBLAS_CORETYPE=$(DIGEST_BLAS) mpiexec -n $(NP) python -m ringcomp.experiments hops --out results/hops-p$(NP) $(STUDY_ARGS)

convergence: $(STAMP)
	OPENBLAS_CORETYPE=$(DIGEST_BLAS) mpiexec -n $(CONVERGENCE_NP) python -m ringcomp.experiments convergence --tasks $(TASKS) --out results/convergence-p$(CONVERGENCE_NP) $(STUDY_ARGS)

network: $(STAMP)
	@mkdir -p results
	python -m ringcomp.experiments network --out results/network-p4 $(STUDY_ARGS)

time-to-accuracy: $(STAMP)
	@mkdir -p results
	OPENBLAS_CORETYPE=$(DIGEST_BLAS) python -m ringcomp.experiments time-to-accuracy --out results/tta-p4 $(STUDY_ARGS)

# Horovod's three PyTorch examples, their import lines changed, at 2 ranks on synthetic data
# (HOROVOD: a Horovod checkout; tests/docs/test_horovod_examples.py)
horovod-examples: $(STAMP)
	@test -d "$(HOROVOD)/examples/pytorch" || { \
	  echo "usage: make horovod-examples HOROVOD=<a Horovod checkout>"; exit 2; }
	$(BIN)/python -m pip install -q -e '.[$(EXTRAS),horovod-examples]' $(TORCH_PIN)
	HOROVOD_EXAMPLES=$(abspath $(HOROVOD))/examples/pytorch python -m pytest -q \
	  tests/docs/test_horovod_examples.py

info: $(RUN_STAMP)
	mpiexec -n $(NP) python -m ringcomp.info

lint: $(STAMP)
	ruff check .
	python tests/lint_examples.py

clean:
	rm -rf $(VENV) build *.egg-info
