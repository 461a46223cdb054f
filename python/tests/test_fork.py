"""fork(): an inherited iterator fails at once in the child; a child of a
process that used a remote service gets a clear error instead of nng's
abort; the embedded service works in any child."""
import os

import cachew


def in_child(fn):
    """Runs fn in a forked child; returns its exit code (a signal: -sig)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            import signal
            signal.alarm(20)
            code = fn()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def test_an_inherited_iterator_fails_at_once():
    it = cachew.range(1000).map("add", value=1).prefetch(2).iterator()
    assert next(it)[0].tolist() == 1

    def child():
        try:
            next(it)
        except cachew.ClosedError as e:
            return 0 if "inherited through fork()" in str(e) else 3
        return 2

    assert in_child(child) == 0
    assert next(it)[0].tolist() == 2  # the parent reads on


def test_a_child_of_an_nng_user_gets_a_clear_error(cluster):
    ds = cachew.range(50).map("add", value=1)
    assert len(list(ds.iterator(service=cluster.url))) == 50

    def child():
        try:
            list(ds.iterator(service=cluster.url))
            return 2
        except cachew.NotSupportedError as e:
            if "forked" not in str(e) or cluster.url not in str(e):
                return 3
        # In-process still works here.
        return 0 if len(list(ds.iterator(service="embedded"))) == 50 else 4

    assert in_child(child) == 0
    assert len(list(ds.iterator(service=cluster.url))) == 50
