# Spectra build. Plain C11; no SIMD flags are needed for a correct build
# (SIMD kernels choose themselves at run time). Targets:
#   make            library, CLI and tests in build/
#   make run        set-up + build + generate text from the default model
#   make check      set-up + build + every test, then again under ASan/UBSan
#   make SAN=1      sanitizer build in build-san/
#   make fuzz       libFuzzer targets (clang) in build-fuzz/

CC      ?= cc
SAN     ?= 0
SHARED  ?= $(abspath ../shared)
MODEL   ?= $(SHARED)/models/docllama-58m
PROMPT  ?= The Linux kernel
THREADS ?= 2

ifeq ($(SAN),1)
BUILD   ?= build-san
OPT     ?= -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
LDSAN   := -fsanitize=address,undefined
else
BUILD   ?= build
OPT     ?= -O2 -g
LDSAN   :=
endif

CFLAGS  += -std=c11 $(OPT) -Wall -Wextra -Wshadow -Wno-unused-parameter -Iinclude -Isrc -D_GNU_SOURCE
LDLIBS  += -lcjson -lpcre2-8 -lutf8proc -lmicrohttpd -lz -lm -lpthread -ldl

LIB_SRC  := $(sort $(wildcard src/*/*.c))
CLI_SRC  := $(sort $(wildcard tools/spectra/*.c))
TEST_SRC := $(sort $(wildcard tests/test_*.c))
BENCH_SRC:= $(sort $(wildcard bench/*.c))

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)

# ---- CUDA (optional) ------------------------------------------------------
# nvcc found -> src/cuda/*.cu are built for sm_90a (H100/H200) plus compute_90
# PTX (JIT on other >= sm_90 parts), -DSPX_HAVE_CUDA is set and everything
# links the static CUDA runtime. No nvcc, `make CUDA=0`, or SAN=1 (ASan and
# the CUDA runtime do not mix) -> the CPU-only build, unchanged.
CUDA    ?= 1
ifeq ($(SAN),1)
override CUDA := 0
endif
ifeq ($(origin NVCC),undefined)
NVCC    := $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
endif
ifeq ($(CUDA),0)
NVCC    :=
endif
ifneq ($(strip $(NVCC)),)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
# The targets: sm_90a code and compute_90 PTX (NVCC_SASS: the code alone,
# which `make check` builds, see there)
NVCC_SASS ?= -gencode arch=compute_90a,code=sm_90a
NVCC_ARCH ?= $(NVCC_SASS) -gencode arch=compute_90,code=compute_90
NVCCFLAGS ?= -O3 -std=c++17 $(NVCC_ARCH) \
             -Xcompiler -Wall,-Wno-unused-parameter -Iinclude -Isrc -D_GNU_SOURCE -DSPX_HAVE_CUDA
CU_SRC   := $(sort $(wildcard src/cuda/*.cu))
CU_OBJ   := $(CU_SRC:%.cu=$(BUILD)/%.cu.o)
CU_TEST  := $(BUILD)/tests/cuda/test_cuda $(BUILD)/tests/cuda/test_cuda_batch $(BUILD)/tests/cuda/test_cuda_ssm $(BUILD)/tests/cuda/test_cuda_refine $(BUILD)/tests/cuda/test_cuda_lowbit $(BUILD)/tests/cuda/test_cuda_kvlow $(BUILD)/tests/test_sass_ctrl $(BUILD)/tests/cuda/sass_probe.cubin
CU_BENCH := $(BUILD)/bench/gpu/bench_gemv $(BUILD)/bench/gpu/bench_refine
LIB_OBJ  += $(CU_OBJ)
CFLAGS   += -DSPX_HAVE_CUDA
LDLIBS   += -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
endif
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
BENCH_BIN:= $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)
TEST_COMMON := $(BUILD)/tests/testlib.o

all: $(BUILD)/spectra $(TEST_BIN) $(BENCH_BIN) $(CU_TEST) $(CU_BENCH)

$(BUILD)/libspectra.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/spectra: $(CLI_OBJ) $(BUILD)/libspectra.a
	$(CC) $(LDSAN) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/testlib.o: tests/testlib.c tests/testlib.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -c -o $@ $<

$(BUILD)/tests/%: tests/%.c $(TEST_COMMON) $(BUILD)/libspectra.a tests/testlib.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests $(LDSAN) -o $@ $< $(TEST_COMMON) $(BUILD)/libspectra.a $(LDLIBS)

$(BUILD)/bench/%: bench/%.c $(BUILD)/libspectra.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDSAN) -o $@ $< $(BUILD)/libspectra.a $(LDLIBS)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c -o $@ $<

$(BUILD)/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -MF $(@:.o=.d) -c -o $@ $<

$(BUILD)/tests/cuda/%: tests/cuda/%.cu $(TEST_COMMON) $(BUILD)/libspectra.a tests/testlib.h tests/cuda/cutest.cuh
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -Itests -o $@ $< $(TEST_COMMON) $(BUILD)/libspectra.a $(LDLIBS)

# bench/gpu/sass_ctrl.py's test: a probe kernel's cubin and the script
$(BUILD)/tests/cuda/sass_probe.cubin: tests/cuda/sass_probe.cu
	@mkdir -p $(dir $@)
	$(NVCC) -O3 -gencode arch=compute_90a,code=sm_90a -cubin -o $@ $<

$(BUILD)/tests/test_sass_ctrl: tests/test_sass_ctrl.sh
	@mkdir -p $(dir $@)
	cp $< $@ && chmod +x $@

$(BUILD)/bench/gpu/%: bench/gpu/%.cu $(BUILD)/libspectra.a
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -o $@ $< $(BUILD)/libspectra.a $(LDLIBS)

-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d)

setup:
	@sh scripts/setup.sh

# The main job: compress the default model (once) and generate from it.
TRDC    ?= $(BUILD)/$(notdir $(MODEL)).trdc
run: setup
	@$(MAKE) --no-print-directory $(BUILD)/spectra
	@[ -f "$(TRDC)" ] || $(BUILD)/spectra compress -m "$(MODEL)" -o "$(TRDC)" --threads $(THREADS)
	$(BUILD)/spectra run -m "$(TRDC)" -p "$(PROMPT)" -n 128 --threads $(THREADS)

# Every test in the normal build (including the slow ones), then every test
# again under AddressSanitizer + UBSan (slow ones skipped there by name).
# The builds run CHECK_JOBS compiles at a time (default: the online CPUs).
# The CUDA objects are built as sm_90a code only (NVCC_SASS): the compute_90
# PTX is a second device compile of the same source (no code depends on
# the 90a features), about a third of nvcc's time, and check runs no GPU
# code. A build/ left by `make check` so lacks the PTX a plain `make` puts
# in (`make clean all` restores it); bench/gpu/run.sh's packs build their
# own folder with the defaults.
CHECK_JOBS ?= $(shell getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)
check: setup
	@$(MAKE) --no-print-directory -j$(CHECK_JOBS) NVCC_ARCH='$(NVCC_SASS)' all
	@sh tests/run.sh $(BUILD) "$(SHARED)" full
	@$(MAKE) --no-print-directory -j$(CHECK_JOBS) SAN=1 all
	@sh tests/run.sh build-san "$(SHARED)" quick
	@sh fuzz/run.sh "$(SHARED)"

test: all
	@sh tests/run.sh $(BUILD) "$(SHARED)" full

fuzz:
	@sh fuzz/run.sh "$(SHARED)"

clean:
	rm -rf build build-san build-fuzz

.PHONY: all setup run check test fuzz clean
