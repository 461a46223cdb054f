/*
 * sources.h - dataset sources: range, literals, files.
 */
#ifndef CWI_SOURCES_H
#define CWI_SOURCES_H

#include "../exec/exec.h"

extern const cwi_dataset_op cwi_op_range;

#endif /* CWI_SOURCES_H */
