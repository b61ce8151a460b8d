"""A full disk for one child command, set up without `preexec_fn`.

The child's RLIMIT_FSIZE is set by a few lines of Python that then exec the command, with
SIGXFSZ ignored (kept across exec), so a write past the limit fails with EFBIG as a full disk
fails with ENOSPC; a tiny filesystem would need root or FUSE.

Why not subprocess's `preexec_fn`: with it Python forks with fork() instead of vfork(), so
gRPC's fork handlers run in the child (the test process runs gRPC servers and clients), and
the child, before exec, closes the fds it inherited, gRPC's epoll fd among them. gRPC then
aborts the child: exit -6, "Epoll1Poller ... epoll_wait error: Bad file descriptor" (seen once
in a whole `make test`; 1 of 60 and 3 of 120 forks beside a busy in-process gRPC server and
client, 0 of 120 with this launcher, which runs no fork handler).
"""

from __future__ import annotations

import sys

# argv: <limit in bytes> <program> <args...>
_LIMIT_THEN_EXEC = (
    "import os, resource, signal, sys\n"
    "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
    "limit = int(sys.argv[1])\n"
    "resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def file_size_limited(argv: list[str], limit: int) -> list[str]:
    """`argv` (its program an absolute path) run with a `limit`-byte file size limit."""
    return [sys.executable, "-c", _LIMIT_THEN_EXEC, str(limit), *argv]
