/* plugin_example.c - placeholder until the example plugin lands. */
#include "cachew.h"
CACHEW_API cachew_err cachew_plugin_init(unsigned abi);
cachew_err
cachew_plugin_init(unsigned abi)
{
	(void)abi;
	return CACHEW_OK;
}
