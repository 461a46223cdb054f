/*
 * service_user.c - switching cachewd to an unprivileged user
 * (service_user.h).
 */
#include "service_user.h"

#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

cachew_err
cwi_service_user_find(cwi_service_user *u, const char *name)
{
	struct passwd pw, *found = NULL;
	char buf[4096], *end;
	long id;
	int err;

	memset(u, 0, sizeof(*u));
	if (strlen(name) >= sizeof(u->name))
		return cwi_fail(CACHEW_EINVAL, "--user %.32s...: too long a name",
		    name);
	err = getpwnam_r(name, &pw, buf, sizeof(buf), &found);
	if (found == NULL && err == 0) {
		errno = 0;
		id = strtol(name, &end, 10);
		if (name[0] != '\0' && *end == '\0' && errno == 0 && id >= 0)
			err = getpwuid_r((uid_t)id, &pw, buf, sizeof(buf),
			    &found);
	}
	if (found == NULL)
		return cwi_fail(err == 0 ? CACHEW_ENOENT : CACHEW_EIO,
		    "--user %s: %s", name,
		    err == 0 ? "no such user" : strerror(err));
	if (geteuid() != 0)
		return cwi_fail(CACHEW_EINVAL, "--user %s: switching to another "
		    "user needs root, and cachewd runs as uid %ld: start it as "
		    "root, or leave --user out to run as uid %ld", name,
		    (long)geteuid(), (long)geteuid());
	snprintf(u->name, sizeof(u->name), "%s", pw.pw_name);
	u->uid = pw.pw_uid;
	u->gid = pw.pw_gid;
	return CACHEW_OK;
}

cachew_err
cwi_service_user_become(const cwi_service_user *u)
{
	if (initgroups(u->name, u->gid) != 0)
		return cwi_fail(CACHEW_EIO, "--user %s: initgroups: %s", u->name,
		    strerror(errno));
	if (setgid(u->gid) != 0)
		return cwi_fail(CACHEW_EIO, "--user %s: setgid(%ld): %s", u->name,
		    (long)u->gid, strerror(errno));
	if (setuid(u->uid) != 0)
		return cwi_fail(CACHEW_EIO, "--user %s: setuid(%ld): %s", u->name,
		    (long)u->uid, strerror(errno));
	/* A switch that left a saved set-user-ID of 0 could be undone. */
	if (u->uid != 0 && (setuid(0) == 0 || geteuid() == 0))
		return cwi_fail(CACHEW_EIO, "--user %s: root could be regained "
		    "after setuid(%ld)", u->name, (long)u->uid);
	cwi_log(CACHEW_LOG_INFO, "service", "event=user_switched user=%s "
	    "uid=%ld gid=%ld", u->name, (long)u->uid, (long)u->gid);
	return CACHEW_OK;
}
