# cachew - GNU make build. `make` builds the libraries and programs,
# `make test` runs the Check suites, `make demo` the main job.
# Variables: PREFIX (/usr/local), DESTDIR, MANDIR, CC, CFLAGS, WERROR=1 (CI).

PREFIX  ?= /usr/local
LIBDIR  ?= $(PREFIX)/lib
INCDIR  ?= $(PREFIX)/include
BINDIR  ?= $(PREFIX)/bin
MANDIR  ?= $(PREFIX)/share/man
BUILD   ?= build
CC      ?= cc

VERSION := $(shell sed -n 's/^\#define CACHEW_VERSION_STRING "\(.*\)"/\1/p' include/cachew.h)
SOMAJOR := 0

PKGS     := libzstd libcurl msgpack libxxhash libturbojpeg jansson expat
# mbedTLS: the library under nng's TLS, also used directly to check TLS
# credentials and name refused handshakes (transports/nng/nng_tls.c).
# OpenSSL: the TLS engine cachew registers with nng instead of mbedTLS's
# (transports/nng/nng_tls_ossl.c: 30x faster record encryption).
# jansson and expat: the JSON and XML parsers of outside replies (GCS and
# S3 listings, the Kubernetes API server).
DEP_LIBS := -lnng -lmbedtls -lmbedx509 -lmbedcrypto -lssl -lcrypto -lzstd -lxxhash -lcurl -ljansson -lexpat -lturbojpeg -ljpeg -lz -lpthread -ldl -lm

OPT     ?= -O2 -g
WARN    := -Wall -Wextra -Wshadow -Wconversion -Wno-sign-conversion
ifeq ($(WERROR),1)
WARN    += -Werror
endif
BASE_CFLAGS := -std=c11 -D_GNU_SOURCE -fPIC -fvisibility=hidden \
	-fno-semantic-interposition \
	-Iinclude $(WARN) $(OPT)
SAN     :=
ALL_CFLAGS = $(BASE_CFLAGS) $(SAN) $(CFLAGS)

LIB_SRC  := $(wildcard src/core/*.c src/graph/*.c src/exec/*.c src/pipeline/*.c src/front/*.c \
	src/ops/*.c src/sources/*.c src/io/*.c src/cache/*.c \
	src/policy/*.c src/provision/*.c src/service/*.c src/service/*/*.c \
	transports/*.c transports/*/*.c)
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
# The CLI front ends, the simulator and the data generators: linked into
# the programs and the tests, never into libcachew.
TOOLS_SRC := $(filter-out src/tools/cachew.c src/tools/cachewd.c,$(wildcard src/tools/*.c))
TOOLS_OBJ := $(TOOLS_SRC:%.c=$(BUILD)/obj/%.o)
TEST_SRC := $(wildcard test/*.c)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/obj/%.o)
FUZZ_SRC := $(filter-out test/fuzz/fuzz_replay.c,$(wildcard test/fuzz/fuzz_*.c))
FUZZ_REPLAY := $(FUZZ_SRC:test/fuzz/%.c=$(BUILD)/fuzz/%_replay)

CHECK_LIBS := $(shell pkg-config --libs check 2>/dev/null || echo -lcheck -lsubunit -lrt -lm -lpthread)

.PHONY: all lib test check check-symbols check-layers asan tsan demo bench bench-progs deps install uninstall \
	clean fuzz examples valgrind chaos python pytest

all: lib $(BUILD)/cachew $(BUILD)/cachewd examples

lib: $(BUILD)/libcachew.a $(BUILD)/libcachew.so

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/libcachew.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libcachew.so: $(LIB_OBJ)
	$(CC) -shared -Wl,-soname,libcachew.so.$(SOMAJOR) $(SAN) -o $@ $^ \
		$(DEP_LIBS)

$(BUILD)/libcachew_tools.a: $(TOOLS_OBJ)
	@rm -f $@
	ar rcs $@ $^

# -rdynamic: plugins resolve cachew_* from the program itself.
$(BUILD)/cachew: $(BUILD)/obj/src/tools/cachew.o $(BUILD)/libcachew_tools.a $(BUILD)/libcachew.a
	$(CC) $(SAN) -rdynamic -o $@ $^ $(DEP_LIBS)

$(BUILD)/cachewd: $(BUILD)/obj/src/tools/cachewd.o $(BUILD)/libcachew_tools.a $(BUILD)/libcachew.a
	$(CC) $(SAN) -rdynamic -o $@ $^ $(DEP_LIBS)

# ---- tests ---------------------------------------------------------------
# What the suites run or load besides themselves: the programs they start
# and the plugins they load. Order-only prerequisites of the test binary,
# so that a focused run (make $(BUILD)/check_cachew, then CK_RUN_SUITE=...)
# builds them too: a test that loads plugin_example_v2.so failed when run
# before `make check` had built it. A change to one does not relink the
# tests ($^ leaves order-only prerequisites out); make still rebuilds one
# when its own sources change.
TEST_ARTEFACTS := $(BUILD)/cachew $(BUILD)/cachewd $(BUILD)/plugin_example.so \
	$(BUILD)/plugin_example_v2.so $(BUILD)/plugin_newer_def.so

$(BUILD)/check_cachew: $(TEST_OBJ) $(BUILD)/libcachew_tools.a $(BUILD)/libcachew.a | $(TEST_ARTEFACTS)
	$(CC) $(SAN) -rdynamic -o $@ $^ $(DEP_LIBS) $(CHECK_LIBS)

$(BUILD)/obj/test/%.o: test/%.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Wno-conversion -Itest -MMD -MP -c $< -o $@

$(BUILD)/fuzz/%_replay: test/fuzz/%.c test/fuzz/fuzz_replay.c $(BUILD)/libcachew.a
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Wno-conversion -o $@ $< test/fuzz/fuzz_replay.c \
		$(BUILD)/libcachew.a $(DEP_LIBS)

# The example plugin, loaded by the registry tests.
$(BUILD)/plugin_example.so: examples/plugin/plugin_example.c include/cachew.h
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -fvisibility=default -shared -o $@ $<

# The same plugin as another release (version 2.0): the tests see two
# builds of one plugin get different fingerprints and workers.
$(BUILD)/plugin_example_v2.so: examples/plugin/plugin_example.c include/cachew.h
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -fvisibility=default -shared \
		-DPLUGIN_EXAMPLE_VERSION='"2.0"' -o $@ $<

# A plugin whose definition claims a newer cachew_op_def version: the
# registry tests load it to see it refused.
$(BUILD)/plugin_newer_def.so: test/plugin/plugin_newer_def.c include/cachew.h
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -fvisibility=default -shared -o $@ $<

$(BUILD)/train_loop: examples/train_loop.c $(BUILD)/libcachew.a
	$(CC) $(ALL_CFLAGS) -o $@ $^ $(DEP_LIBS)

examples: $(BUILD)/plugin_example.so $(BUILD)/train_loop

# Global names: cachew_* (public) and cwi_* (cross-file internals) only;
# the shared library exports cachew_* alone.
check-symbols: $(BUILD)/libcachew.a $(BUILD)/libcachew.so
	@bad=$$(nm -g --defined-only $(BUILD)/libcachew.a 2>/dev/null | \
		awk 'NF == 3 {print $$3}' | grep -v -E '^(cachew_|cwi_|__odr_asan|__asan|__ubsan|__tsan)' | sort -u); \
	if [ -n "$$bad" ]; then echo "symbols: stray globals in libcachew.a:" $$bad; exit 1; fi
	@bad=$$(nm -D --defined-only $(BUILD)/libcachew.so 2>/dev/null | \
		awk 'NF == 3 {print $$3}' | grep -v -E '^(cachew_|_init$$|_fini$$|__odr_asan|__asan|__ubsan|__tsan)' | sort -u); \
	if [ -n "$$bad" ]; then echo "symbols: stray exports in libcachew.so:" $$bad; exit 1; fi
	@echo "symbols: only cachew_ and cwi_ globals"

# The module graph, read off the library's objects, is a DAG of folders
# (test/module_graph.py): a cycle across folders fails the build.
check-layers: $(BUILD)/libcachew.a
	@/usr/bin/python3 test/module_graph.py $(BUILD)/obj $(LIB_OBJ)

check: $(BUILD)/check_cachew $(TEST_ARTEFACTS) $(FUZZ_REPLAY) check-symbols check-layers
	@for f in $(FUZZ_REPLAY); do \
		n=$$(basename $$f _replay); \
		$$f test/fuzz/corpus/$$n || exit 1; \
	done
	@$(BUILD)/cachew ops --markdown | cmp -s - docs/operators.md || \
		{ echo "docs/operators.md is stale: run $(BUILD)/cachew ops --markdown > docs/operators.md"; exit 1; }
	CACHEW_BUILD=$(BUILD) $(BUILD)/check_cachew

# The Python package first, so that Check's summary line ends the output.
test: deps
	@$(MAKE) --no-print-directory pytest
	@$(MAKE) --no-print-directory check

# ---- the Python package (python/) ----------------------------------------------
# Debian's interpreter: the one with python3-numpy, -pytest and -torch
# (another python3 may come first on PATH).
PYTHON ?= /usr/bin/python3
PYBUILD = $(abspath $(BUILD))

# The extension, in place (python/cachew/_cachew*.so), linked with
# $(BUILD)/libcachew.a; `pip install --no-build-isolation ./python`
# installs the package instead.
python: $(BUILD)/libcachew.a
	cd python && CACHEW_BUILD=$(PYBUILD) $(PYTHON) setup.py -q build_ext \
		--inplace --build-temp $(PYBUILD)/python

# Its pytest suite (real cachewd processes, forked DataLoader workers).
pytest: python $(BUILD)/cachew $(BUILD)/cachewd $(BUILD)/plugin_example.so
	cd python && CACHEW_BUILD=$(PYBUILD) $(PYTHON) -m pytest -q -p no:cacheprovider tests

asan: deps
	@$(MAKE) --no-print-directory BUILD=build/asan OPT="-O1 -g" \
		SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
		check

# die_after_fork=0: a test forks a process that has used the embedded
# service (its threads) and runs the service again in the child.
tsan: deps
	@TSAN_OPTIONS="die_after_fork=0 $$TSAN_OPTIONS" \
		$(MAKE) --no-print-directory BUILD=build/tsan OPT="-O1 -g" \
		SAN="-fsanitize=thread" check

# No fork: every test's leaks count. ASan builds disable the element cache,
# so this is where the cache's own bookkeeping is checked. A child forked by
# a test that exits without exec (a provisioner's failed exec) is a copy of
# the whole test process: its leak report is not the suite's, so children
# stay silent.
valgrind: $(BUILD)/check_cachew $(TEST_ARTEFACTS)
	CK_FORK=no CWT_VALGRIND=1 CACHEW_BUILD=$(BUILD) valgrind -q --leak-check=full \
		--child-silent-after-fork=yes \
		--errors-for-leak-kinds=definite,indirect --error-exitcode=1 \
		$(BUILD)/check_cachew

# The chaos suite at length: CHAOS_SEEDS seeds of each chaos test (workers
# killed, stalled and drained at seeded moments, replies lost), every element
# checked exactly once; one line per run on stderr (make test runs one seed).
CHAOS_SEEDS ?= 24
chaos: $(BUILD)/check_cachew $(BUILD)/cachew $(BUILD)/cachewd
	CWT_CHAOS_SEEDS=$(CHAOS_SEEDS) CK_RUN_SUITE=exact CK_RUN_CASE=chaos \
		CACHEW_BUILD=$(BUILD) $(BUILD)/check_cachew

# libFuzzer builds (clang): build/fuzz/<target>; run one by hand.
fuzz:
	@mkdir -p $(BUILD)/fuzz
	@for f in $(FUZZ_SRC); do \
		n=$$(basename $$f .c); \
		clang -std=c11 -D_GNU_SOURCE -g -O1 -Iinclude \
			-fsanitize=fuzzer,address,undefined $$f $(LIB_SRC) \
			-o $(BUILD)/fuzz/$$n $(DEP_LIBS) || exit 1; \
	done

demo: deps
	@$(MAKE) --no-print-directory $(BUILD)/cachew $(BUILD)/cachewd \
		$(BUILD)/train_loop
	@sh examples/demo.sh $(BUILD)

bench: deps
	@BENCH_DEPS=1 sh .ci/deps.sh
	@$(MAKE) --no-print-directory $(BUILD)/cachew $(BUILD)/cachewd bench-progs
	@bench/run all

# W6: raw nng push/pull and the same transfer through our transports.
bench-progs: $(BUILD)/nng_raw $(BUILD)/transport_bench $(BUILD)/iter_cost \
	$(BUILD)/journal_gen $(BUILD)/resume_cost $(BUILD)/live_iters \
	$(BUILD)/w9_load $(BUILD)/op_bench

$(BUILD)/nng_raw: bench/nng_raw.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ $< -lnng -lpthread

$(BUILD)/transport_bench: bench/transport_bench.c $(BUILD)/libcachew.a
	$(CC) $(ALL_CFLAGS) -o $@ $< $(BUILD)/libcachew.a $(DEP_LIBS)

# The fixed cost of an iterator (docs/performance.md, the embedded default).
$(BUILD)/iter_cost: bench/iter_cost.c $(BUILD)/libcachew.a
	$(CC) $(ALL_CFLAGS) -o $@ $< $(BUILD)/libcachew.a $(DEP_LIBS)

# Many live iterators on one embedded dispatcher (docs/performance.md).
$(BUILD)/live_iters: bench/live_iters.c $(BUILD)/libcachew.a
	$(CC) $(ALL_CFLAGS) -o $@ $< $(BUILD)/libcachew.a $(DEP_LIBS)

# W9: simulated workers and clients against one real dispatcher.
$(BUILD)/w9_load: bench/w9_load.c $(BUILD)/libcachew.a
	$(CC) $(ALL_CFLAGS) -o $@ $< $(BUILD)/libcachew.a $(DEP_LIBS)

# Operators side by side (issue 15's micro-benchmark lines).
$(BUILD)/op_bench: bench/op_bench.c $(BUILD)/libcachew.a
	$(CC) $(ALL_CFLAGS) -o $@ $< $(BUILD)/libcachew.a $(DEP_LIBS)

# W8: what saving and restoring an iterator's position costs.
$(BUILD)/resume_cost: bench/resume_cost.c $(BUILD)/libcachew.a
	$(CC) $(ALL_CFLAGS) -o $@ $< $(BUILD)/libcachew.a $(DEP_LIBS)

# W8: a dispatcher journal of N records, for the recovery time.
$(BUILD)/journal_gen: bench/journal_gen.c $(BUILD)/libcachew.a
	$(CC) $(ALL_CFLAGS) -Wno-conversion -o $@ $< $(BUILD)/libcachew.a $(DEP_LIBS)

deps:
	@sh .ci/deps.sh

# ---- install ------------------------------------------------------------------
# cachew.pc is written at install time, so it always names the PREFIX (and
# LIBDIR, INCDIR) of this install, not of an earlier one.
install: lib $(BUILD)/cachew $(BUILD)/cachewd
	install -d $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCDIR) $(DESTDIR)$(BINDIR)
	install -m 644 $(BUILD)/libcachew.a $(DESTDIR)$(LIBDIR)/
	install -m 755 $(BUILD)/libcachew.so $(DESTDIR)$(LIBDIR)/libcachew.so.$(VERSION)
	ln -sf libcachew.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libcachew.so.$(SOMAJOR)
	ln -sf libcachew.so.$(SOMAJOR) $(DESTDIR)$(LIBDIR)/libcachew.so
	install -m 644 include/cachew.h $(DESTDIR)$(INCDIR)/
	printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$(LIBDIR)' \
		'includedir=$(INCDIR)' '' 'Name: cachew' \
		'Description: ML input-data processing as a library and a service' \
		'Version: $(VERSION)' 'Libs: -L$${libdir} -lcachew' \
		'Libs.private: $(DEP_LIBS)' 'Cflags: -I$${includedir}' \
		> $(DESTDIR)$(LIBDIR)/pkgconfig/cachew.pc
	install -m 755 $(BUILD)/cachew $(BUILD)/cachewd $(DESTDIR)$(BINDIR)/
	install -d $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man3 \
		$(DESTDIR)$(MANDIR)/man8
	install -m 644 man/cachew.1 $(DESTDIR)$(MANDIR)/man1/
	install -m 644 man/cachew.3 $(DESTDIR)$(MANDIR)/man3/
	install -m 644 man/cachewd.8 $(DESTDIR)$(MANDIR)/man8/

uninstall:
	rm -f $(DESTDIR)$(LIBDIR)/libcachew.* $(DESTDIR)$(INCDIR)/cachew.h \
		$(DESTDIR)$(LIBDIR)/pkgconfig/cachew.pc $(DESTDIR)$(BINDIR)/cachew \
		$(DESTDIR)$(BINDIR)/cachewd $(DESTDIR)$(MANDIR)/man1/cachew.1 \
		$(DESTDIR)$(MANDIR)/man3/cachew.3 $(DESTDIR)$(MANDIR)/man8/cachewd.8

clean:
	rm -rf build python/build python/cachew/_cachew*.so python/*.egg-info

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
