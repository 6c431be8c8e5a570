"""git in a test's throwaway repository, with a fixed identity (CI machines have none configured)."""

from __future__ import annotations

import os
import subprocess


def git(repo, *args: str) -> str:
    env = dict(
        os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t"
    )
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env, timeout=60
    ).stdout.strip()
