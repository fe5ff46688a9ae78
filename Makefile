# tessera — build, run, test, bench.
#
# Cluster users point these at module-provided installs, e.g.
#   make MPI_HOME=$MPICH_DIR HDF5_HOME=$HDF5_DIR BLAS_LIBS="-L$OPENBLAS_DIR/lib -lopenblas"
# MPI_HOME   MPI install prefix (include/, lib/ with libmpi or libmpich); default: pkg-config mpich
# HDF5_HOME  parallel HDF5 prefix; default: pkg-config hdf5-mpich
# YAML_HOME  yaml-cpp prefix; default: pkg-config yaml-cpp
# BLAS_LIBS  link line of a CBLAS library; default: pkg-config openblas
# BLAS_CFLAGS include flags for cblas.h
# CXX, CXXFLAGS, LDFLAGS as usual; ARCH=native adds -march=native (off by default: a binary
# built on a login node must run on the compute nodes).
# PYTHON     interpreter with torch, h5py and numpy (Debian's /usr/bin/python3)
# NP         MPI ranks for `make run`

CXX      ?= g++
PYTHON   ?= /usr/bin/python3
MPIEXEC  ?= mpiexec
NP       ?= 4
JOBS     ?= $(shell nproc 2>/dev/null || echo 2)
# `make run` puts NP ranks on this machine: one thread each, and MPICH yields the core while it
# polls (set RUN_YIELD=0 when every rank has a core of its own).
RUN_THREADS ?= 1
RUN_YIELD   ?= 1
ARCH     ?=
OPT      ?= -O3
CXXFLAGS ?=
LDFLAGS  ?=

ifeq ($(origin CXX),default)
CXX := g++
endif

ifdef MPI_HOME
MPI_CFLAGS := -I$(MPI_HOME)/include
MPI_LIBS   := -L$(MPI_HOME)/lib -Wl,-rpath,$(MPI_HOME)/lib -lmpi
else
MPI_CFLAGS := $(shell pkg-config --cflags mpich 2>/dev/null)
MPI_LIBS   := $(shell pkg-config --libs mpich 2>/dev/null)
endif
ifdef HDF5_HOME
HDF5_CFLAGS := -I$(HDF5_HOME)/include
HDF5_LIBS   := -L$(HDF5_HOME)/lib -Wl,-rpath,$(HDF5_HOME)/lib -lhdf5
else
HDF5_CFLAGS := $(shell pkg-config --cflags hdf5-mpich 2>/dev/null)
HDF5_LIBS   := $(shell pkg-config --libs-only-L hdf5-mpich 2>/dev/null) -lhdf5
endif
ifdef YAML_HOME
YAML_CFLAGS := -I$(YAML_HOME)/include
YAML_LIBS   := -L$(YAML_HOME)/lib -Wl,-rpath,$(YAML_HOME)/lib -lyaml-cpp
else
YAML_CFLAGS := $(shell pkg-config --cflags yaml-cpp 2>/dev/null)
YAML_LIBS   := $(shell pkg-config --libs yaml-cpp 2>/dev/null)
endif
# The OpenMP build of OpenBLAS: called from inside our OpenMP loops it runs single-threaded
# instead of oversubscribing the cores as the pthread build does.
OPENBLAS_DIR ?= /usr/lib/x86_64-linux-gnu/openblas-openmp
BLAS_CFLAGS  ?= -I/usr/include/x86_64-linux-gnu/openblas-openmp
BLAS_LIBS    ?= -L$(OPENBLAS_DIR) -Wl,-rpath,$(OPENBLAS_DIR) -lopenblas

ARCH_FLAGS := $(if $(filter native,$(ARCH)),-march=native,)
WARN       := -Wall -Wextra -Werror
BASE_FLAGS := -std=c++20 $(OPT) -g $(ARCH_FLAGS) -fopenmp $(WARN) -MMD -MP -Isrc
ALL_CFLAGS := $(BASE_FLAGS) $(MPI_CFLAGS) $(HDF5_CFLAGS) $(YAML_CFLAGS) $(BLAS_CFLAGS) $(CXXFLAGS)
ALL_LIBS   := $(HDF5_LIBS) $(YAML_LIBS) $(BLAS_LIBS) $(MPI_LIBS) -fopenmp -lm $(LDFLAGS)

BUILD ?= build
SRC      := $(shell find src -name '*.cpp' ! -name main.cpp | sort)
OBJ      := $(SRC:%.cpp=$(BUILD)/%.o)
UNIT_SRC := $(sort $(wildcard tests/unit/*.cpp))
UNIT_OBJ := $(UNIT_SRC:%.cpp=$(BUILD)/%.o)

.PHONY: all deps run test unit integration bench asan clean data
all: bin/tessera

$(BUILD)/%.o: %.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/tests/unit/%.o: ALL_CFLAGS += -Wno-error=deprecated-declarations

bin/tessera: $(OBJ) $(BUILD)/src/main.o
	@mkdir -p bin
	$(CXX) $(OPT) -o $@ $^ $(ALL_LIBS)

bin/unit_tests: $(OBJ) $(UNIT_OBJ)
	@mkdir -p bin
	$(CXX) $(OPT) -o $@ $^ -lgtest -lgtest_main -pthread $(ALL_LIBS)

-include $(OBJ:.o=.d) $(UNIT_OBJ:.o=.d) $(BUILD)/src/main.d

# Debian packages tessera builds and tests with. Idempotent: installs only what is missing.
DEB_PKGS := g++ make pkg-config mpich libmpich-dev libhdf5-mpich-dev hdf5-tools libyaml-cpp-dev \
            libopenblas-dev libopenblas-openmp-dev libgtest-dev python3 python3-torch python3-h5py python3-numpy python3-yaml \
            munge slurmctld slurmd slurm-client shellcheck
deps:
	@missing=$$(for p in $(DEB_PKGS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "deps: installing $$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	else echo "deps: all Debian packages present"; fi

# The embedded default corpus: the Python standard library's own .py files, present on every
# machine that has the project's dependencies. Nothing is downloaded.
DATA_DIR := data/default
$(DATA_DIR)/train.h5: tools/prepare_data.py
	$(PYTHON) tools/prepare_data.py --stdlib --out-dir $(DATA_DIR)
data: deps $(DATA_DIR)/train.h5

run: deps
	$(MAKE) -j$(JOBS) bin/tessera
	$(MAKE) $(DATA_DIR)/train.h5
	OMP_NUM_THREADS=$(RUN_THREADS) MPIR_CVAR_POLLS_BEFORE_YIELD=$(RUN_YIELD) \
	  $(MPIEXEC) -n $(NP) bin/tessera train input/default.yaml
	bin/tessera sample runs/default/checkpoints --prompt "def " --tokens 400 --temperature 0.8

test: deps
	$(MAKE) -j$(JOBS) bin/tessera bin/unit_tests
	bin/unit_tests
	PYTHON=$(PYTHON) MPIEXEC=$(MPIEXEC) bash tests/run_integration.sh

bench: deps
	$(MAKE) -j$(JOBS) bin/tessera
	$(MAKE) $(DATA_DIR)/train.h5
	PYTHON=$(PYTHON) bash tools/bench.sh

asan: deps
	$(MAKE) BUILD=build-asan OPT="-O1 -fsanitize=address,undefined -fno-omit-frame-pointer" bin/unit_tests
	mv bin/unit_tests bin/unit_tests_asan
	ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0 LSAN_OPTIONS=suppressions=tests/lsan.supp \
	  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 bin/unit_tests_asan

clean:
	rm -rf build build-asan bin
