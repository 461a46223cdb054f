/*
 * check_main.c - runs every Check suite in one runner, so `make test` ends
 * with Check's one summary line. Fork mode stays on: a crash fails one
 * test, not the run.
 */
#include "cwt.h"
#include "../src/pipeline/pipeline.h"

#include <stdlib.h>

int
main(void)
{
	SRunner *sr;
	int failed;

	/* Tests look operators up directly, not only through the public
	 * calls that give the registry its built-ins. */
	cwi_builtins_ready();
	sr = srunner_create(cwt_core_suite());

	srunner_add_suite(sr, cwt_graph_suite());
	srunner_add_suite(sr, cwt_ops_suite());
	srunner_add_suite(sr, cwt_sources_suite());
	srunner_add_suite(sr, cwt_exec_suite());
	srunner_add_suite(sr, cwt_cli_suite());
	srunner_add_suite(sr, cwt_formats_suite());
	srunner_add_suite(sr, cwt_io_suite());
	srunner_add_suite(sr, cwt_image_suite());
	srunner_add_suite(sr, cwt_cache_suite());
	srunner_add_suite(sr, cwt_cacheops_suite());
	srunner_add_suite(sr, cwt_transport_suite());
	srunner_add_suite(sr, cwt_service_suite());
	srunner_add_suite(sr, cwt_split_suite());
	srunner_add_suite(sr, cwt_cluster_suite());
	srunner_add_suite(sr, cwt_exact_suite());
	srunner_add_suite(sr, cwt_dshuffle_suite());
	srunner_add_suite(sr, cwt_coord_suite());
	srunner_add_suite(sr, cwt_policy_suite());
	srunner_add_suite(sr, cwt_sim_suite());
	srunner_add_suite(sr, cwt_autocache_suite());
	srunner_add_suite(sr, cwt_provision_suite());
	srunner_add_suite(sr, cwt_autoscale_suite());
	srunner_add_suite(sr, cwt_dautocache_suite());
	srunner_add_suite(sr, cwt_journal_suite());
	srunner_add_suite(sr, cwt_snapshot_suite());
	srunner_add_suite(sr, cwt_resume_suite());
	srunner_add_suite(sr, cwt_auth_suite());
	srunner_add_suite(sr, cwt_security_suite());
	srunner_add_suite(sr, cwt_cancel_suite());
	srunner_add_suite(sr, cwt_spec_suite());
	srunner_add_suite(sr, cwt_stream_ops_suite());
	srunner_add_suite(sr, cwt_mixture_suite());
	srunner_add_suite(sr, cwt_usersrc_suite());
	srunner_add_suite(sr, cwt_tfdata_ops_suite());
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
