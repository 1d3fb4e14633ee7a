# attnlab — build, test, bench, demo, install.
#
#   make            lib/libattnlab.so (the core, no CUDA dependency) and, when nvcc is found,
#                   lib/libattnlab_cuda.so (the CUDA plugin: sm_90a + sm_80)
#   make test       C unit tests + busted specs under LuaJIT; ends with "N passed, N failed[, N skipped]"
#   make bench      every bench/*.lua (CPU, and GPU where one is usable)
#   make demo       installs what is missing (make deps), builds, runs examples/demo.lua
#   make install    PREFIX=/usr/local DESTDIR= : library, header, Lua modules, launcher, pkg-config
#   make deps       apt-get installs luajit, libluajit-5.1-dev, lua-busted, libopenblas-dev if missing
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
              -Iinclude -Isrc -Wno-deprecated-gpu-targets
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

.PHONY: all test test-c test-lua bench demo install deps clean
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

$(BUILD)/%.o: %.cu $(wildcard include/*.h src/*.h src/numeric/*.h src/cuda/*.h)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -c $< -o $@

$(CUDA_LIB): $(CUDA_OBJ) $(CORE_LIB)
	@mkdir -p $(dir $@)
	$(NVCC) -shared -o $@.tmp $(CUDA_OBJ) -L$(LIBDIR) -lattnlab $(CUDA_LDLIBS) -Xlinker -rpath='$$ORIGIN' \
		&& mv -f $@.tmp $@

$(BUILD)/tests/%: tests/c/%.c tests/c/test_main.h $(CORE_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(AL_CFLAGS) $< -o $@ -L$(LIBDIR) -lattnlab $(AL_LDLIBS) -Wl,-rpath,$(abspath $(LIBDIR))

# Each suite prints its own "N passed, N failed" line into the log; scripts/tally.sh adds them up and
# prints the grand total as the last line (non-zero exit if anything failed).
test: all $(C_TESTS)
	@mkdir -p $(BUILD)
	@rm -f $(BUILD)/test.log
	@for t in $(C_TESTS); do sh scripts/tally.sh run $(BUILD)/test.log $$t; done; true
	@sh scripts/tally.sh run $(BUILD)/test.log env $(LUA_ENV) $(BUSTED) -o tests/spec/summary.lua tests/spec; true
	@sh scripts/tally.sh $(BUILD)/test.log

bench: all
	@for b in bench/*.lua; do echo "== $$b"; $(LUA_ENV) $(LUAJIT) $$b || exit 1; done

demo: deps all
	@$(LUA_ENV) $(LUAJIT) examples/demo.lua

# Debian packages the build and tests need; installed only when missing.
DEB_PKGS := luajit libluajit-5.1-dev lua-busted libopenblas-dev
deps:
	@missing=""; for p in $(DEB_PKGS); do \
		dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "attnlab: installing$$missing"; \
		SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	else echo "attnlab: dependencies present ($(DEB_PKGS))"; fi

LUADIR := $(PREFIX)/share/lua/5.1
install: all
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(LUADIR)/attnlab \
		$(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 755 $(ALL_LIBS) $(DESTDIR)$(PREFIX)/lib/
	install -m 644 include/attnlab.h $(DESTDIR)$(PREFIX)/include/
	install -m 644 lua/attnlab/*.lua $(DESTDIR)$(LUADIR)/attnlab/
	printf 'return { libdir = "%s", header = "%s" }\n' "$(PREFIX)/lib" "$(PREFIX)/include/attnlab.h" \
		> $(DESTDIR)$(LUADIR)/attnlab/config.lua
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(PREFIX)/lib|g' -e 's|@LUADIR@|$(LUADIR)|g' \
		scripts/attnlab > $(DESTDIR)$(PREFIX)/bin/attnlab && chmod 755 $(DESTDIR)$(PREFIX)/bin/attnlab
	sed -e 's|@PREFIX@|$(PREFIX)|g' attnlab.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/attnlab.pc

clean:
	rm -rf $(BUILD) $(LIBDIR)
