/*
 * check_sim.c - the simulator. (Placeholder: its tests are being written.)
 */
#include "cwt.h"

Suite *
cwt_sim_suite(void)
{
	return suite_create("sim");
}
