# ckptfs — `make` builds everything into build/; see README.md for the targets.
CC      ?= cc
PREFIX  ?= /usr/local
DESTDIR ?=
SANITIZE ?=
BUILD   ?= $(if $(SANITIZE),build/san,build)
PYTHON  ?= /usr/bin/python3
PYDEPS  := $(CURDIR)/.deps/python

PKGS    := fuse3 libcjson libxxhash
CFLAGS  ?= -O2 -g
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wshadow -Wvla -fno-strict-aliasing -fPIC \
           $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
LDLIBS  += $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lpthread

# libckload uses the CUDA runtime where the toolkit is; elsewhere it is built for the CPU only.
CUDA_HOME ?= /usr/local/cuda
HAVE_CUDA := $(wildcard $(CUDA_HOME)/include/cuda_runtime_api.h)
ifneq ($(HAVE_CUDA),)
CUDA_CFLAGS := -DCKL_HAVE_CUDA -I$(CUDA_HOME)/include
CUDA_LIBS   := -L$(CUDA_HOME)/lib64 -lcudart -Wl,-rpath,$(CUDA_HOME)/lib64
endif
ifneq ($(SANITIZE),)
CFLAGS  += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=all
LDFLAGS += -fsanitize=$(SANITIZE)
endif

CORE_SRC := $(wildcard pack/*.c)
VIEW_SRC := fs/tree.c fs/view.c
FS_SRC   := fs/ll.c fs/main.c
TOOL_SRC := $(wildcard tools/*.c)
LOAD_SRC := $(wildcard cuda/*.c)
UNIT_SRC := $(wildcard tests/unit/*.c)

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))

PY_SRC := $(wildcard cuda/python/*.py)

all: $(BUILD)/ckptfs $(BUILD)/ckpt $(BUILD)/libckload.so $(PY_SRC:cuda/python/%=$(BUILD)/python/%)
ifeq ($(HAVE_CUDA),)
	@echo "note: no CUDA toolkit at $(CUDA_HOME): libckload is built for the CPU only"
endif

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/libckpt.a: $(call obj,$(CORE_SRC) $(VIEW_SRC))
	$(AR) rcs $@ $^

$(BUILD)/ckptfs: $(call obj,$(FS_SRC)) $(BUILD)/libckpt.a
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(BUILD)/obj/cuda/%.o: cuda/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(CUDA_CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/ckpt: $(call obj,$(TOOL_SRC) $(LOAD_SRC)) $(BUILD)/libckpt.a
	$(CC) $(LDFLAGS) $^ $(LDLIBS) $(CUDA_LIBS) -o $@

$(BUILD)/libckload.so: $(call obj,$(LOAD_SRC)) $(BUILD)/libckpt.a
	$(CC) $(LDFLAGS) -shared $^ $(LDLIBS) $(CUDA_LIBS) -o $@

$(BUILD)/python/%.py: cuda/python/%.py
	@mkdir -p $(dir $@)
	cp $< $@

$(BUILD)/test_unit: $(call obj,$(UNIT_SRC)) $(BUILD)/libckpt.a
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -lcriterion -o $@

setup:
	@scripts/setup

# Unit tests (criterion), then integration tests (pytest: real mounts, checked against torch,
# numpy and the safetensors library).
test: setup
	$(MAKE) all $(BUILD)/test_unit
	$(BUILD)/test_unit --jobs 2
	CKPTFS_BUILD=$(CURDIR)/$(BUILD) PYTHONPATH=$(PYDEPS):$(CURDIR)/$(BUILD)/python $(PYTHON) -m pytest -q -p no:cacheprovider tests/integration

bench: setup all
	PYTHONPATH=$(PYDEPS) CKPTFS_BUILD=$(CURDIR)/$(BUILD) scripts/bench-fs
	PYTHONPATH=$(PYDEPS) CKPTFS_BUILD=$(CURDIR)/$(BUILD) scripts/bench-torch
	PYTHONPATH=$(PYDEPS) CKPTFS_BUILD=$(CURDIR)/$(BUILD) scripts/bench-pack

demo: setup all
	PYTHON=$(PYTHON) PYTHONPATH=$(PYDEPS) CKPTFS_BUILD=$(CURDIR)/$(BUILD) scripts/demo

# On a machine with a GPU: byte-exact loads to cuda:0 and the GPU error paths.
gpu-test: setup all
	CKPTFS_BUILD=$(CURDIR)/$(BUILD) PYTHONPATH=$(PYDEPS):$(CURDIR)/$(BUILD)/python $(PYTHON) -m pytest -q -p no:cacheprovider tests/gpu

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/sbin
	install -m 0755 $(BUILD)/ckptfs $(BUILD)/ckpt $(DESTDIR)$(PREFIX)/bin/
	install -m 0755 tools/mount.fuse.ckptfs $(DESTDIR)$(PREFIX)/sbin/
	install -m 0755 $(BUILD)/libckload.so $(DESTDIR)$(PREFIX)/lib/

clean:
	rm -rf build

.PHONY: all setup test gpu-test bench demo install clean
-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
