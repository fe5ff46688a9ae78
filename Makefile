# tessera — build, run, test, bench.
#
# Cluster users point these at module-provided installs, e.g.
#   make MPI_HOME=$MPICH_DIR HDF5_HOME=$HDF5_DIR BLAS_LIBS="-L$OPENBLAS_DIR/lib -lopenblas"
# MPI_HOME   MPI install prefix (include/, lib/ with libmpi or libmpich); default: pkg-config mpich
# HDF5_HOME  parallel HDF5 prefix; default: pkg-config hdf5-mpich
# YAML_HOME  yaml-cpp prefix; default: pkg-config yaml-cpp
# SENTENCEPIECE_HOME  sentencepiece prefix (the BPE tokenizer); default: pkg-config sentencepiece
# PCRE2_HOME PCRE2 prefix (the pre-tokenizer patterns of byte-level BPE); default: pkg-config libpcre2-8
# JSON_HOME  nlohmann-json prefix (header-only: tokenizer.json); default: pkg-config nlohmann_json
# BLAS_LIBS  link line of a CBLAS library; default: pkg-config openblas
# BLAS_CFLAGS include flags for cblas.h
# CXX, CXXFLAGS, LDFLAGS as usual; ARCH=native adds -march=native (off by default: a binary
# built on a login node must run on the compute nodes).
# PYTHON     interpreter with torch, h5py and numpy (Debian's /usr/bin/python3)
# NP         MPI ranks for `make run`

CXX      ?= g++
PYTHON   ?= /usr/bin/python3
MPIEXEC  ?= mpiexec
NP       ?= 2
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
ifdef SENTENCEPIECE_HOME
SPM_CFLAGS := -I$(SENTENCEPIECE_HOME)/include
SPM_LIBS   := -L$(SENTENCEPIECE_HOME)/lib -Wl,-rpath,$(SENTENCEPIECE_HOME)/lib -lsentencepiece \
              -lsentencepiece_train
else
SPM_CFLAGS := $(shell pkg-config --cflags sentencepiece 2>/dev/null)
SPM_LIBS   := $(shell pkg-config --libs sentencepiece 2>/dev/null || echo -lsentencepiece -lsentencepiece_train)
endif
ifdef PCRE2_HOME
PCRE2_CFLAGS := -I$(PCRE2_HOME)/include
PCRE2_LIBS   := -L$(PCRE2_HOME)/lib -Wl,-rpath,$(PCRE2_HOME)/lib -lpcre2-8
else
PCRE2_CFLAGS := $(shell pkg-config --cflags libpcre2-8 2>/dev/null)
PCRE2_LIBS   := $(shell pkg-config --libs libpcre2-8 2>/dev/null || echo -lpcre2-8)
endif
ifdef JSON_HOME
JSON_CFLAGS := -I$(JSON_HOME)/include
else
JSON_CFLAGS := $(shell pkg-config --cflags nlohmann_json 2>/dev/null)
endif
# The OpenMP build of OpenBLAS: called from inside our OpenMP loops it runs single-threaded
# instead of oversubscribing the cores as the pthread build does.
OPENBLAS_DIR ?= /usr/lib/x86_64-linux-gnu/openblas-openmp
BLAS_CFLAGS  ?= -I/usr/include/x86_64-linux-gnu/openblas-openmp
BLAS_LIBS    ?= -L$(OPENBLAS_DIR) -Wl,-rpath,$(OPENBLAS_DIR) -lopenblas

ARCH_FLAGS := $(if $(filter native,$(ARCH)),-march=native,)
WARN       := -Wall -Wextra -Werror
BASE_FLAGS := -std=c++20 $(OPT) -g $(ARCH_FLAGS) -fopenmp $(WARN) -MMD -MP -Isrc
ALL_CFLAGS := $(BASE_FLAGS) $(MPI_CFLAGS) $(HDF5_CFLAGS) $(YAML_CFLAGS) $(SPM_CFLAGS) $(PCRE2_CFLAGS) \
              $(JSON_CFLAGS) $(BLAS_CFLAGS) $(CXXFLAGS)
ALL_LIBS   := $(HDF5_LIBS) $(YAML_LIBS) $(SPM_LIBS) $(PCRE2_LIBS) $(BLAS_LIBS) $(MPI_LIBS) -lzstd -lz \
              -fopenmp -lm \
              $(LDFLAGS)

# ---- CUDA backend ------------------------------------------------------------------------------
# CUDA=auto builds src/backend/cuda and the CUDA half of src/device into bin/tessera when nvcc is
# found (CUDA_HOME/bin/nvcc or nvcc on PATH) and there is something to build it for: a GPU on
# this machine or a CUDA_ARCH named; CUDA=0 never, CUDA=1 always (an error without nvcc).
# CUDA_ARCH lists the SASS targets ("80;90": sm_80 and sm_90), plus PTX of the last one so newer
# GPUs can JIT it. Unset, it is the compute capabilities of the GPUs nvidia-smi lists here; with
# none, a CUDA build is for CUDA_ARCH_ALL (CUDA=1, `make gpu-bundle`), `make test` compiles the
# CUDA sources for one architecture (TEST_CUDA_ARCH: the check that nvcc builds them without a
# warning) and `make cuda-report` for CUDA_ARCH_ALL, in build-report/. nvcc treats every warning
# as an error, host code included. A machine with nvcc but no GPU (a login node, CI) thus builds
# `make run`'s tessera without nvcc: it trains on the CPU there.
#
# CUDA_EMU=1 (what `make test-cuda-host` builds, in build-emu/, as bin/tessera-emu and
# bin/gpu_tests-emu) is the same CUDA backend compiled by $(CXX) for the CPU: the .cu files as
# C++, their kernels run by the emulator of src/device/emu (one fiber per CUDA thread), the CUDA
# runtime, cuBLAS and NCCL calls answered by it; only the CUDA headers are needed, no GPU, driver
# or CUDA library.
comma     := ,
CUDA      ?= auto
CUDA_EMU  ?= 0
CUDA_HOME ?= /usr/local/cuda
CUDA_ARCH ?=
CUDA_ARCH_ALL  ?= 80;90
TEST_CUDA_ARCH ?= 90
NVCC      ?= $(shell [ -x $(CUDA_HOME)/bin/nvcc ] && echo $(CUDA_HOME)/bin/nvcc || command -v nvcc 2>/dev/null)
# The GPUs here, as compute capabilities ("90", "80;90"); CUDA_ARCH_ALL where nvidia-smi lists
# GPUs but is too old to say their capability; empty without a GPU.
ifneq ($(and $(NVCC),$(filter-out 0,$(CUDA)),$(filter 0,$(CUDA_EMU))),)
GPU_ARCHS := $(shell caps=$$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | \
               grep -E '^[0-9]+\.[0-9]+$$' | tr -d . | sort -u | paste -sd';' -); \
               if [ -n "$$caps" ]; then echo "$$caps"; \
               elif nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then echo '$(CUDA_ARCH_ALL)'; fi)
endif
ifeq ($(CUDA_EMU),1)
  CUDA_ON := 1
else ifeq ($(CUDA),auto)
  CUDA_ON := $(if $(NVCC),$(if $(CUDA_ARCH)$(GPU_ARCHS),1,0),0)
else
  CUDA_ON := $(CUDA)
endif
ifeq ($(CUDA_ON)$(CUDA_EMU),10)
  ifeq ($(NVCC),)
    $(error CUDA=1 but no nvcc in $(CUDA_HOME)/bin or on PATH: set CUDA_HOME)
  endif
endif
ifeq ($(CUDA)$(CUDA_EMU)$(CUDA_ON)$(filter 0 1,$(MAKELEVEL)),auto00$(MAKELEVEL))
  ifneq ($(NVCC),)
    ifneq ($(filter all bin/tessera,$(or $(MAKECMDGOALS),all)),)
      $(info make: nvcc found, but no GPU here and no CUDA_ARCH named: building without the CUDA backend (CUDA_ARCH=90, or "80;90", builds it for GPUs elsewhere))
    endif
  endif
endif
# The architectures this build compiles for; the CUDA build of `make test` (no GPU: one).
CUDA_ARCH_USED := $(or $(CUDA_ARCH),$(GPU_ARCHS),$(CUDA_ARCH_ALL))
TEST_ARCH      := $(if $(filter 0,$(CUDA)),,$(if $(NVCC),$(or $(CUDA_ARCH),$(GPU_ARCHS),$(TEST_CUDA_ARCH))))
CUDA_ARCHS     := $(subst ;, ,$(CUDA_ARCH_USED))
CUDA_GENCODE   := $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
                  -gencode arch=compute_$(lastword $(CUDA_ARCHS)),code=compute_$(lastword $(CUDA_ARCHS))
# CPU-only builds in build-cpu/, CUDA builds in build/: switching between the two (`make run` on a
# machine without a GPU, `make test` with nvcc) recompiles nothing, only relinks (bin/.build).
BUILD ?= $(if $(filter 1,$(CUDA_ON)),build,build-cpu)
CUDA_SRC       := $(sort $(wildcard src/backend/cuda/*.cu))
CUDA_OBJ       := $(CUDA_SRC:%.cu=$(BUILD)/%.o)
# Host files that call the CUDA runtime, NCCL or cuBLAS: compiled only into a CUDA build (the
# rank's GPU state, checked calls and the cuBLAS loader in src/device, the NCCL communicator in
# src/parallel). cuBLAS is not linked: src/device/cublas_loader.cpp loads it on first use.
# src/device/select.cpp (the node-local rank, the backend decision) is in every build; the
# emulator (src/device/emu) only in the emulated one.
CUDA_HOST_SRC  := $(filter-out src/device/select.cpp,$(wildcard src/device/*.cpp)) \
                  src/parallel/nccl_comm.cpp
EMU_SRC        := $(wildcard src/device/emu/*.cpp)
# The CUDA and NCCL headers are system headers (-isystem): a warning a new CUDA or NCCL release
# brings into its own headers does not stop the build; one in our code does, from g++ and nvcc
# alike. NCCL_HOME: an NCCL installed apart from the toolkit (include/, lib/). The nvcc rule gets
# the same include paths and defines as the C++ rule.
NCCL_HOME      ?=
NCCL_CFLAGS    := $(if $(NCCL_HOME),-isystem $(NCCL_HOME)/include)
NCCL_LIBS      := $(if $(NCCL_HOME),-L$(NCCL_HOME)/lib -Wl$(comma)-rpath$(comma)$(NCCL_HOME)/lib)
NVCC_OPT       ?= -O3
NVCC_FLAGS     := -std=c++20 $(NVCC_OPT) -lineinfo $(CUDA_GENCODE) --Werror all-warnings \
                  -Xcompiler -Wall,-Wextra,-Werror \
                  -Xptxas -v -MMD -MP -Isrc $(MPI_CFLAGS) $(HDF5_CFLAGS) $(YAML_CFLAGS) \
                  $(BLAS_CFLAGS)
ifeq ($(CUDA_EMU),1)
  CUDA_CFLAGS  := -DTESSERA_CUDA -DTESSERA_CUDA_EMU -isystem $(CUDA_HOME)/include $(NCCL_CFLAGS)
  CUDA_LIBS    :=
  EXE          := -emu
else ifeq ($(CUDA_ON),1)
  CUDA_CFLAGS  := -DTESSERA_CUDA -isystem $(CUDA_HOME)/include $(NCCL_CFLAGS)
  CUDA_LIBS    := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 $(NCCL_LIBS) -lnccl -lcudart -ldl
  EXE          :=
else
  CUDA_CFLAGS  :=
  CUDA_LIBS    :=
  CUDA_OBJ     :=
  EXE          :=
endif
ALL_CFLAGS += $(CUDA_CFLAGS)
ALL_LIBS   += $(CUDA_LIBS)
# cuFile (GPUDirect Storage): compiled in when a CUDA build finds cufile.h and libcufile
# (CUFILE=auto), never with CUFILE=0. src/io/gds_reader.cpp holds the code it enables.
CUFILE ?= auto
ifeq ($(CUDA_ON)$(CUDA_EMU)$(CUFILE),10auto)
  ifneq ($(wildcard $(CUDA_HOME)/include/cufile.h)$(wildcard /usr/include/cufile.h),)
    ifneq ($(wildcard $(CUDA_HOME)/lib64/libcufile.so*)$(wildcard /usr/lib/x86_64-linux-gnu/libcufile.so*),)
      ALL_CFLAGS += -DTESSERA_CUFILE
      ALL_LIBS   += -lcufile
    endif
  endif
endif

# (the CUDA rules follow bin/unit_tests below)
# ------------------------------------------------------------------------------------------------

SRC      := $(filter-out $(EMU_SRC),$(shell find src -name '*.cpp' ! -name main.cpp | sort))
ifneq ($(CUDA_ON),1)
SRC      := $(filter-out $(CUDA_HOST_SRC),$(SRC))
endif
ifeq ($(CUDA_EMU),1)
SRC      += $(EMU_SRC)
endif
# The emulated build (CUDA_EMU=1 BUILD=build-emu, `make test-cuda-host`) compiles src with the CPU
# build's flags plus the defines TESSERA_CUDA, TESSERA_CUDA_EMU and the CUDA include path, the
# CUDA build (build/) with TESSERA_CUDA (and TESSERA_CUFILE) and that path: a source that tests
# none of them, nor includes a header that does (by its .d file), compiles to the same object in
# all three. `make test` builds the CPU side first (build/ with nvcc, else build-cpu/): the
# emulated build links that build's objects of such sources (about 90 of src's 110) instead of
# compiling them a second time, each only where it is there and up to date (no file its .d
# names is newer); the others, and everything for another BUILD, OPT or CXXFLAGS, it compiles.
HOST_BUILD := $(if $(wildcard build/src/main.o),build,build-cpu)
HOST_SRC   :=
ifeq ($(CUDA_EMU)$(BUILD)$(origin OPT)$(origin CXXFLAGS),1build-emufilefile)
CUDA_TESTED     := $(shell grep -rlE 'TESSERA_CU(DA|FILE)' src)
CUDA_TESTED_HDR := $(filter-out %.cpp %.cu,$(CUDA_TESTED))
HOST_SRC := $(shell for s in $(filter-out $(CUDA_TESTED) $(CUDA_HOST_SRC) $(EMU_SRC),$(SRC)); do \
  o=$(HOST_BUILD)/$${s%.cpp}.o; d=$(HOST_BUILD)/$${s%.cpp}.d; \
  [ -f "$$o" ] && [ -f "$$d" ] || continue; \
  $(if $(CUDA_TESTED_HDR),! grep -qF $(CUDA_TESTED_HDR:%=-e %) "$$d" || continue;) \
  deps=$$(sed -n '1,/[^\\]$$/p' "$$d" | sed 's/^[^:]*://; s/\\$$//'); \
  [ -z "$$(find $$deps -newer "$$o" 2>/dev/null | head -1)" ] && echo "$$s"; done)
endif
OBJ      := $(HOST_SRC:%.cpp=$(HOST_BUILD)/%.o) \
            $(patsubst %.cpp,$(BUILD)/%.o,$(filter-out $(HOST_SRC),$(SRC))) $(CUDA_OBJ)
UNIT_SRC := $(sort $(wildcard tests/unit/*.cpp))
UNIT_OBJ := $(UNIT_SRC:%.cpp=$(BUILD)/%.o)

.PHONY: FORCE cuda-objects all deps deps-run deps-test run test unit integration bench chaos asan clean data cuda-report test-gpu bench-gpu gpu-bundle fuzz fuzz-bins \
        test-cuda-host
all: bin/tessera$(EXE)

$(BUILD)/%.o: %.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/tests/unit/%.o: ALL_CFLAGS += -Wno-error=deprecated-declarations
# The CPU ops' loops vectorize their square roots: no errno to set (IEEE results unchanged).
$(BUILD)/src/backend/cpu/%.o: ALL_CFLAGS += -fno-math-errno

# What bin/ was last linked from (the build folder, CUDA or not, the architectures): a change
# relinks the binaries, as a change of architectures recompiles the CUDA objects. Each stamp is
# rewritten only when its content changes (FORCE runs the comparison every time).
LINK_STAMP := bin/.build$(EXE)
ARCH_STAMP := $(BUILD)/cuda-arch
$(LINK_STAMP): FORCE
	@mkdir -p bin
	@echo "$(BUILD) cuda=$(CUDA_ON) $(if $(filter 1,$(CUDA_ON)),arch=$(CUDA_ARCH_USED))" | cmp -s - $@ || \
	  echo "$(BUILD) cuda=$(CUDA_ON) $(if $(filter 1,$(CUDA_ON)),arch=$(CUDA_ARCH_USED))" >$@
$(ARCH_STAMP): FORCE
	@mkdir -p $(BUILD)
	@echo "$(CUDA_ARCH_USED)" | cmp -s - $@ || echo "$(CUDA_ARCH_USED)" >$@
FORCE:
bin/tessera$(EXE) bin/unit_tests bin/fuzz_replay: $(LINK_STAMP)

bin/tessera$(EXE): $(OBJ) $(BUILD)/src/main.o
	@mkdir -p bin
	$(CXX) $(OPT) -o $@ $(filter-out $(LINK_STAMP),$^) $(ALL_LIBS)

bin/unit_tests: $(OBJ) $(UNIT_OBJ)
	@mkdir -p bin
	$(CXX) $(OPT) -o $@ $(filter-out $(LINK_STAMP),$^) -lgtest -lgtest_main -pthread $(ALL_LIBS)

-include $(OBJ:.o=.d) $(UNIT_OBJ:.o=.d) $(BUILD)/src/main.d

# ---- CUDA rules (see the CUDA backend variables above) ------------------------------------------
ifeq ($(CUDA_EMU),1)
# The kernels as C++ for the emulator: `#pragma unroll` is nvcc's, a hint g++ does not know.
$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(CXX) $(ALL_CFLAGS) -Wno-unknown-pragmas -x c++ -c $< -o $@
else
# ptxas -v prints each kernel's registers, shared memory and spills; the rule keeps that in a
# .ptxas file beside the object, which `make cuda-report` tabulates.
$(CUDA_OBJ): $(ARCH_STAMP)
$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) $(CUDA_CFLAGS) -c $< -o $@ 2>$(@:.o=.ptxas) || { cat $(@:.o=.ptxas); exit 1; }
	@grep -v '^ptxas info\|^    [0-9]* bytes stack frame' $(@:.o=.ptxas) >&2 || true
endif

# Every kernel's registers, shared memory and spills for each architecture of CUDA_ARCH_ALL (or
# the CUDA_ARCH named), compiled in build-report/ so the build's own objects (one architecture
# where there is no GPU) stay as they are; fails when a kernel spills. Writes build/cuda-report.txt.
REPORT_ARCH := $(or $(CUDA_ARCH),$(CUDA_ARCH_ALL))
cuda-report:
	@if [ -z "$(NVCC)" ]; then echo "cuda-report: no nvcc (CUDA_HOME=$(CUDA_HOME)): nothing to compile"; exit 1; fi
	$(MAKE) -j$(JOBS) CUDA=1 CUDA_ARCH="$(REPORT_ARCH)" BUILD=build-report cuda-objects
	@mkdir -p build
	$(PYTHON) tests/gpu/cuda_report.py --out build/cuda-report.txt $(CUDA_SRC:%.cu=build-report/%.ptxas)
cuda-objects: $(CUDA_OBJ)

GPU_TEST_SRC := $(sort $(wildcard tests/gpu/*.cpp))
GPU_TEST_OBJ := $(GPU_TEST_SRC:%.cpp=$(BUILD)/%.o)
$(BUILD)/tests/gpu/%.o: ALL_CFLAGS += -Wno-error=deprecated-declarations
bin/gpu_tests$(EXE): $(OBJ) $(CUDA_OBJ) $(GPU_TEST_OBJ) $(LINK_STAMP)
	@mkdir -p bin
	$(CXX) $(OPT) -o $@ $(filter-out $(LINK_STAMP),$^) -lgtest -pthread $(ALL_LIBS)

# Not part of `make test`: a machine without a GPU prints "no GPU: skipped" and succeeds.
# tests/gpu/test_trainer.sh runs `tessera train` on cuda against the CPU (skipped without a GPU).
test-gpu:
	@if [ -z "$(TEST_ARCH)" ]; then echo "test-gpu: no CUDA build (no nvcc, or CUDA=0): skipped"; exit 0; fi
	$(MAKE) -j$(JOBS) CUDA_ARCH="$(TEST_ARCH)" bin/gpu_tests bin/tessera
	bin/gpu_tests
	PYTHON=$(PYTHON) MPIEXEC=$(MPIEXEC) bash tests/gpu/test_trainer.sh
	PYTHON=$(PYTHON) MPIEXEC=$(MPIEXEC) bash tests/gpu/test_device_choice.sh
	@gpus=$$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true); \
	if [ "$${gpus:-0}" -ge 2 ]; then \
	  echo "test-gpu: tensor and data parallel over NCCL on 2 GPUs"; \
	  $(MPIEXEC) -n 2 bin/gpu_tests --gtest_filter='CudaModelTp.*:CudaModelDp.*'; \
	else echo "test-gpu: fewer than 2 GPUs: the tensor/data-parallel (NCCL) tests are skipped"; fi

# tessera's training step and PyTorch's on the same shapes and GPU, one table: build/bench/gpu.md.
bench-gpu:
	@if [ "$(CUDA_ON)" != 1 ]; then echo "bench-gpu: no CUDA build (no GPU here, or no nvcc): skipped"; exit 0; fi
	$(MAKE) -j$(JOBS) bin/gpu_tests
	@mkdir -p build/bench
	bin/gpu_tests --bench | tee build/bench/gpu-tessera.txt
	@if grep -q 'no GPU' build/bench/gpu-tessera.txt; then exit 0; fi; \
	peak=$$(grep -o 'bf16 dense peak [0-9.]*' build/bench/gpu-tessera.txt | awk '{print $$4}'); \
	$(PYTHON) tools/bench/gpu_torch.py --peak-tflops $$peak | tee build/bench/gpu-torch.txt; \
	{ grep '^|' build/bench/gpu-tessera.txt; grep '^| ' build/bench/gpu-torch.txt | grep -v '^| shape'; } \
	  >build/bench/gpu.md; echo "bench-gpu: wrote build/bench/gpu.md"

# One tarball that runs the GPU checks and bench on a node without our build packages
# (tools/gpu/bundle.sh says what it holds; its run.sh --cpu-smoke is tested by make test).
gpu-bundle:
	@if [ -z "$(NVCC)" ] || [ "$(CUDA)" = 0 ] || [ "$(CUDA_EMU)" = 1 ]; then echo "gpu-bundle: needs a CUDA build (nvcc)"; exit 1; fi
	$(MAKE) -j$(JOBS) CUDA=1 CUDA_ARCH="$(CUDA_ARCH_USED)" bin/tessera bin/gpu_tests
	PYTHON=$(PYTHON) bash tools/gpu/bundle.sh build/tessera-gpu.tar.xz

# The CUDA backend executed without a GPU (part of `make test`): tests/gpu on the emulator, under
# two thread and block orders, and the trainer on device.backend=cuda against the CPU.
test-cuda-host: deps
	@if [ ! -f $(CUDA_HOME)/include/cuda_runtime_api.h ] || [ ! -f $(CUDA_HOME)/include/nccl.h ]; then \
	  echo "test-cuda-host: no CUDA headers (cuda_runtime_api.h, nccl.h) in $(CUDA_HOME)/include: skipped"; \
	  exit 0; fi; \
	$(MAKE) -j$(JOBS) CUDA_EMU=1 BUILD=build-emu bin/tessera-emu bin/gpu_tests-emu && \
	PYTHON=$(PYTHON) MPIEXEC=$(MPIEXEC) bash tests/gpu/run_emulated.sh
-include $(CUDA_OBJ:.o=.d) $(GPU_TEST_OBJ:.o=.d)
# ------------------------------------------------------------------------------------------------

# Debian packages, installed only where missing (apt-get; as root, or with sudo). `make run` needs
# DEB_RUN_PKGS: the build (compiler, MPI, parallel HDF5, yaml-cpp, sentencepiece, PCRE2,
# nlohmann-json, OpenBLAS, zlib and zstd for `tessera data prepare`'s compressed inputs)
# and the Python of data preparation and the plot. `make test` (and bench, asan, fuzz) adds
# DEB_TEST_PKGS: GoogleTest, PyTorch (the parity references), h5dump, PyYAML, Slurm (the job
# script tests), shellcheck, the zstd tool (data preparation's test and bench), npm; and the npm
# packages of NPM_TEST_PKGS (independent reference implementations, under build/npm).
DEB_RUN_PKGS  := g++ make pkg-config mpich libmpich-dev libhdf5-mpich-dev libyaml-cpp-dev \
                 libsentencepiece-dev python3-sentencepiece libpcre2-dev nlohmann-json3-dev \
                 libopenblas-dev libopenblas-openmp-dev libzstd-dev zlib1g-dev python3 python3-h5py python3-numpy \
                 python3-yaml python3-matplotlib
DEB_TEST_PKGS := libgtest-dev hdf5-tools python3-torch munge slurmctld slurmd slurm-client shellcheck zstd
NPM_TEST_PKGS := js-tiktoken@1.0.21
DEB_PKGS      := $(DEB_RUN_PKGS) $(DEB_TEST_PKGS)
define install_debs
	@missing=$$(for p in $(1); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "deps: installing $$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	else echo "deps: the $(2) packages are present"; fi
endef
deps-run:
	$(call install_debs,$(DEB_RUN_PKGS),run)
# npm comes with Debian's nodejs package where no other Node.js is installed.
deps-test: deps-run
	$(call install_debs,$(DEB_TEST_PKGS) $(if $(shell command -v npm 2>/dev/null),,npm),test)
	@if [ ! -f build/npm/node_modules/js-tiktoken/package.json ]; then \
	  mkdir -p build/npm && npm install --prefix build/npm --no-audit --no-fund --silent $(NPM_TEST_PKGS) && \
	  echo "deps: npm installed $(NPM_TEST_PKGS) in build/npm"; fi
deps: deps-test

# The embedded default corpus: the Python standard library's own .py files, present on every
# machine that has the project's dependencies. Nothing is downloaded. data/default: byte-level
# tokens (the small example decks); data/python-bpe: a 4096-piece sentencepiece BPE trained on it
# (input/default.yaml, `make run`).
DATA_DIR := data/default
BPE_DIR  := data/python-bpe
$(DATA_DIR)/train.h5: tools/data/prepare_data.py
	$(PYTHON) tools/data/prepare_data.py --stdlib --out-dir $(DATA_DIR)
$(BPE_DIR)/train.h5: tools/data/prepare_data.py
	$(PYTHON) tools/data/prepare_data.py --stdlib --out-dir $(BPE_DIR) --tokenizer bpe --vocab-size 4096
data: deps-run $(DATA_DIR)/train.h5 $(BPE_DIR)/train.h5

run: deps-run
	$(MAKE) -j$(JOBS) bin/tessera
	$(MAKE) $(BPE_DIR)/train.h5
	OMP_NUM_THREADS=$(RUN_THREADS) MPIR_CVAR_POLLS_BEFORE_YIELD=$(RUN_YIELD) \
	  $(MPIEXEC) -n $(NP) bin/tessera train input/default.yaml
	bin/tessera sample runs/default/checkpoints --prompt "def " --tokens 200 --temperature 0.8
	$(PYTHON) tools/runs/plot_run.py runs/default --out runs/default/metrics.png
	@echo "run: the run's curves are in runs/default/metrics.png"

test: deps
	$(PYTHON) tests/layering/check.py src
	$(MAKE) -j$(JOBS) CUDA_ARCH="$(TEST_ARCH)" bin/tessera bin/unit_tests bin/fuzz_replay \
	  $(if $(TEST_ARCH),bin/gpu_tests)
	bin/unit_tests
	bin/fuzz_replay $(sort $(wildcard tests/fuzz/corpus/*))
	PYTHON=$(PYTHON) MPIEXEC=$(MPIEXEC) bash tests/run_integration.sh
	$(MAKE) test-cuda-host

# ---- fuzzing (tests/fuzz/README.md) -------------------------------------------------------------
# `make test` replays the kept corpus through the targets built with $(CXX) (bin/fuzz_replay);
# `make fuzz` builds each target with clang's libFuzzer and ASan (build-fuzz/, CUDA off) and runs
# it FUZZ_TIME seconds from the kept corpus (tests/fuzz/run.sh); what it finds goes to
# build-fuzz/findings/, and into the kept corpus once fixed.
# A damaged HDF5 file can make libhdf5 itself ask malloc for terabytes: as without ASan, the
# allocation fails (allocator_may_return_null) and HDF5 reports an error, which must reach us as
# a UserError; an allocation of tessera's own that large still ends as an uncaught bad_alloc.
FUZZ_TARGETS := deck machine checkpoint token_hdf5 token_llmc token_megatron token_raw tokenizer_json
FUZZ_TIME    ?= 60
FUZZ_CXX     ?= clang++-14
bin/fuzz_replay: $(OBJ) $(BUILD)/tests/fuzz/targets.o $(BUILD)/tests/fuzz/replay.o
	@mkdir -p bin
	$(CXX) $(OPT) -o $@ $(filter-out $(LINK_STAMP),$^) $(ALL_LIBS)

bin/fuzz_%: $(OBJ) $(BUILD)/tests/fuzz/targets.o tests/fuzz/libfuzzer_main.cpp
	@mkdir -p bin
	$(CXX) $(ALL_CFLAGS) -fsanitize=address,fuzzer -DTESSERA_FUZZ_TARGET=$* -o $@ \
	  tests/fuzz/libfuzzer_main.cpp $(OBJ) $(BUILD)/tests/fuzz/targets.o $(ALL_LIBS)

fuzz-bins: $(foreach t,$(FUZZ_TARGETS),bin/fuzz_$(t))

fuzz: deps
	$(MAKE) -j$(JOBS) CXX=$(FUZZ_CXX) CUDA=0 BUILD=build-fuzz WARN="-Wall -Wextra -Wno-pass-failed" \
	  OPT="-O1 -g -fsanitize=address,fuzzer-no-link -fno-omit-frame-pointer" fuzz-bins
	@for t in $(FUZZ_TARGETS); do bash tests/fuzz/run.sh $$t $(FUZZ_TIME) || exit 1; done

# The long chaos soak (docs/checkpoints.md, "Chaos soak"): CHAOS_FAULTS seeded faults on 4 ranks (root: it
# mounts a small tmpfs for the disk-full faults), one rank's write errors among them (the test shim).
CHAOS_FAULTS ?= 24
CHAOS_SEED   ?= 27
chaos: deps
	$(MAKE) -j$(JOBS) bin/tessera
	$(MAKE) $(DATA_DIR)/train.h5
	rm -rf build/chaos && mkdir -p build/chaos
	$(CC) -O1 -Wall -Wextra -Werror -shared -fPIC -o build/chaos/shim.so tests/integration/write_fail_shim.c -ldl
	OMP_NUM_THREADS=1 MPIR_CVAR_POLLS_BEFORE_YIELD=1 $(PYTHON) tools/runs/chaos.py --tessera bin/tessera \
	  --mpiexec $(MPIEXEC) --data $(DATA_DIR) --work build/chaos/soak --faults $(CHAOS_FAULTS) \
	  --seed $(CHAOS_SEED) --shim build/chaos/shim.so

bench: deps
	$(MAKE) -j$(JOBS) bin/tessera
	$(MAKE) $(DATA_DIR)/train.h5
	PYTHON=$(PYTHON) bash tools/bench/all.sh

SANITIZE := OPT="-O1 -fsanitize=address,undefined -fno-omit-frame-pointer"
ASAN_ENV := ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0 LSAN_OPTIONS=suppressions=tests/lsan.supp \
            UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
# The unit tests, then the emulated CUDA op suite once (random order), under ASan and UBSan.
asan: deps
	$(MAKE) -j$(JOBS) BUILD=build-asan CUDA=0 $(SANITIZE) bin/unit_tests
	mv bin/unit_tests bin/unit_tests_asan
	$(ASAN_ENV) bin/unit_tests_asan
	@if [ -f $(CUDA_HOME)/include/cuda_runtime_api.h ] && [ -f $(CUDA_HOME)/include/nccl.h ]; then \
	  $(MAKE) -j$(JOBS) BUILD=build-emu-asan CUDA_EMU=1 $(SANITIZE) bin/gpu_tests-emu && \
	  mv bin/gpu_tests-emu bin/gpu_tests-emu-asan && \
	  $(ASAN_ENV) TESSERA_EMU_ORDER=random:1 bin/gpu_tests-emu-asan; \
	else echo "asan: no CUDA headers in $(CUDA_HOME)/include: the emulated CUDA suite is skipped"; fi

clean:
	rm -rf build build-cpu build-report build-asan build-emu build-emu-asan bin
