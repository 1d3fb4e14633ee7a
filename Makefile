# attnlab — build, test, bench, demo, install.
#
#   make            lib/libattnlab.so (the core, no CUDA dependency) and, when nvcc is found,
#                   lib/libattnlab_cuda.so (the CUDA plugin: sm_90a + sm_80)
#   make test       installs what is missing (test-deps), then C unit tests + busted specs under LuaJIT; ends
#                   with "N passed, N failed[, N skipped]"
#   make tests      builds the C unit tests only (build/tests/; e.g. to carry to the GPU machine)
#   make bench      every bench/*.lua (CPU, and GPU where one is usable); on a GPU, the chart report
#                   build/bench/report/index.md (scripts/bench_report.lua, with the peer's curves if measured)
#   make demo       installs what is missing (make deps), builds, runs examples/demo.lua
#   make install    PREFIX=/usr/local DESTDIR= : library, header, Lua modules, launcher, pkg-config
#   make deps       apt-get installs luajit, libluajit-5.1-dev, lua-busted, lua-check, libopenblas-dev if missing
#   make clean
#
# O=/some/dir puts build/ and lib/ under that folder (parallel builds of one checkout never race).

O        ?= .
BUILD    := $(O)/build
LIBDIR   := $(O)/lib
PREFIX   ?= /usr/local
DESTDIR  ?=

CC       ?= cc
CFLAGS   ?= -O2 -g
# -ffp-contract=off: host float code must not fuse a*b+c, so CPU results are reproducible and the
# bit-exact conversions/RNG agree with the GPU's.
AL_CFLAGS := -std=gnu11 -fPIC -fopenmp -ffp-contract=off -Wall -Wextra -Wno-unused-parameter \
             -Iinclude -Isrc $(CFLAGS)
AL_LDLIBS := -lopenblas -lm -lpthread -ldl -fopenmp

# EXCLUDE= leaves sources out (e.g. while a file is being written).
CORE_SRC := $(filter-out $(EXCLUDE),$(wildcard src/*.c src/cpu/*.c))
CORE_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(CORE_SRC))
CORE_LIB := $(LIBDIR)/libattnlab.so

NVCC     ?= $(shell command -v nvcc 2>/dev/null || (test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc))
CUDA_HOME ?= $(if $(NVCC),$(patsubst %/bin/nvcc,%,$(NVCC)),/usr/local/cuda)
CUDA_SRC := $(wildcard src/cuda/*.cu)
CUDA_OBJ := $(patsubst %.cu,$(BUILD)/%.o,$(CUDA_SRC))
CUDA_LIB := $(LIBDIR)/libattnlab_cuda.so
NVCC_FLAGS ?= -O3 -std=c++17 -Xcompiler -fPIC -Xcompiler -ffp-contract=off \
              -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_80,code=sm_80 \
              -Iinclude -Isrc -Wno-deprecated-gpu-targets -DAL_KERNEL_SRC_DIR=\"$(CURDIR)/kernels\"
CUDA_LDLIBS := -L$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudnn -lcudart -lnvrtc -lcuda

C_TESTS  := $(patsubst tests/c/%.c,$(BUILD)/tests/%,$(wildcard tests/c/test_*.c))

LUAJIT   ?= luajit
BUSTED   ?= $(LUAJIT) /usr/bin/busted --ignore-lua
LUA_ENV  := ATTNLAB_LIBDIR=$(abspath $(LIBDIR)) LUA_PATH="$(CURDIR)/lua/?.lua;$(CURDIR)/lua/?/init.lua;$${LUA_PATH:-;}"

ifneq ($(NVCC),)
  ifneq ($(CUDA_SRC),)
    ALL_LIBS := $(CORE_LIB) $(CUDA_LIB)
    CUDA_NOTE := built lib/libattnlab_cuda.so with $(NVCC) (sm_90a + sm_80)
  else
    ALL_LIBS := $(CORE_LIB)
    CUDA_NOTE := skipped the CUDA plugin: no src/cuda/*.cu sources
  endif
else
  ALL_LIBS := $(CORE_LIB)
  CUDA_NOTE := skipped the CUDA plugin: nvcc not found (set NVCC=/path/to/nvcc); CPU only
endif

.PHONY: all test test-run test-deps test-c test-lua bench demo install deps clean
.DEFAULT_GOAL := all

all: $(ALL_LIBS)
	@echo "attnlab: built $(CORE_LIB) (core, no CUDA dependency)"
	@echo "attnlab: $(CUDA_NOTE)"

$(BUILD)/%.o: %.c $(wildcard include/*.h src/*.h src/numeric/*.h src/cpu/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(AL_CFLAGS) -c $< -o $@

# -z nodelete: LuaJIT dlclose()s the library when the state closes while idle OpenMP/OpenBLAS worker
# threads still run its code, an intermittent segfault at exit (seen after busted runs); never unload it.
$(CORE_LIB): $(CORE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) -shared -Wl,-soname,libattnlab.so -Wl,--no-undefined -Wl,-z,nodelete -o $@.tmp $^ $(AL_LDLIBS) && mv -f $@.tmp $@

$(BUILD)/%.o: %.cu $(wildcard include/*.h src/*.h src/numeric/*.h src/cuda/*.h kernels/*.h)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -c $< -o $@

$(CUDA_LIB): $(CUDA_OBJ) $(CORE_LIB)
	@mkdir -p $(dir $@)
	$(NVCC) -shared -o $@.tmp $(CUDA_OBJ) -L$(LIBDIR) -lattnlab $(CUDA_LDLIBS) -Xlinker --no-undefined -Xlinker -rpath='$$ORIGIN' \
		&& mv -f $@.tmp $@

# The Hopper forward's and backward's GPU checks and benches (tests/cuda): `make test` builds them when nvcc is
# found and runs their correctness cases (FLASH_SM90_ONLY=check); without an sm_90 GPU they report themselves
# skipped. `make gpu-checks` builds both; run without FLASH_SM90_ONLY they also time the kernels.
# flash_sm90_check is used by scripts/gpu_sanitize.sh.
GPU_CHECK_DEPS := tests/cuda/flash_check_common.h $(wildcard src/cuda/flash_*.h kernels/flash_params.h)
$(BUILD)/tests/flash_sm90_check: tests/cuda/flash_sm90_check.cu $(GPU_CHECK_DEPS)
	@mkdir -p $(dir $@)
	$(NVCC) -O2 -std=c++17 -Iinclude -Isrc $< -o $@ -lnvrtc
$(BUILD)/tests/flash_sm90_bwd_check: tests/cuda/flash_sm90_bwd_check.cu $(GPU_CHECK_DEPS)
	@mkdir -p $(dir $@)
	$(NVCC) -O2 -std=c++17 -Iinclude -Isrc $< -o $@ -lnvrtc
GPU_CHECKS := $(if $(NVCC),$(BUILD)/tests/flash_sm90_check $(BUILD)/tests/flash_sm90_bwd_check)
.PHONY: gpu-checks
gpu-checks: $(GPU_CHECKS)

# (the C tests include library headers too: the flash specs' tile arithmetic, internal.h, numeric/, cpu/)
$(BUILD)/tests/%: tests/c/%.c $(wildcard tests/c/*.h include/*.h src/*.h src/numeric/*.h src/cpu/*.h src/cuda/*.h) $(CORE_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(AL_CFLAGS) $< -o $@ -L$(LIBDIR) -lattnlab $(AL_LDLIBS) -Wl,-rpath,$(abspath $(LIBDIR))

# Each spec file runs in its own busted process, so a crash loses one file's results, not all.
# ATTNLAB_POISON_GRADS=1: attention.backward's gradient buffers start as NaN (al_attn_backward writes every
# element, padding and gaps included; a backend that misses one fails its spec instead of reading zeros).
# Each suite prints its own "N passed, N failed" line into the log; scripts/tally.sh adds them up and
# prints the grand total as the last line (non-zero exit if anything failed).
# build the C tests without running them (a folder is named tests/, hence .PHONY)
.PHONY: tests
tests: all $(C_TESTS)

# The CUDA snippets lua/attnlab/variants.lua generates for the example variants, which test_nvrtc_kernels
# compiles with NVRTC (no GPU needed), so CI catches generated code that no longer compiles.
$(BUILD)/variant_snippets.txt: all tests/c/variant_snippets.lua lua/attnlab/variants.lua lua/attnlab/variants/*.lua \
		examples/variants.lua
	@mkdir -p $(BUILD)
	@env $(LUA_ENV) luajit tests/c/variant_snippets.lua > $@.tmp && mv -f $@.tmp $@

# make test on a fresh machine installs what it needs first (test-deps), then builds and runs everything.
test: test-deps
	@$(MAKE) --no-print-directory test-run
test-run: all $(C_TESTS) $(GPU_CHECKS) $(BUILD)/variant_snippets.txt
	@mkdir -p $(BUILD)
	@rm -f $(BUILD)/test.log
	@for t in $(C_TESTS); do sh scripts/tally.sh run $(BUILD)/test.log $$t; done; true
	@for t in $(GPU_CHECKS); do FLASH_SM90_ONLY=check sh scripts/tally.sh run $(BUILD)/test.log $$t; done; true
	@for f in tests/spec/*_spec.lua; do echo "== $$f"; \
		sh scripts/tally.sh run $(BUILD)/test.log env ATTNLAB_POISON_GRADS=1 $(LUA_ENV) $(BUSTED) -o tests/spec/summary.lua $$f; done; true
	@sh scripts/tally.sh $(BUILD)/test.log

# The benches append their measurements as JSON lines to BENCH_OUT (rewritten each run); when it holds
# attention measurements (a GPU run), scripts/bench_report.lua charts TFLOP/s against sequence length
# into $(BUILD)/bench/report/ (index.md + SVG/PNG), with the peer's curves from PEER_OUT when that file
# exists (python3 scripts/peer_torch_sdpa.py --out build/bench/peer.jsonl, on the GPU host, beforehand).
BENCH_OUT ?= $(BUILD)/bench/attnlab.jsonl
PEER_OUT  ?= $(BUILD)/bench/peer.jsonl
bench: all
	@mkdir -p $(dir $(BENCH_OUT)) && rm -f $(BENCH_OUT)
	@for b in bench/*.lua; do echo "== $$b"; ATTNLAB_BENCH_OUT=$(abspath $(BENCH_OUT)) $(LUA_ENV) $(LUAJIT) $$b || exit 1; done
	@if grep -q '"attention"' $(BENCH_OUT) 2>/dev/null; then echo "== scripts/bench_report.lua"; \
		$(LUA_ENV) sh scripts/attnlab scripts/bench_report.lua --out $(BUILD)/bench/report $(BENCH_OUT) \
			$$(test -s $(PEER_OUT) && echo $(PEER_OUT)); fi

demo: deps all
	@$(LUA_ENV) $(LUAJIT) examples/demo.lua

# Debian packages the build and tests need; installed only when missing.
# $(call apt_install,VAR,what): apt-get installs the Debian packages listed in $(VAR) that are missing
# (sudo when not root); says so when none is. Used by deps, deps-fuzz and deps-notebook.
apt_install = missing=""; for p in $($(1)); do \
		dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "attnlab: installing$$missing"; \
		SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	else echo "attnlab: $(2) present ($($(1)))"; fi

DEB_PKGS := luajit libluajit-5.1-dev lua-busted lua-check libopenblas-dev
deps:
	@$(call apt_install,DEB_PKGS,dependencies)

# What make test cannot do without, checked by what it provides rather than by package (LuaJIT, busted, the
# CBLAS header while the core library is still to be built), so a host that brings them otherwise (the GPU
# host: .gpu-deps/env.sh, no apt, a core library built elsewhere) is left alone; if one is missing, make deps
# installs the Debian packages. luacheck is optional (lint_spec is pending without it; make deps and CI
# install it).
test-deps:
	@if command -v $(firstword $(LUAJIT)) >/dev/null 2>&1 && $(BUSTED) --version >/dev/null 2>&1 && \
		{ test -f $(CORE_LIB) || echo '#include <cblas.h>' | $(CC) -E -x c - >/dev/null 2>&1; }; then :; \
	else echo "attnlab: LuaJIT, busted or the CBLAS header is missing: make deps"; $(MAKE) --no-print-directory deps || \
		echo "attnlab: make deps failed; going on (what is still missing fails below, by name)"; fi

# ---- reliability: sanitizers and fuzzing (tests/asan/, tests/fuzz/, docs/RELIABILITY.md) -----------
#   make test-asan   the core library and C tests rebuilt with AddressSanitizer + UndefinedBehavior-
#                    Sanitizer (+ LeakSanitizer) in $(BUILD)/asan, then the C tests and the busted specs
#                    (LuaJIT with the ASan runtime preloaded); ends with the same tally line as `make test`.
#                    ASAN_SPECS= picks spec files or folders (default: tests/spec).
#   make fuzz        builds tests/fuzz/fuzz_*.c with clang's libFuzzer (+ ASan/UBSan) in $(BUILD)/fuzz and
#                    runs each for FUZZ_SECONDS (default 60) from tests/fuzz/corpus/<target>/; a crash
#                    leaves crash-* in $(BUILD)/fuzz and fails.
#   make deps-fuzz   apt-get installs clang, libclang-rt-14-dev (libFuzzer) and libomp-14-dev if missing.
#   make test-tsan   the core library and the CPU C tests rebuilt with ThreadSanitizer in $(BUILD)/tsan and
#                    run with OMP_NUM_THREADS=1: tests/c/test_threads.c's pthreads (and every other C test)
#                    checked for data races in the runtime. One OpenMP thread, because GCC's libgomp is not
#                    instrumented: its barriers are invisible to TSan, which then reports every read after
#                    a parallel region as a race (seen: 39-223 false reports per test with 2 threads).
ASAN_O       := $(BUILD)/asan
ASAN_FLAGS   := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
ASAN_RT      := $(shell $(CC) -print-file-name=libasan.so 2>/dev/null)
ASAN_SPECS   ?= tests/spec
# install_spec runs `make install` and luarocks: with the ASan runtime preloaded into every child,
# ASan reports GNU make's own string handling, which is not ours to check; `make test` runs it.
ASAN_SKIP_SPECS ?= tests/spec/install_spec.lua
# one busted process per spec file (as in `make test`): a sanitizer abort loses one file's results
ASAN_SPEC_FILES = $(filter-out $(ASAN_SKIP_SPECS),$(foreach s,$(ASAN_SPECS),$(if $(filter %.lua,$(s)),$(s),$(wildcard $(s)/*_spec.lua))))
# allocator_may_return_null: a huge allocation is an OOM status to test, not a sanitizer abort.
# detect_odr_violation=0: LuaJIT's FFI and the preloaded runtime trip false ODR reports.
ASAN_ENV     := ASAN_OPTIONS=detect_leaks=1:detect_odr_violation=0:allocator_may_return_null=1:strict_string_checks=1:check_initialization_order=1:detect_stack_use_after_return=0 \
                LSAN_OPTIONS=suppressions=$(CURDIR)/tests/asan/lsan.supp:print_suppressions=0 \
                UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 OMP_WAIT_POLICY=passive ATTNLAB_TEST_NVRTC=0
# test_nvrtc_kernels compiles ~150 kernels with NVRTC (an uninstrumented library whose allocations ASan
# intercepts): minutes under the sanitizer for no coverage of attnlab's own memory handling; `make test` runs it.
# ATTNLAB_TEST_NVRTC=0 (ASAN_ENV above): test_flash_variant builds its kernels' sources without compiling them, for
# the same reason, and because LSan's exit-time scan once crashed in CI after those compiles (docs/RELIABILITY.md).
ASAN_SKIP_C  ?= test_nvrtc_kernels
ASAN_C_TESTS := $(filter-out $(addprefix %/,$(ASAN_SKIP_C)),$(patsubst $(BUILD)/%,$(ASAN_O)/build/%,$(C_TESTS)))

TSAN_O       := $(BUILD)/tsan
# the GPU programs (no CUDA plugin in this build) and the NVRTC compile test (minutes, no runtime code)
TSAN_SKIP_C  ?= test_nvrtc_kernels test_flash_variant test_gpu_backends test_cuda_faults
TSAN_C_TESTS := $(filter-out $(addprefix %/,$(TSAN_SKIP_C)),$(patsubst $(BUILD)/%,$(TSAN_O)/build/%,$(C_TESTS)))
TSAN_ENV     := TSAN_OPTIONS=halt_on_error=0:exitcode=66:allocator_may_return_null=1 OMP_NUM_THREADS=1

.PHONY: test-asan asan-build test-tsan tsan-build fuzz fuzz-build deps-fuzz
# Shared by test-asan and test-tsan. sanitizer_build: the core library and C tests rebuilt in folder $(1) with the
# compile and link flags $(2) by target $(3), logged to $(BUILD)/$(4)-build.log; a failed build is one failure
# of test-$(4). sanitizer_c_tests: the C tests $(2) of folder $(1) under the environment $(3), into its tally.
define sanitizer_build
	@mkdir -p $(BUILD)
	@$(MAKE) --no-print-directory O=$(1) NVCC= CFLAGS="-O1 -g $(2)" \
		AL_LDLIBS="$(AL_LDLIBS) $(2)" $(3) >$(BUILD)/$(4)-build.log 2>&1 \
		|| { cat $(BUILD)/$(4)-build.log; echo "test-$(4): 0 passed, 1 failed (sanitizer build failed)"; exit 1; }
	@rm -f $(1)/test.log
endef
define sanitizer_c_tests
	@for t in $(2); do env $(3) sh scripts/tally.sh run $(1)/test.log $$t; done; true
endef
# (internal) what `make test-tsan` builds, in its own O= folder.
tsan-build: all $(filter-out $(addprefix %/,$(TSAN_SKIP_C)),$(C_TESTS))

# A race makes the program exit 66 (TSAN_OPTIONS), which tally.sh counts as a failure of that program.
test-tsan:
	$(call sanitizer_build,$(TSAN_O),-fsanitize=thread,tsan-build,tsan)
	$(call sanitizer_c_tests,$(TSAN_O),$(TSAN_C_TESTS),$(TSAN_ENV))
	@sh scripts/tally.sh $(TSAN_O)/test.log
# (internal) what the sanitizer build of `make test-asan` makes, in its own O= folder.
asan-build: all $(C_TESTS)

test-asan:
	$(call sanitizer_build,$(ASAN_O),$(ASAN_FLAGS),asan-build,asan)
	$(call sanitizer_c_tests,$(ASAN_O),$(ASAN_C_TESTS),$(ASAN_ENV))
	@for f in $(ASAN_SPEC_FILES); do echo "== $$f (asan)"; \
		sh scripts/tally.sh run $(ASAN_O)/test.log env LD_PRELOAD=$(ASAN_RT) $(ASAN_ENV) \
		ATTNLAB_LIBDIR=$(abspath $(ASAN_O)/lib) LUA_PATH="$(CURDIR)/lua/?.lua;$(CURDIR)/lua/?/init.lua;$${LUA_PATH:-;}" \
		$(BUSTED) -o tests/spec/summary.lua $$f; done; true
	@sh scripts/tally.sh $(ASAN_O)/test.log

comma        := ,
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 60
# FUZZ_SEED=N makes a run repeatable (CI uses a fixed seed, so a red CI is a reproducible finding, not
# a lottery); empty = libFuzzer's random seed, for exploring.
FUZZ_SEED    ?=
FUZZ_DIR     := $(BUILD)/fuzz
FUZZ_TARGETS := $(patsubst tests/fuzz/%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_FLAGS   := -g -O1 -std=gnu11 -fopenmp -ffp-contract=off -fsanitize=fuzzer,address,undefined \
                -fno-sanitize-recover=undefined -fno-omit-frame-pointer -Iinclude -Isrc -Itests/fuzz
FUZZ_OBJ     := $(patsubst %.c,$(FUZZ_DIR)/%.o,$(CORE_SRC))

$(FUZZ_DIR)/%.o: %.c $(wildcard include/*.h src/*.h src/numeric/*.h src/cpu/*.h)
	@mkdir -p $(dir $@)
	@$(FUZZ_CC) $(subst fuzzer$(comma),fuzzer-no-link$(comma),$(FUZZ_FLAGS)) -w -c $< -o $@

$(FUZZ_DIR)/%: tests/fuzz/%.c tests/fuzz/fuzz_common.h $(FUZZ_OBJ)
	@mkdir -p $(dir $@)
	@echo "fuzz: linking $@"
	@$(FUZZ_CC) $(FUZZ_FLAGS) $< $(FUZZ_OBJ) -o $@ -lopenblas -lm -lpthread -ldl

.SECONDARY: $(FUZZ_OBJ)
fuzz-build: $(addprefix $(FUZZ_DIR)/,$(FUZZ_TARGETS))

# Each target runs FUZZ_SECONDS over a scratch copy of its seed corpus (new inputs stay in
# $(FUZZ_DIR)/corpus-<target>); the stats line (#execs) goes to $(FUZZ_DIR)/<target>.log.
fuzz: fuzz-build
	@rm -f $(FUZZ_DIR)/fuzz.log; fail=0; \
	for t in $(FUZZ_TARGETS); do \
		mkdir -p $(FUZZ_DIR)/corpus-$$t; cp -f tests/fuzz/corpus/$$t/* $(FUZZ_DIR)/corpus-$$t/ 2>/dev/null; \
		echo "fuzz: $$t for $(FUZZ_SECONDS) s"; \
		if ( cd $(FUZZ_DIR) && env $(ASAN_ENV) OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 ./$$t -max_total_time=$(FUZZ_SECONDS) $(if $(FUZZ_SEED),-seed=$(FUZZ_SEED)) -timeout=10 -rss_limit_mb=2048 \
				-print_final_stats=1 corpus-$$t >$$t.log 2>&1 ); then \
			echo "fuzz $$t: 1 passed, 0 failed ($$(grep -o 'stat::number_of_executed_units: *[0-9]*' $(FUZZ_DIR)/$$t.log | grep -o '[0-9]*$$') executions)" \
				| tee -a $(FUZZ_DIR)/fuzz.log; \
		else tail -40 $(FUZZ_DIR)/$$t.log; echo "fuzz $$t: 0 passed, 1 failed (see $(FUZZ_DIR)/$$t.log)" | tee -a $(FUZZ_DIR)/fuzz.log; fail=1; fi; \
	done; sh scripts/tally.sh $(FUZZ_DIR)/fuzz.log

FUZZ_DEB_PKGS := clang libclang-rt-14-dev libomp-14-dev
deps-fuzz:
	@$(call apt_install,FUZZ_DEB_PKGS,fuzzing dependencies)
# ---- end of the reliability block ---------------------------------------------------------------

# ---- workbench: docs, notebooks (docs/, notebooks/, scripts/gen_api_docs.lua) ---------------------
#   make docs             regenerates docs/REFERENCE.md from include/attnlab.h and the Lua modules
#                         (tests/spec/api_docs_spec.lua fails with "run make docs" when it is stale)
#   make deps-notebook    apt-get installs Debian's Jupyter (python3-ipykernel, jupyter-nbconvert,
#                         python3-nbclient, jupyter-client, jupyter-core) if missing; not part of `deps`
#   make notebook-kernel  installs the `attnlab` kernel spec for this checkout (--user; NB_PREFIX=--sys-prefix
#                         or --prefix=DIR instead), pointing at this tree and $(LIBDIR)
#   make notebook         starts Jupyter (notebook or lab, whichever is installed) on notebooks/ with the kernel
NB_DEB_PKGS := python3-ipykernel jupyter-nbconvert python3-nbclient jupyter-client jupyter-core
NB_PREFIX   ?= --user
NB_SPEC_DIR := $(BUILD)/jupyter
.PHONY: docs deps-notebook notebook-kernel notebook
docs: all
	@$(LUA_ENV) $(LUAJIT) scripts/gen_api_docs.lua docs/REFERENCE.md

deps-notebook:
	@$(call apt_install,NB_DEB_PKGS,notebook dependencies)

notebook-kernel: all
	@command -v jupyter >/dev/null 2>&1 || { echo "attnlab: jupyter is not installed: run make deps-notebook"; exit 1; }
	@sh notebooks/kernel/make_spec.sh $(NB_SPEC_DIR) $(CURDIR) $(abspath $(LIBDIR)) >/dev/null
	jupyter kernelspec install $(NB_PREFIX) --replace --name attnlab $(NB_SPEC_DIR)/kernels/attnlab

notebook: all
	@command -v jupyter >/dev/null 2>&1 || { echo "attnlab: jupyter is not installed: run make deps-notebook"; exit 1; }
	@sh notebooks/kernel/make_spec.sh $(NB_SPEC_DIR) $(CURDIR) $(abspath $(LIBDIR)) >/dev/null
	@if jupyter lab --version >/dev/null 2>&1; then app=lab; elif jupyter notebook --version >/dev/null 2>&1; then app=notebook; \
	else echo "attnlab: neither jupyter lab nor jupyter notebook is installed (apt-get install jupyter-notebook);" \
		"the kernel works with any front end: JUPYTER_PATH=$(NB_SPEC_DIR)"; exit 1; fi; \
	JUPYTER_PATH=$(abspath $(NB_SPEC_DIR)) jupyter $$app --notebook-dir=notebooks
# ---- end of the workbench block -------------------------------------------------------------------

# The header is also installed beside the Lua modules (attnlab/attnlab.h) and config.lua records the
# install paths; lua/attnlab/ffi.lua and the launcher fall back to paths relative to themselves, so a
# prefix that is moved, or a luarocks tree (which moves lib/ and the Lua modules out of the rock's
# folder), works without ATTNLAB_* variables. tests/spec/install_spec.lua checks both.
LUADIR := $(PREFIX)/share/lua/5.1
install: all
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(LUADIR)/attnlab/variants $(DESTDIR)$(LUADIR)/attnlab/cp \
		$(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 755 $(ALL_LIBS) $(DESTDIR)$(PREFIX)/lib/
	install -m 644 include/attnlab.h $(DESTDIR)$(PREFIX)/include/
	install -d $(DESTDIR)$(PREFIX)/share/attnlab/kernels
	install -m 644 kernels/*.cu kernels/*.cuh kernels/*.h $(DESTDIR)$(PREFIX)/share/attnlab/kernels/
	install -m 644 lua/attnlab/*.lua $(DESTDIR)$(LUADIR)/attnlab/
	install -m 644 lua/attnlab/variants/*.lua $(DESTDIR)$(LUADIR)/attnlab/variants/
	install -m 644 lua/attnlab/cp/*.lua $(DESTDIR)$(LUADIR)/attnlab/cp/
	install -m 644 include/attnlab.h $(DESTDIR)$(LUADIR)/attnlab/
	printf 'return { libdir = "%s", header = "%s", kernel_dir = "%s" }\n' "$(PREFIX)/lib" \
		"$(PREFIX)/include/attnlab.h" "$(PREFIX)/share/attnlab/kernels" > $(DESTDIR)$(LUADIR)/attnlab/config.lua
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(PREFIX)/lib|g' -e 's|@LUADIR@|$(LUADIR)|g' \
		scripts/attnlab > $(DESTDIR)$(PREFIX)/bin/attnlab && chmod 755 $(DESTDIR)$(PREFIX)/bin/attnlab
	sed -e 's|@PREFIX@|$(PREFIX)|g' attnlab.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/attnlab.pc

clean:
	rm -rf $(BUILD) $(LIBDIR)
