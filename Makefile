# ckptfs — `make` builds everything into build/; see README.md for the targets.
CC      ?= cc
PREFIX  ?= /usr/local
DESTDIR ?=
SANITIZE ?=
BUILD   ?= $(if $(SANITIZE),build/san,$(if $(COVERAGE),build/cov,build))
PYTHON  ?= /usr/bin/python3
PYDEPS  := $(CURDIR)/.deps/python

PKGS    := fuse3 libcjson libxxhash zlib
CFLAGS  ?= -O2 -g
# -fPIC (the core also goes into libckload.so) would otherwise keep a file's calls of its own
# global functions from being inlined, in case another object interposed them: nothing does
# (libckload.so exports only its ckl_ API), and the mount's parse runs fewer instructions
# (BENCHMARKS.md, "Issue 13, fourth round: mount latency").
# WERROR: scripts/gpu-run retries a device build without it (a newer compiler's new warning must
# not cost the one GPU run), and reports the warnings.
WERROR  ?= -Werror
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra $(WERROR) -Wshadow -Wvla -fno-strict-aliasing -fPIC \
           -fno-semantic-interposition $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
LDLIBS  += $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lpthread

# libckload uses the CUDA runtime where the toolkit is (its CUDA backend, loader/backend_cuda.c);
# elsewhere it is built for the CPU only (loader/backend_nocuda.c says so).
CUDA_HOME ?= /usr/local/cuda
CUDA_LIBDIR ?= $(CUDA_HOME)/lib64
HAVE_CUDA := $(wildcard $(CUDA_HOME)/include/cuda_runtime_api.h)
ifneq ($(HAVE_CUDA),)
CUDA_CFLAGS := -I$(CUDA_HOME)/include
# No CUDA library at link time: libcudart is opened at the first CUDA use (loader/cudart.c)
endif
# The soname's number is the ABI version, which ckload.h owns.
CKL_ABI := $(shell sed -n 's/^\#define CKL_ABI_VERSION //p' loader/ckload.h)
ifneq ($(SANITIZE),)
CFLAGS  += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=all
LDFLAGS += -fsanitize=$(SANITIZE)
endif
# The tests load build/san/libckload.so into an uninstrumented python: the ASan runtime must be
# loaded first, so it is preloaded. Python itself leaks by design at exit, hence no leak check
# there (children inherit both; the unit tests and fuzz-replay keep leak checking). libstdc++ is
# preloaded too: ASan finds the __cxa_throw it wraps only in what is loaded when it starts, and
# a C++ exception that torch throws (refusing a CUDA capsule) would abort python otherwise.
# The quarantine of freed memory is kept small (ASan's default holds 256 MiB resident): the
# tests that bound a daemon's memory (cache_mem + 32 MiB) measure ours, not ASan's.
comma := ,
ifneq ($(filter address,$(subst $(comma), ,$(SANITIZE))),)
SAN_PYTHON_ENV := LD_PRELOAD="$(shell $(CC) -print-file-name=libasan.so) \
                  $(shell $(CC) -print-file-name=libstdc++.so.6)" \
                  ASAN_OPTIONS=detect_leaks=0:quarantine_size_mb=4:thread_local_quarantine_size_kb=64
endif

# The release, which `ckptfs --version` and `ckpt --version` print: the VERSION file owns it.
VERSION  := $(shell cat VERSION)

CORE_SRC := $(wildcard base/*.c sources/*.c index/*.c formats/*.c checkpoint/*.c)
# libckpt.a: the core (base/ to checkpoint/) and what the loader needs of views/ (a mount's names
# and sources, the tree that finds a mount's subdirectory); index.json's view and the filesystem
# core are the mount's and the tools'.
MOUNTINFO_SRC := views/mountinfo.c views/tree.c
VIEW_SRC := views/view.c fs/core.c
FS_SRC   := fs/ll.c fs/main.c fs/watch.c fs/options.c fs/preflight.c fs/tuning.c fs/daemon.c
TOOL_SRC := $(wildcard tools/*.c)
# The loader's planning (which blobs, where in the block, tensor-parallel parts): the loader's,
# and the unit tests' and the plan fuzzer's.
PLAN_SRC := loader/plan.c loader/slice.c
# The warm-attach message (no CUDA, no sockets): the loader's, its unit tests' and its fuzzer's.
SHAREMSG_SRC := loader/sharemsg.c
# Warm attach's client up to the mapping, and the socket under it (no CUDA): the same.
SHARECLIENT_SRC := loader/share_client.c loader/sharesock.c
# The cold-read policy and the io_uring read loop: the loader's, and their unit tests'.
COLD_SRC := loader/direct.c loader/ringload.c loader/uring.c loader/backend_cpu.c
LOAD_SRC := $(PLAN_SRC) $(COLD_SRC) loader/ckload.c loader/ckload_setup.c loader/pool.c loader/mount.c loader/abi.c \
            loader/dlpack.c loader/share_keeper.c loader/share_attach.c $(SHARECLIENT_SRC) \
            $(SHAREMSG_SRC) \
            $(if $(HAVE_CUDA),loader/backend_cuda.c loader/cudart.c,loader/backend_nocuda.c)
UNIT_SRC := $(wildcard tests/unit/*.c)

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))

PY_SRC := $(wildcard loader/python/*.py)

all: $(BUILD)/ckptfs $(BUILD)/ckpt $(BUILD)/libckload.so $(PY_SRC:loader/python/%=$(BUILD)/python/%)
ifeq ($(HAVE_CUDA),)
	@echo "note: no CUDA toolkit at $(CUDA_HOME): libckload is built for the CPU only"
endif

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/libckpt.a: $(call obj,$(CORE_SRC) $(MOUNTINFO_SRC))
	rm -f $@ && $(AR) rcs $@ $^

# ckptfs starts on every mount, and its start is part of what a mount costs: the libraries that
# ship an archive are linked into it, so the dynamic loader has three objects fewer to find, map
# and relocate (BENCHMARKS.md, "Issue 13, fourth round: mount latency"). cJSON ships none; ckpt
# and libckload, which start once per load, stay as they are. The Debian package links the three
# shared (scripts/deb).
CKPTFS_STATIC := -lfuse3 -lxxhash -lz
$(BUILD)/ckptfs: $(call obj,$(FS_SRC) $(VIEW_SRC)) $(BUILD)/libckpt.a
	$(CC) $(LDFLAGS) $^ -Wl,-Bstatic $(CKPTFS_STATIC) -Wl,-Bdynamic \
	    $(filter-out $(CKPTFS_STATIC),$(LDLIBS)) -o $@

$(BUILD)/obj/loader/backend_cuda.o $(BUILD)/obj/loader/cudart.o: CFLAGS += $(CUDA_CFLAGS)
$(BUILD)/obj/fs/main.o $(BUILD)/obj/tools/ckpt.o: CFLAGS += -DCKPTFS_VERSION='"$(VERSION)"'
$(BUILD)/obj/fs/main.o $(BUILD)/obj/tools/ckpt.o: VERSION

# libckload reads cold host loads through io_uring (loader/uring.c: Debian's liburing).
$(BUILD)/ckpt $(BUILD)/libckload.so: LDLIBS += -luring
# ckpt diff and stats take square roots (tools/inspect.c).
$(BUILD)/ckpt: LDLIBS += -lm
$(BUILD)/ckpt: $(call obj,$(TOOL_SRC) $(LOAD_SRC) views/view.c) $(BUILD)/libckpt.a
	$(CC) $(LDFLAGS) $^ $(LDLIBS) $(CUDA_LIBS) -o $@

# Exports only the ckl_ API (loader/ckload.map); -z defs: every symbol it needs is resolved now.
$(BUILD)/libckload.so: $(call obj,$(LOAD_SRC)) $(BUILD)/libckpt.a loader/ckload.map
	$(CC) $(LDFLAGS) -shared -Wl,-soname,libckload.so.$(CKL_ABI) -Wl,-z,defs \
	    -Wl,--version-script=loader/ckload.map $(filter-out %.map,$^) $(LDLIBS) $(CUDA_LIBS) -o $@

# A library whose one dependency is libcurl: what the wheel ships libcurl through (setup.py).
$(BUILD)/libckcurl.so:
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -shared -Wl,-soname,libckcurl.so -Wl,--no-as-needed -x c /dev/null -lcurl -o $@

$(BUILD)/python/%.py: loader/python/%.py
	@mkdir -p $(dir $@)
	cp $< $@

$(BUILD)/test_unit: $(call obj,$(UNIT_SRC) $(PLAN_SRC) $(SHAREMSG_SRC) $(SHARECLIENT_SRC) \
                             $(COLD_SRC) loader/pool.c \
                             $(VIEW_SRC)) \
                   $(BUILD)/libckpt.a
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -luring -lcriterion -lcrypto -o $@

setup:
	@scripts/setup

# Every pytest run of the tests: -rs lists each skip with its reason. Each run also appends its
# skips to SKIP_LOG (tests/integration/conftest.py), which `make test` counts at its end.
PYTEST   := -m pytest -q -p no:cacheprovider -rs
SKIP_LOG := $(CURDIR)/$(BUILD)/skips.log
# CI=true (or 1): GitHub and most CIs set it, .ci/run too. There what the tests need is there
# (docs/TESTING.md), and a test that finds it missing fails instead of skipping; the unit
# tests' helpers and the integration tests' `need` read CI the same way.
ON_CI    := $(filter true TRUE True 1,$(CI))

# Unit tests (criterion), the inputs that once crashed a parser (tests/regress, fuzz/fuzz.mk),
# then integration tests (pytest: real mounts, checked against torch, numpy and the safetensors
# library).
test: setup check-layers
	$(if $(ON_CI),$(if $(HAVE_CUDA),,$(error no CUDA toolkit at $(CUDA_HOME): under CI=true \
	    the CUDA stand-in's tests must run)))
	@# the stand-in too, before the integration run: test_py_errors.py's no-device tests use it
	$(MAKE) all $(BUILD)/test_unit $(FUZZ_REPLAY) $(FAKECUDA)
	: >$(SKIP_LOG)
	$(PYTHON) scripts/check-calls $(BUILD)
	{ $(BUILD)/test_unit --jobs 2; echo $$? >$(BUILD)/test_unit.rc; } 2>&1 | tee $(BUILD)/test_unit.log
	@# criterion counts a test that leaks as passed (its child reports the leak after the result)
	test "$$(cat $(BUILD)/test_unit.rc)" = 0 && ! grep -q 'ERROR: LeakSanitizer' $(BUILD)/test_unit.log
	$(MAKE) fuzz-replay
	$(SAN_PYTHON_ENV) CKPTFS_BUILD=$(CURDIR)/$(BUILD) PYTHONPATH=$(PYDEPS):$(CURDIR)/$(BUILD)/python \
	    CKPTFS_SKIP_LOG=$(SKIP_LOG) $(PYTHON) $(PYTEST) tests/integration \
	    $(CUDA_FAKE_TESTS:%=--ignore=tests/integration/%.py) \
	    $(if $(SANITIZE),$(ONCE_TESTS:%=--ignore=tests/integration/%.py))
	$(MAKE) test-torch2
	$(if $(HAVE_CUDA),$(MAKE) test-cuda-fake,echo "test-cuda-fake: not run: no CUDA toolkit at" \
	    "$(CUDA_HOME) (under CI=true this fails)" | tee -a $(SKIP_LOG))
	@echo "make test: $$(wc -l <$(SKIP_LOG)) skipped across its pytest runs (the reasons: each" \
	    "run's summary above, and $(SKIP_LOG))"

# Suites that run once, not again under a sanitizer: what they test is built without one (the
# wheel, the Debian package) or is a client's (vLLM), and each costs minutes.
ONCE_TESTS := test_vllm test_vllm_matrix test_wheel_root test_sidecar test_deb

# The loader's tests again under torch 2.x (.deps/torch2, which scripts/setup makes: what GPU
# users have), beside the main run's Debian torch 1.13: loads from every source, DLPack 1.0,
# load_into, slices, gloo ranks, and torch.save files of 2.x through the mount and convert. Not
# the stand-in's tests: torch 2.x brings a libcudart of the stand-in's soname.
TORCH2_PYTHON := $(CURDIR)/.deps/torch2/bin/python
TORCH2_TESTS  := test_load test_load_source test_load_mount test_load_uring test_load_into \
                 test_slices test_distributed test_libckload test_torch test_convert test_wheel \
                 test_vllm_placement test_vllm_odd_loaders
test-torch2: all
	$(SAN_PYTHON_ENV) CKPTFS_BUILD=$(CURDIR)/$(BUILD) PYTHONPATH=$(PYDEPS):$(CURDIR)/$(BUILD)/python \
	    CKPTFS_SKIP_LOG=$(SKIP_LOG) $(TORCH2_PYTHON) $(PYTEST) $(TORCH2_TESTS:%=tests/integration/%.py)

# Every #include goes downward through the layers (docs/LAYOUT.md's table says which they are).
check-layers:
	$(PYTHON) scripts/check-layers
# No two files call each other's functions (scripts/check-calls reads the objects' symbols).
check-calls: all
	$(PYTHON) scripts/check-calls $(BUILD)

# The unit tests under valgrind (memcheck, full leak check). Criterion re-executes the binary
# for each test, so children are traced (not python, which the pickle tests run) and each
# process writes its own log; any error or leak in any of them fails the target.
valgrind: setup $(BUILD)/test_unit
	rm -rf $(BUILD)/valgrind && mkdir -p $(BUILD)/valgrind
	cp $(BUILD)/test_unit $(BUILD)/valgrind/ # a rebuild must not swap the binary mid-run
	valgrind -q --leak-check=full --errors-for-leak-kinds=definite,possible \
	    --suppressions=tests/unit/valgrind.supp --trace-children=yes \
	    --trace-children-skip='*python*' --log-file=$(BUILD)/valgrind/%p.log \
	    $(BUILD)/valgrind/test_unit --jobs 1
	@if grep -l . $(BUILD)/valgrind/*.log >/dev/null; then cat $(BUILD)/valgrind/*.log; \
	    echo "valgrind: errors above"; exit 1; fi
	@echo "valgrind: no errors, no leaks"

# setup --bench adds the loaders bench-load compares against (.deps/bench), which tests never need.
bench: all
	@scripts/setup --bench
	PYTHONPATH=$(PYDEPS) CKPTFS_BUILD=$(CURDIR)/$(BUILD) scripts/bench-fs
	PYTHONPATH=$(PYDEPS) CKPTFS_BUILD=$(CURDIR)/$(BUILD) scripts/bench-torch
	PYTHONPATH=$(PYDEPS) CKPTFS_BUILD=$(CURDIR)/$(BUILD) scripts/bench-pack
	PYTHONPATH=$(PYDEPS) CKPTFS_BUILD=$(CURDIR)/$(BUILD) scripts/bench-npy
	PYTHONPATH=$(PYDEPS):$(CURDIR)/.deps/bench:$(CURDIR)/$(BUILD)/python CKPTFS_BUILD=$(CURDIR)/$(BUILD) scripts/bench-load
	PYTHONPATH=$(PYDEPS):$(CURDIR)/.deps/bench:$(CURDIR)/$(BUILD)/python CKPTFS_BUILD=$(CURDIR)/$(BUILD) scripts/bench-gpu
	CKPTFS_BUILD=$(CURDIR)/$(BUILD) scripts/bench-load-into
	PYTHONPATH=$(PYDEPS) CKPTFS_BUILD=$(CURDIR)/$(BUILD) scripts/bench-gguf
	PYTHONPATH=$(PYDEPS) CKPTFS_BUILD=$(CURDIR)/$(BUILD) scripts/bench-convert
	CKPTFS_BUILD=$(CURDIR)/$(BUILD) scripts/bench-diff
	PYTHONPATH=$(PYDEPS):$(CURDIR)/$(BUILD)/python CKPTFS_BUILD=$(CURDIR)/$(BUILD) scripts/bench-dist
	PYTHONPATH=$(PYDEPS):$(CURDIR)/$(BUILD)/python CKPTFS_BUILD=$(CURDIR)/$(BUILD) scripts/bench-http
	PYTHONPATH=$(PYDEPS) CKPTFS_BUILD=$(CURDIR)/$(BUILD) $(CURDIR)/.deps/torch2/bin/python scripts/bench-dcp
	PYTHONPATH=$(PYDEPS):$(CURDIR)/.deps/bench:$(CURDIR)/$(BUILD)/python CKPTFS_BUILD=$(CURDIR)/$(BUILD) scripts/bench-s3

# setup first, then the build (a prerequisite beside setup could start before it under -j).
demo: setup
	$(MAKE) all
	PYTHON=$(PYTHON) PYTHONPATH=$(PYDEPS):$(CURDIR)/$(BUILD)/python CKPTFS_BUILD=$(CURDIR)/$(BUILD) scripts/demo

# On a machine with a GPU: byte-exact loads to cuda:0 and the GPU error paths. No `setup`:
# GPU machines often have their own Python stack and no package mirror (PYTHON=... picks it).
gpu-test: all
	CKPTFS_BUILD=$(CURDIR)/$(BUILD) PYTHONPATH=$(PYDEPS):$(CURDIR)/$(BUILD)/python $(PYTHON) $(PYTEST) tests/gpu

# The binaries, the man pages, libckload as libckload.so.N (its soname) with the libckload.so
# link to build against, its header, a pkg-config file for PREFIX, and the ckload module where
# the system Python imports it (PYDIR) — told in that copy where the library is, since the two
# are in different directories there. PYDIR: PREFIX/lib/pythonX.Y/ and the directory name this
# Python installs into (dist-packages on Debian, site-packages elsewhere), which is on its
# sys.path for PREFIX=/usr/local and /usr. LIBDIR: where the library and its pkg-config file go
# (the Debian package gives the multiarch directory, /usr/lib/x86_64-linux-gnu).
LIBDIR ?= $(PREFIX)/lib
PYDIR ?= $(PREFIX)/lib/python$(shell $(PYTHON) -c 'import sysconfig as s; \
           print(s.get_python_version() + "/" + s.get_path("purelib").rstrip("/").split("/")[-1])')
install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/sbin $(DESTDIR)$(PREFIX)/include \
	    $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(PREFIX)/share/man/man1 \
	    $(DESTDIR)$(PREFIX)/share/man/man3 $(DESTDIR)$(PREFIX)/share/man/man8 $(DESTDIR)$(PYDIR)
	install -m 0755 $(BUILD)/ckptfs $(BUILD)/ckpt $(DESTDIR)$(PREFIX)/bin/
	install -m 0755 tools/mount.fuse.ckptfs $(DESTDIR)$(PREFIX)/sbin/
	install -m 0644 man/ckptfs.1 man/ckpt.1 $(DESTDIR)$(PREFIX)/share/man/man1/
	install -m 0644 man/libckload.3 $(DESTDIR)$(PREFIX)/share/man/man3/
	install -m 0644 man/mount.fuse.ckptfs.8 $(DESTDIR)$(PREFIX)/share/man/man8/
	install -m 0755 $(BUILD)/libckload.so $(DESTDIR)$(LIBDIR)/libckload.so.$(CKL_ABI)
	ln -sf libckload.so.$(CKL_ABI) $(DESTDIR)$(LIBDIR)/libckload.so
	install -m 0644 loader/ckload.h $(DESTDIR)$(PREFIX)/include/
	sed 's|@PREFIX@|$(PREFIX)|; s|@LIBDIR@|$(LIBDIR)|; s|@VERSION@|$(CKL_ABI)|' loader/ckload.pc.in \
	    > $(DESTDIR)$(LIBDIR)/pkgconfig/ckload.pc
	sed 's|^_INSTALLED_LIB = None$$|_INSTALLED_LIB = "$(LIBDIR)/libckload.so.$(CKL_ABI)"|' \
	    loader/python/ckload.py > $(DESTDIR)$(PYDIR)/ckload.py
	grep -q '^_INSTALLED_LIB = "' $(DESTDIR)$(PYDIR)/ckload.py

# The wheel: pip builds it (setup.py), then auditwheel makes it self-contained: every library
# the programs link (cJSON, xxHash, liburing, zlib) and libcurl with its TLS (through
# libckcurl.so) are copied in, and the wheel is tagged with the oldest manylinux policy its
# symbols allow (the glibc of the machine it was built on).
AUDITWHEEL := PATH=$(CURDIR)/.deps/build/bin:$$PATH PYTHONPATH=$(CURDIR)/.deps/build $(PYTHON) -m auditwheel
wheel:
	rm -rf $(BUILD)/dist $(BUILD)/wheelhouse
	$(PYTHON) -m pip wheel -q --no-deps --no-build-isolation --no-index -w $(BUILD)/wheelhouse .
	$(AUDITWHEEL) repair -w $(BUILD)/dist $(BUILD)/wheelhouse/ckptfs-*.whl

# The Debian package, build/ckptfs_VERSION_ARCH.deb: its own build in build/deb (Debian's flags,
# Debian's shared libraries), staged by `make install PREFIX=/usr` (scripts/deb, pkg/debian/).
deb:
	MAKE="$(MAKE)" scripts/deb

clean:
	rm -rf build

# --- libckload's CUDA branch without a GPU (tests/fakecuda/README.md) ---------------------------
# The stand-in for libcudart, under the toolkit's soname, with its symbol version. The CUDA tests
# run in a python of their own whose LD_LIBRARY_PATH finds it first (libckload's path to the
# toolkit is a RUNPATH, which LD_LIBRARY_PATH overrides; the tests check which one was loaded).
# FAKECUDA_RUNS seeded runs of the pipeline test (more with `make cuda-fake-soak`); each run's
# seed is printed when it fails, FAKECUDA_SEED=N replays it. The main run leaves these out.
CUDA_FAKE_TESTS := test_cuda_fake test_cuda_fake_dist test_cuda_fake_share test_cuda_fake_keeper \
                   test_cuda_fake_client
ifneq ($(HAVE_CUDA),)
CUDART_SONAME := $(shell objdump -p $(CUDA_LIBDIR)/libcudart.so 2>/dev/null | \
                   sed -n 's/^ *SONAME *//p')
FAKECUDA      := $(BUILD)/fakecuda/$(CUDART_SONAME)
FAKECUDA_RUNS ?= 10
$(FAKECUDA): tests/fakecuda/fakecuda.c tests/fakecuda/fakecuda.h
	@mkdir -p $(dir $@)
	printf '%s { global: cuda*; fakecuda_*; local: *; };\n' $(CUDART_SONAME) >$@.map
	$(CC) $(CFLAGS) $(CUDA_CFLAGS) $(LDFLAGS) -shared -Wl,-soname,$(CUDART_SONAME) -Wl,-z,defs \
	    -Wl,--version-script=$@.map $< -lpthread -o $@
test-cuda-fake: all $(FAKECUDA)
	$(SAN_PYTHON_ENV) LD_LIBRARY_PATH=$(CURDIR)/$(dir $(FAKECUDA)) \
	    CKPTFS_FAKECUDA=$(CURDIR)/$(FAKECUDA) FAKECUDA_RUNS=$(FAKECUDA_RUNS) \
	    CKPTFS_BUILD=$(CURDIR)/$(BUILD) PYTHONPATH=$(PYDEPS):$(CURDIR)/$(BUILD)/python \
	    CKPTFS_SKIP_LOG=$(SKIP_LOG) $(PYTHON) $(PYTEST) $(CUDA_FAKE_TESTS:%=tests/integration/%.py)
cuda-fake-soak:
	$(MAKE) test-cuda-fake FAKECUDA_RUNS=$(or $(RUNS),200) PYTEST_ADDOPTS="-k seeded_pipeline"
# Line coverage of loader/ (gcov) by the tests under the stand-in, in build/cov.
cuda-coverage: setup
	find build/cov -name '*.gcda' -delete 2>/dev/null || true
	$(MAKE) COVERAGE=1 test-cuda-fake
	gcov -n -o build/cov/obj/loader $(LOAD_SRC) 2>/dev/null | \
	    awk '/^File/ {f=$$2} /^Lines/ && f !~ /\.h.$$/ {print (f ? f : "libckload"), $$0; f=""}'
endif
ifneq ($(COVERAGE),)
CFLAGS  += --coverage -O0
LDFLAGS += --coverage
endif
.PHONY: test-cuda-fake cuda-fake-soak cuda-coverage

include fuzz/fuzz.mk

.PHONY: all setup test test-torch2 check-layers check-calls valgrind gpu-test bench demo install wheel deb clean
-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
