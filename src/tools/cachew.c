/* cachew.c - placeholder CLI until the real one lands this session. */
#include "cachew.h"
#include <stdio.h>
int
main(void)
{
	printf("cachew %s\n", cachew_version());
	return 0;
}
