/*
 * service_user.h - running cachewd as an unprivileged user (--user).
 *
 * A daemon started as root looks its user up first, so that a wrong name
 * fails before anything binds, and switches after what needs root is done:
 * a worker once its listener is bound (a port below 1024 stays possible)
 * and before it takes its first task, a dispatcher before it opens its work
 * dir (its journal and events then belong to the user). The switch sets
 * the user's groups, gid and uid for every thread of the process (glibc
 * applies set*id calls to all threads) and checks that root cannot be
 * regained.
 */
#ifndef CWI_SERVICE_USER_H
#define CWI_SERVICE_USER_H

#include "../core/core.h"

#include <sys/types.h>

typedef struct cwi_service_user {
	char name[64];
	uid_t uid;
	gid_t gid;
} cwi_service_user;

/* Looks `name` up (a user name or a numeric uid). CACHEW_ENOENT for an
 * unknown user, CACHEW_EINVAL when this process is not root (only root can
 * switch users), each naming --user and the user. */
cachew_err cwi_service_user_find(cwi_service_user *u, const char *name);
/* Becomes u: supplementary groups, gid, uid. CACHEW_EIO naming the call
 * that failed; the process must then not go on (it may be half switched). */
cachew_err cwi_service_user_become(const cwi_service_user *u);

#endif /* CWI_SERVICE_USER_H */
