/* train_loop.c - placeholder until the C training-loop example lands. */
#include "cachew.h"
int
main(void)
{
	return 0;
}
