# fuzz/fuzz.mk — libFuzzer harnesses (included by the Makefile; see fuzz/fuzz.h).
#
#   make fuzz [FUZZ_SECONDS=N] [FUZZ_TARGETS="zip pickle"]
#       builds build/fuzz/fuzz_TARGET with clang (-fsanitize=fuzzer,address,undefined), writes
#       seed inputs into build/fuzz/seeds/ (fuzz/gen_seeds.py), then runs each target N seconds
#       in turn, one process at a time. New inputs go to build/fuzz/corpus/TARGET, crashes to
#       build/fuzz/artifacts/TARGET/; copy a crash into tests/regress/TARGET/ once it is fixed.
#   make fuzz-replay
#       replays tests/regress/TARGET/* through each harness linked with a plain main (gcc, and
#       the sanitizers when SANITIZE is set); `make test` runs it.

FUZZ_TARGETS ?= safetensors sharded zip pickle torch_zip torch_legacy packfile source plan npy gguf \
                pt2 dcp s3_list s3_creds gcs_list sharemsg shareclient
FUZZ_SECONDS ?= 60
FUZZ_MAX_LEN ?= 262144
FUZZ_CC      ?= clang
FUZZ_DIR     := build/fuzz
FUZZ_SAN     := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
FUZZ_CFLAGS  := -g -O1 -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wshadow -Wvla \
                -fno-strict-aliasing $(FUZZ_SAN) $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
# Only the core is instrumented for coverage; libFuzzer's main comes at link time.
FUZZ_LIB_SRC := $(CORE_SRC) $(PLAN_SRC) $(SHAREMSG_SRC) $(SHARECLIENT_SRC) fuzz/common.c
FUZZ_LIB_OBJ := $(patsubst %.c,$(FUZZ_DIR)/obj/%.o,$(FUZZ_LIB_SRC))
FUZZ_OPTS    := -rss_limit_mb=2048 -timeout=10 -max_len=$(FUZZ_MAX_LEN) -print_final_stats=1

$(FUZZ_DIR)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@

$(FUZZ_DIR)/fuzz_%: $(FUZZ_DIR)/obj/fuzz/fuzz_%.o $(FUZZ_LIB_OBJ)
	$(FUZZ_CC) $(FUZZ_SAN) -fsanitize=fuzzer $^ $(LDLIBS) -o $@

# Seeds are made, not stored: tiny files written by torch, the safetensors library and
# `ckpt pack`, plus ../shared/corpus when it exists (only read).
$(FUZZ_DIR)/seeds/.done: fuzz/gen_seeds.py $(BUILD)/ckpt
	rm -rf $(FUZZ_DIR)/seeds
	PYTHONPATH=$(PYDEPS) $(PYTHON) fuzz/gen_seeds.py --out $(FUZZ_DIR)/seeds --ckpt $(BUILD)/ckpt \
	    --corpus ../shared/corpus --max-len $(FUZZ_MAX_LEN)
	touch $@

fuzz-build: $(FUZZ_TARGETS:%=$(FUZZ_DIR)/fuzz_%)

# Each target in turn, so one core is busy at a time. The corpus directory comes first: new
# inputs are written there, never into the seeds.
fuzz: setup fuzz-build $(FUZZ_DIR)/seeds/.done
	@for t in $(FUZZ_TARGETS); do \
	    mkdir -p $(FUZZ_DIR)/corpus/$$t $(FUZZ_DIR)/artifacts/$$t $(FUZZ_DIR)/tmp || exit 1; \
	    echo "fuzz: $$t for $(FUZZ_SECONDS) s"; \
	    TMPDIR=$(CURDIR)/$(FUZZ_DIR)/tmp $(FUZZ_DIR)/fuzz_$$t $(FUZZ_OPTS) \
	        -max_total_time=$(FUZZ_SECONDS) -artifact_prefix=$(FUZZ_DIR)/artifacts/$$t/ \
	        $(FUZZ_DIR)/corpus/$$t $(FUZZ_DIR)/seeds/$$t $$(ls -d tests/regress/$$t 2>/dev/null) \
	        2> $(FUZZ_DIR)/fuzz_$$t.log || { tail -n 60 $(FUZZ_DIR)/fuzz_$$t.log; exit 1; }; \
	    grep -E '^(stat::number_of_executed_units|#[0-9]+ +DONE)' $(FUZZ_DIR)/fuzz_$$t.log; \
	done

FUZZ_REPLAY := $(FUZZ_TARGETS:%=$(BUILD)/replay/fuzz_%)

$(BUILD)/replay/fuzz_%: $(BUILD)/obj/fuzz/fuzz_%.o $(BUILD)/obj/fuzz/common.o \
                        $(BUILD)/obj/fuzz/replay.o \
                        $(call obj,$(PLAN_SRC) $(SHAREMSG_SRC) $(SHARECLIENT_SRC)) \
                        $(BUILD)/libckpt.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

fuzz-replay: $(FUZZ_REPLAY)
	@for t in $(FUZZ_TARGETS); do \
	    printf '%s: ' $$t; $(BUILD)/replay/fuzz_$$t tests/regress/$$t || exit 1; \
	done

.PHONY: fuzz fuzz-build fuzz-replay
.PRECIOUS: $(FUZZ_DIR)/obj/%.o $(BUILD)/obj/fuzz/%.o
-include $(shell find $(FUZZ_DIR)/obj -name '*.d' 2>/dev/null)
