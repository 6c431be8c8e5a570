"""Source-tree targets as built copies: each (tree revision, patches, build command) built once, outside the tree.

A series that patches a source tree (`B70bench-Target: tree:PATH` with a `B70bench-Build:` command) is never applied
to the user's checkout for a measurement: two sides need two builds alive at once, and a kill mid-build would leave
the checkout half-patched. Instead the tree's HEAD is exported (`git archive`, which reads only git's object store),
the series' patches for that tree are applied to the copy and the build command runs there. The copy is kept in the
build cache under a key of (HEAD, the patches' bytes, the build command), so a commit walked again, or a parent
that was the previous commit, is not rebuilt. A copy is built in a temporary sibling and renamed into place only
after its build succeeded: a kill at any point leaves nothing that is ever imported. A failed build is recorded
beside the copies (command, exit status, last lines of its log) and raised as BuildFailed; the same inputs fail
again without rebuilding until the record is removed (`rm` it, or change the patch or command).

Only a change a build reads is built. A change to a Python source or data file inside one of the tree's importable
packages (a top-level folder holding __init__.py: `vllm/`, not `csrc/` or `setup.py`) reaches the engine without a
build: the copy is built from HEAD plus the series' other files only, and those Python files are placed over it, per
side, in a mirror ahead of it on the path (patches.overlay). The cache key holds the compiled files' patched bytes,
so every commit of a patch set that changes only Python files shares one build, and two commits that leave the
compiled sources alike share theirs. A Python file a build itself reads (vLLM's setup.py reads vllm/envs.py) is
overlaid too: put such a change in a commit that also touches a compiled source, or rebuild by hand.

The build runs in the copy with B70BENCH_SITE=COPY/.b70bench-site in its environment, so a build that installs
(`pip install --no-deps --no-build-isolation --target "$B70BENCH_SITE" .`) installs into the copy, not into the
environment both sides share; an in-place build (`python setup.py build_ext --inplace`, `make`) needs nothing.
A side's engine gets COPY and COPY/.b70bench-site first on PYTHONPATH (python_path). A build that installs into
the shared environment anyway (`pip install -e .`, `pip install .`: new or replaced `*.dist-info`, `*.pth`,
`*.egg-link` in its site-packages) fails as a build, with that said: both sides would import what it installed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import shutil
import subprocess
import sysconfig
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from b70bench import unidiff
from b70bench.errors import UsageError
from b70bench.patches.series import Patch
from b70bench.records import atomic_write_text

SITE_DIR = ".b70bench-site"  # inside a copy: where an installing build puts its packages
SITE_ENV = "B70BENCH_SITE"
DONE = ".b70bench-built.json"  # written last into a copy: the build succeeded
BUILD_TIMEOUT_ENV = "B70BENCH_BUILD_TIMEOUT_S"
BUILD_TIMEOUT_S = 3600.0  # a lab's SYCL kernels build for tens of minutes
LOG_TAIL_LINES = 30
# What an installing build leaves in site-packages (pip's metadata and import hooks; editable installs included).
INSTALL_MARKS = (".dist-info", ".egg-info", ".pth", ".egg-link")


class BuildFailed(UsageError):
    """A tree's build command failed; `record` holds what the website and the walk show."""

    def __init__(self, record: dict):
        self.record = record
        super().__init__(
            f"build of {record['tree']} failed (exit {record['exit']}) in {record['copy']}: {record['command']}; "
            f"{record.get('headline') or '(no output)'} (fix it in a later commit; to build these inputs "
            f"again, remove {record['copy']}.failed.json)"
        )


# Read from a package at run time, never compiled: a change to one inside an importable package needs no build.
RUN_TIME_SUFFIXES = (".py", ".pyi", ".json", ".yaml", ".yml")


def overlaid(tree: Path, rel: str) -> bool:
    """Whether a change to rel (a path inside tree) reaches the engine without a build: a Python source or data file
    inside one of tree's importable packages (a top-level folder with __init__.py), setup.py and csrc/ never."""
    parts = Path(rel).parts
    return len(parts) > 1 and rel.endswith(RUN_TIME_SUFFIXES) and (tree / parts[0] / "__init__.py").is_file()


@dataclass(frozen=True)
class Built:
    tree: str  # the user's tree the copy was made from
    key: str
    path: Path  # the built copy
    python: tuple[tuple[str, bytes | None], ...] = ()  # (path in the tree, patched bytes): placed over the copy

    def python_path(self) -> list[str]:
        return [str(self.path), str(self.path / SITE_DIR)]

    def import_root(self, rel: str) -> Path:
        """The folder of python_path() whose copy of rel's package the engine imports (the first that has it)."""
        top = Path(rel).parts[0]
        return next((Path(p) for p in self.python_path() if (Path(p) / top).is_dir()), self.path)


def cache_dir() -> Path:
    from b70bench.stack.model import cache_root  # the one cache root (B70BENCH_CACHE)

    return cache_root() / "builds"


def _git(tree: Path, *args: str, binary: bool = False):
    # --no-optional-locks: asking must not refresh the tree's index, or the tree's .git would change under a walk.
    done = subprocess.run(["git", "--no-optional-locks", "-C", str(tree), *args], capture_output=True, timeout=300)
    if done.returncode != 0:
        raise UsageError(
            f"source tree {tree}: git {args[0]} failed ({done.stderr.decode(errors='replace').strip()}): "
            f"a tree target must be a git checkout"
        )
    return done.stdout if binary else done.stdout.decode().strip()


def tree_head(tree: Path) -> str:
    """The commit a copy of tree is made from; refused in one line where tracked files differ from it (the copy
    would silently leave those edits out)."""
    if not tree.is_dir():
        raise UsageError(f"source tree {tree} does not exist: clone it there or fix the B70bench-Target line")
    head = _git(tree, "rev-parse", "--verify", "HEAD^{commit}")
    dirty = _git(tree, "status", "--porcelain", "--untracked-files=no")
    if dirty:
        first = dirty.splitlines()[0].split(maxsplit=1)[-1]
        raise UsageError(
            f"source tree {tree} has uncommitted changes ({first}, ...): builds are made from its HEAD, "
            f"so commit or stash them (or put them in a patch of the series)"
        )
    return head


def patched_files(tree: Path, head: str, tree_patches: list[Patch]) -> dict[str, bytes | None]:
    """Every file the patches change -> its bytes at head with the patches applied in order (None: deleted)."""
    files: dict[str, bytes | None] = {}
    for p in tree_patches:
        for fd in p.files:
            if fd.path not in files:
                got = subprocess.run(
                    ["git", "--no-optional-locks", "-C", str(tree), "cat-file", "blob", f"{head}:{fd.path}"],
                    capture_output=True,
                    timeout=120,
                )
                files[fd.path] = got.stdout if got.returncode == 0 else None
            try:
                files[fd.path] = unidiff.apply(files[fd.path], fd)
            except unidiff.PatchError as err:
                raise UsageError(f"patch {p.name} does not apply to the HEAD of {p.target.name}: {err}") from None
    return files


def split(tree: Path, files: dict[str, bytes | None]) -> tuple[dict, dict]:
    """(the files a build reads, the files placed over the built copy), by overlaid()."""
    compiled = {rel: data for rel, data in files.items() if not overlaid(tree, rel)}
    return compiled, {rel: data for rel, data in files.items() if rel not in compiled}


def build_key(head: str, compiled: dict[str, bytes | None], command: str | None) -> str:
    """The build's inputs: the tree's HEAD, the command and the patched bytes of the files a build reads."""
    h = hashlib.sha256(head.encode() + b"\0" + (command or "").encode() + b"\0")
    for rel in sorted(compiled):
        data = compiled[rel]
        h.update(rel.encode() + b"\0" + (b"-" if data is None else hashlib.sha256(data).digest()))
    return h.hexdigest()[:16]


def _export(tree: Path, head: str, dest: Path) -> None:
    data = _git(tree, "archive", "--format=tar", head, binary=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="tar")


def _write(copy: Path, files: dict[str, bytes | None]) -> None:
    for rel, data in files.items():
        path = copy / rel
        if data is None:
            path.unlink(missing_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)


def _run(command: str, cwd: Path, log: Path, timeout_s: float, python: str | None = None) -> int:
    """The build command in its own process group, output to log; the whole group is reaped on a timeout or an
    interrupt, so no compiler outlives the walk. python: the walked environment's interpreter, whose folder comes
    first on PATH (a `python -m pip` or `python setup.py` in the command builds against that environment's torch)."""
    from b70bench.children import kill_group

    env = dict(os.environ, **{SITE_ENV: str(cwd / SITE_DIR)})
    if python:
        env["PATH"] = os.pathsep.join([str(Path(python).absolute().parent), env.get("PATH", "")])
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            command, shell=True, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            out.write(f"\nb70bench: build timed out after {timeout_s:.0f} s ({BUILD_TIMEOUT_ENV})\n".encode())
            return 124
        finally:
            kill_group(proc.pid, grace_s=5.0)
            proc.wait()


def shared_sites() -> list[Path]:
    """The environment both sides share, as a build could install into it: this interpreter's site-packages."""
    paths = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    return [Path(p) for p in sorted(paths) if Path(p).is_dir()]


def installs(sites: list[Path]) -> dict[str, int]:
    """The install marks in sites, with their change times: a build that installs adds or replaces one."""
    out = {}
    for site in sites:
        with contextlib.suppress(OSError), os.scandir(site) as entries:
            for e in entries:
                if e.name.endswith(INSTALL_MARKS):
                    out[os.path.join(site, e.name)] = e.stat(follow_symlinks=False).st_mtime_ns
    return out


def installed_by_build(before: dict[str, int], after: dict[str, int]) -> list[str]:
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


# In an environment b70bench owns (asv's managed ones): the built copies of the applied commit, on its sys.path.
PTH = "b70bench-built-trees.pth"


def put_on_path(paths: list[str], site: Path) -> Path:
    """Make site's interpreter import the built copies (a .pth: paths appended to sys.path at start-up)."""
    pth = site / PTH
    atomic_write_text(pth, "".join(f"{path}\n" for path in paths))
    return pth


def take_off_path(site: Path) -> bool:
    """Undo put_on_path; whether there was anything to undo."""
    try:
        (site / PTH).unlink()
    except FileNotFoundError:
        return False
    return True


def _tail(log: Path) -> list[str]:
    try:
        return log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
    except OSError:
        return []


def headline(tail: list[str]) -> str | None:
    """The line a reader wants first: the first that says error (a compiler's last lines are often a caret), else
    the last."""
    return next((line.strip() for line in tail if "error" in line.lower()), tail[-1].strip() if tail else None)


@contextlib.contextmanager
def _locked(path: Path):
    """One builder per key at a time (two sides, or two walks, needing the same copy wait for the first)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _remove_stale(cache: Path, key: str) -> None:
    """Temporary copies that killed builds left: key's own (the caller holds its lock) and any other key's whose
    lock no one holds (a build in progress keeps its lock, so its copy stays)."""
    for tmp in cache.glob(".*.*"):
        other = tmp.name[1:].split(".", 1)[0]
        if not tmp.is_dir():
            continue
        if other == key:
            shutil.rmtree(tmp, ignore_errors=True)
            continue
        with open(cache / f"{other}.lock", "a") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            shutil.rmtree(tmp, ignore_errors=True)
            fcntl.flock(fh, fcntl.LOCK_UN)


def failed_record(cache: Path, key: str) -> dict | None:
    try:
        return json.loads((cache / f"{key}.failed.json").read_text())
    except (OSError, ValueError):
        return None


def build(
    tree: str,
    tree_patches: list[Patch],
    command: str | None,
    cache: Path | None = None,
    out=print,
    sites: list[Path] | None = None,
    python: str | None = None,
) -> Built:
    """The built copy of tree at its HEAD with the files a build reads patched, and the patched Python files to place
    over it; cached; raises BuildFailed (recorded) or a UsageError (the tree or a patch is unusable: nothing is
    recorded, since nothing was built). `sites`: the shared environment's site-packages, which the build must leave
    alone (default: this interpreter's)."""
    cache = Path(cache) if cache else cache_dir()
    root = Path(tree)
    head = tree_head(root)
    compiled, placed = split(root, patched_files(root, head, tree_patches))
    key = build_key(head, compiled, command)
    final = cache / key
    done = Built(tree, key, final, tuple(sorted(placed.items())))
    with _locked(cache / f"{key}.lock"):
        if (final / DONE).exists():
            return done
        failed = failed_record(cache, key)
        if failed is not None:
            raise BuildFailed(failed)
        _remove_stale(cache, key)
        tmp = Path(tempfile.mkdtemp(dir=cache, prefix=f".{key}."))
        try:
            _export(root, head, tmp)
            _write(tmp, compiled)
            (tmp / SITE_DIR).mkdir(exist_ok=True)
            log = cache / f"{key}.log"
            if command:
                timeout_s = float(os.environ.get(BUILD_TIMEOUT_ENV) or BUILD_TIMEOUT_S)
                out(f"b70bench: building {root} at {head[:12]} + {len(compiled)} changed file(s) it reads: {command}")
                sites = shared_sites() if sites is None else sites
                t0, marks = time.monotonic(), installs(sites)
                rc = _run(command, tmp, log, timeout_s, python)
                wrote = installed_by_build(marks, installs(sites))
                shared = None
                if rc == 0 and wrote:
                    shared = (
                        f"b70bench: error: the build installed into the environment both sides share "
                        f'({", ".join(wrote[:3])}): install into the copy with --target "${SITE_ENV}" or build '
                        f"in place (docs/source-builds.md), and remove what it installed there"
                    )
                    with open(log, "a") as f:
                        f.write(shared + "\n")
                    rc = 3
                if rc != 0:
                    record = {
                        "tree": tree,
                        "head": head,
                        "key": key,
                        "patches": [p.name for p in tree_patches],
                        "built_files": sorted(compiled),
                        "command": command,
                        "exit": rc,
                        "seconds": round(time.monotonic() - t0, 1),
                        "copy": str(final),
                        "log": str(log),
                        "tail": _tail(log),
                    }
                    record["headline"] = shared or headline(record["tail"])
                    atomic_write_text(cache / f"{key}.failed.json", json.dumps(record, indent=2) + "\n")
                    raise BuildFailed(record)
            info = {"tree": tree, "head": head, "built_files": sorted(compiled), "command": command}
            (tmp / DONE).write_text(json.dumps(info, indent=2) + "\n")
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return done


def planned(
    tree: str, tree_patches: list[Patch], command: str | None, cache: Path | None = None, earlier: set | None = None
) -> str:
    """What build() would do, without doing it: "cached", "failed before", "to build", or, where `earlier` (the
    keys an earlier commit of the same plan builds; this one's is added) holds its key, "built by an earlier
    commit" (a walk's plan: commits whose compiled input is the same share one build)."""
    cache = Path(cache) if cache else cache_dir()
    root = Path(tree)
    head = tree_head(root)
    key = build_key(head, split(root, patched_files(root, head, tree_patches))[0], command)
    if (cache / key / DONE).exists():
        return "cached"
    if failed_record(cache, key) is not None:
        return "failed before"
    if earlier is not None:
        if key in earlier:
            return "built by an earlier commit"
        earlier.add(key)
    return "to build"


def by_tree(ps_patches: list[Patch]) -> dict[str, tuple[str | None, list[Patch]]]:
    """A series' tree patches by tree: (the build command, the patches in series order). Any of a tree's patches may
    carry its B70bench-Build line; two different ones are refused."""
    groups: dict[str, tuple[str | None, list[Patch]]] = {}
    for p in ps_patches:
        if p.target.kind != "tree":
            continue
        command, group = groups.get(p.target.name, (None, []))
        if p.target.build and command and p.target.build != command:
            raise UsageError(
                f"patches of {p.target.name} name two build commands ({command!r}, {p.target.build!r}): "
                f"keep one B70bench-Build line per tree"
            )
        groups[p.target.name] = (p.target.build or command, [*group, p])
    return groups
