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
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wshadow -Wvla -fno-strict-aliasing \
           $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
LDLIBS  += $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lpthread
ifneq ($(SANITIZE),)
CFLAGS  += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=all
LDFLAGS += -fsanitize=$(SANITIZE)
endif

CORE_SRC := $(wildcard pack/*.c)
VIEW_SRC := fs/tree.c fs/view.c
FS_SRC   := fs/ll.c fs/main.c
TOOL_SRC := $(wildcard tools/*.c)
UNIT_SRC := $(wildcard tests/unit/*.c)

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))

all: $(BUILD)/ckptfs $(BUILD)/ckpt

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/libckpt.a: $(call obj,$(CORE_SRC) $(VIEW_SRC))
	$(AR) rcs $@ $^

$(BUILD)/ckptfs: $(call obj,$(FS_SRC)) $(BUILD)/libckpt.a
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(BUILD)/ckpt: $(call obj,$(TOOL_SRC)) $(BUILD)/libckpt.a
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(BUILD)/test_unit: $(call obj,$(UNIT_SRC)) $(BUILD)/libckpt.a
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -lcriterion -o $@

setup:
	@scripts/setup

# Unit tests (criterion), then integration tests (pytest: real mounts, checked against torch,
# numpy and the safetensors library).
test: setup
	$(MAKE) all $(BUILD)/test_unit
	$(BUILD)/test_unit --jobs 2
	CKPTFS_BUILD=$(CURDIR)/$(BUILD) PYTHONPATH=$(PYDEPS) $(PYTHON) -m pytest -q -p no:cacheprovider tests/integration

bench: setup all
	PYTHONPATH=$(PYDEPS) CKPTFS_BUILD=$(CURDIR)/$(BUILD) scripts/bench-fs
	PYTHONPATH=$(PYDEPS) CKPTFS_BUILD=$(CURDIR)/$(BUILD) scripts/bench-torch
	PYTHONPATH=$(PYDEPS) CKPTFS_BUILD=$(CURDIR)/$(BUILD) scripts/bench-pack

demo: setup all
	PYTHON=$(PYTHON) PYTHONPATH=$(PYDEPS) CKPTFS_BUILD=$(CURDIR)/$(BUILD) scripts/demo

install: all
	install -d $(DESTDIR)$(PREFIX)/bin
	install -m 0755 $(BUILD)/ckptfs $(BUILD)/ckpt $(DESTDIR)$(PREFIX)/bin/

clean:
	rm -rf build

.PHONY: all setup test bench demo install clean
-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
