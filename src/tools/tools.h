/*
 * tools.h - the command-line front ends that `cachew` dispatches to. They
 * live beside the program mains, outside the library: libcachew holds what
 * a training program links, the tools what an operator types.
 *
 * Also here, in their own headers: the workload simulator (sim.h, `cachew
 * sim`) and the deterministic data generators (gen.h, `cachew gen`), which
 * the test suites link too.
 */
#ifndef CWI_TOOLS_H
#define CWI_TOOLS_H

#include "cachew.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* `cachew cache ls|verify|rm|gc|probe ...`; returns the exit code. */
/* Matches argv[*i] against a flag that takes a value, written
 * "--name VALUE" or "--name=VALUE": 1 with *value set (*i advanced past a
 * separate value), 0 when argv[*i] is not this flag, -1 when the value is
 * missing (flags.c). */
int cwi_flag_value(int argc, char **argv, int *i, const char *name,
    const char **value);
int cwi_cache_cli(int argc, char **argv);
/* `cachew status [URL] [--json]` (argv[0] == "status"); the exit code. */
int cwi_status_cli(int argc, char **argv);
/* `cachew top [URL]` (argv[0] == "top"): the live view; the exit code. */
int cwi_top_cli(int argc, char **argv);
/* `cachew plot EVENTS.jsonl --out DIR` (argv[0] == "plot", plot_cli.c):
 * each job of a dispatcher's events log as a PNG of its workers,
 * throughput, client wait and cache mode over time; the exit code. */
int cwi_plot_cli(int argc, char **argv);

/* One element as `cachew head` prints it (head_print.c): a line
 * "index: value" in numpy's style, or with json one JSON object
 * {"index":N,"components":[{"dtype","shape","value"},...]}. */
void cwi_head_print(FILE *out, const cachew_element *e, uint64_t index,
    bool json);

/* Iterator state files (`cachew run --save-at/--resume`, state_file.c):
 * write replaces path atomically (a temporary file beside it, flushed,
 * renamed); read returns the whole file in a malloc'd *data. Both return
 * 0, or -1 with a reason naming the file in err. */
int cwi_state_file_write(const char *path, const void *data, size_t len,
    char *err, size_t errlen);
int cwi_state_file_read(const char *path, void **data, size_t *len,
    char *err, size_t errlen);

#endif /* CWI_TOOLS_H */
