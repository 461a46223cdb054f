/*
 * nng_transport.c - the network transport: tcp://host:port,
 * tls+tcp://host:port and ipc:///path. nng 1.5 provides the byte streams (nng_stream dialers and
 * listeners: address parsing, connect, accept, readv/writev on its I/O
 * threads); request/reply is implemented here, on the wire format of
 * nng's req0/rep0 protocols (docs/protocol.md, "Transport framing"), so
 * plain nng req and rep sockets interoperate with it.
 *
 * Why not nng's req/rep sockets: nng 1.5 sends only a contiguous nng_msg
 * that it allocated and zeroed, and receives only into one it zeroed. A
 * worker then copies every payload into a zeroed message, and W6 (1 MiB
 * elements) lost a third of raw nng's throughput to it
 * (docs/performance.md, W6). Here a message is sent with writev straight
 * from the element buffers (cwi_element_encode_gather) and received into
 * an unzeroed buffer whose payloads the received tensors view.
 *
 * Structure (nng_int.h): as nng keeps its framing apart from its
 * protocols, the bytes of the wire (nng_frame.c: pure functions, fuzzed
 * by test/fuzz/fuzz_nng_frame.c) are apart from the links that move them
 * (nng_link.c), and the links from their owners: the server's listeners
 * (nng_listen.c) and the client's connections (nng_dial.c); TLS
 * (nng_tls.c) only configures nng's streams and names their refusals,
 * below the same framing. Each file
 * says what it owns and its part of the lock order: cq->mtx
 * (transport.c), then the listener or connection mutex, then a link's
 * mutex; the janitor's mutex is a leaf. Requests are completed and the
 * handler and owner callbacks run with none of these held.
 *
 * Process-wide: the first listen or dial tunes glibc's malloc only where
 * the user asked (cwi_heap_tune(false): CACHEW_MALLOPT=1; cachewd tunes
 * its own at start), and watches for fork() (cwi_nng_fork_check).
 */
#include "nng_int.h"

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

cachew_err
cwi_nng_err(int rv, const char *url, const char *what)
{
	switch (rv) {
	case NNG_ENOMEM:
		return cwi_fail(CACHEW_ENOMEM, "%s: %s: out of memory", url,
		    what);
	case NNG_EADDRINUSE:
		return cwi_fail(CACHEW_EEXIST, "%s: address in use", url);
	case NNG_EADDRINVAL:
	case NNG_EINVAL:
	case NNG_ENOTSUP:
		return cwi_fail(CACHEW_EINVAL, "%s: %s: invalid address (%s)",
		    url, what, nng_strerror(rv));
	case NNG_ECONNREFUSED:
	case NNG_ENOENT:
		return cwi_fail(CACHEW_EIO, "%s: connection refused", url);
	case NNG_ETIMEDOUT:
		return cwi_fail(CACHEW_ETIMEDOUT, "%s: %s timed out", url, what);
	case NNG_ECLOSED:
		return cwi_fail(CACHEW_ECLOSED, "%s: closed", url);
	case NNG_EPEERAUTH:
	case NNG_ECRYPTO:
		return cwi_fail(CACHEW_EAUTH, "%s: %s: TLS: %s", url, what,
		    nng_strerror(rv));
	default:
		return cwi_fail(CACHEW_EIO, "%s: %s: %s", url, what,
		    nng_strerror(rv));
	}
}

/*
 * fork(). nng 1.5 initialises itself on first use and then registers a
 * pthread_atfork child handler after which every nng call in the child
 * panics ("nng is not fork-reentrant safe": abort()); it cannot be
 * re-initialised, being state inside libnng. A DataLoader's forked workers
 * are such children once their parent read from a remote service. So the
 * first listen or dial registers our own child handler, before nng's
 * initialisation, and in a child forked after it no listen or dial reaches
 * nng: they fail with CACHEW_ENOTSUP saying why and what works instead. A
 * process that never used nng forks freely and its children use it. The
 * inproc transport (the embedded service) never touches nng.
 */
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
static pid_t nng_owner_pid; /* the process that used nng; 0: none yet */
static volatile sig_atomic_t nng_forked;

static void
fork_child(void)
{
	nng_forked = 1;
}

static void
fork_watch_once(void)
{
	nng_owner_pid = getpid();
	(void)pthread_atfork(NULL, NULL, fork_child);
}

cachew_err
cwi_nng_fork_check(const char *url)
{
	pthread_once(&fork_once, fork_watch_once);
	if (!nng_forked)
		return CACHEW_OK;
	return cwi_fail(CACHEW_ENOTSUP, "%s: this process (pid %ld) was forked "
	    "from one that had used nng (pid %ld: a tcp://, ipc:// or "
	    "tls+tcp:// service), and nng cannot run in a forked child; "
	    "connect to the service only after fork() (or use the spawn or "
	    "forkserver start method); the embedded service works here",
	    url, (long)getpid(), (long)nng_owner_pid);
}

static const char *const nt_schemes[] = {"tcp", "tls+tcp", "ipc", NULL};

const cwi_transport cwi_transport_nng = {
    .name = "nng",
    .schemes = nt_schemes,
    .listen = cwi_nng_listen,
    .dial = cwi_nng_dial,
};
