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

/* `cachew cache ls|verify|rm|gc|probe ...`; returns the exit code. */
int cwi_cache_cli(int argc, char **argv);
/* `cachew status [URL] [--json]` (argv[0] == "status"); the exit code. */
int cwi_status_cli(int argc, char **argv);

#endif /* CWI_TOOLS_H */
