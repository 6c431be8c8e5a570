"""One run per environment: an flock in the environment's work directory, inheritable by child processes."""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import os
import secrets

from b70bench.errors import UsageError
from b70bench.patches.installed import Env

LOCK_TOKEN_ENV = "B70BENCH_LOCK_TOKEN"  # a parent that holds the lock lets its children through


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


@contextlib.contextmanager
def env_lock(env: Env, what: str):
    """Exclusive use of env for this process (and children given its token); refuses, never waits."""
    env.work.mkdir(parents=True, exist_ok=True)
    f = open(env.work / "lock", "a+")  # noqa: SIM115 (held for the whole block)
    try:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip()
            token = os.environ.get(LOCK_TOKEN_ENV)
            if token and f"token {token}" in holder:
                yield token  # our parent holds it for us
                return
            raise UsageError(
                f"environment {env.prefix} is in use ({holder or 'by another process'}): wait for "
                f"that run to finish; two runs on one environment would measure each other's "
                f"patches"
            ) from None
        token = secrets.token_hex(8)
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} token {token} since {_now()}: {what}\n")
        f.flush()
        try:
            yield token
        finally:
            f.seek(0)
            f.truncate()
            fcntl.flock(f, fcntl.LOCK_UN)
    finally:
        f.close()
