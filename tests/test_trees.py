"""Built copies of source trees (patches.trees): cached per inputs, failures recorded, the user's tree untouched."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import fakedist
import pytest
from gitrepo import git

from b70bench import patches
from b70bench.errors import UsageError
from b70bench.patches import trees

ROOT = Path(__file__).resolve().parent.parent
# Appends one line to COUNT per run, then writes what the built module will read: the build's effect is observable.
BUILD = "echo run >> \"$COUNT\" && python3 -c \"import kernel; open('built.txt', 'w').write(str(kernel.TILE))\""


def checksums(root: Path) -> dict[str, str]:
    """Every file under root (its .git included) -> sha256: the tree byte for byte."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def tree(tmp_path, monkeypatch):
    t = tmp_path / "scaler"
    t.mkdir()
    (t / "kernel.py").write_text("TILE = 64\n")
    git(t, "init", "-q")
    git(t, "add", ".")
    git(t, "commit", "-qm", "base")
    monkeypatch.setenv("COUNT", str(tmp_path / "count"))
    return t


def series(tmp_path: Path, tree: Path, new: str = "TILE = 128\n", build: str = BUILD, name: str = "p") -> Path:
    d = tmp_path / name
    p = fakedist.write_patch(d, "htile.patch", f"tree:{tree}", "TILE = 64\n", new, "kernel.py")
    p.write_text(p.read_text().replace("\n\n---", f"\nB70bench-Build: {build}\n\n---", 1))
    return d


def tree_patches(d: Path):
    ((command, group),) = trees.by_tree(patches.load(d).patches).values()
    return command, group


def runs(tmp_path: Path) -> int:
    count = tmp_path / "count"
    return len(count.read_text().splitlines()) if count.exists() else 0


def test_built_once_from_head_and_the_tree_untouched(tmp_path, tree):
    before = checksums(tree)
    command, group = tree_patches(series(tmp_path, tree))
    cache = tmp_path / "cache"
    built = trees.build(str(tree), group, command, cache, out=lambda _l: None)
    assert (built.path / "kernel.py").read_text() == "TILE = 128\n"
    assert (built.path / "built.txt").read_text() == "128"
    assert trees.build(str(tree), group, command, cache, out=lambda _l: None) == built  # cached: not rebuilt
    assert runs(tmp_path) == 1
    assert trees.planned(str(tree), group, command, cache) == "cached"
    # Another patch is another key, built beside the first.
    command2, group2 = tree_patches(series(tmp_path, tree, "TILE = 256\n", name="q"))
    assert trees.planned(str(tree), group2, command2, cache) == "to build"
    other = trees.build(str(tree), group2, command2, cache, out=lambda _l: None)
    assert other.key != built.key and (other.path / "built.txt").read_text() == "256"
    assert checksums(tree) == before


def test_failed_build_recorded_and_not_rerun(tmp_path, tree):
    command, group = tree_patches(
        series(tmp_path, tree, build='echo run >> "$COUNT"; echo "error: no tile" >&2; exit 3')
    )
    cache = tmp_path / "cache"
    with pytest.raises(trees.BuildFailed) as err:
        trees.build(str(tree), group, command, cache, out=lambda _l: None)
    rec = err.value.record
    assert rec["exit"] == 3 and rec["tail"][-1] == "error: no tile" and rec["command"] == command
    assert "failed (exit 3)" in str(err.value) and "\n" not in str(err.value)
    assert not (cache / rec["key"]).exists()  # nothing half-built where a side would import it
    with pytest.raises(trees.BuildFailed):
        trees.build(str(tree), group, command, cache, out=lambda _l: None)
    assert runs(tmp_path) == 1
    assert trees.planned(str(tree), group, command, cache) == "failed before"


def test_a_build_that_installs_into_the_shared_environment_fails_as_a_build(tmp_path, tree, monkeypatch):
    """`pip install -e .` writes a .pth and a .dist-info into the environment both sides share: both would import
    it, so the build fails with that said; installing into the copy ($B70BENCH_SITE) is fine."""
    site = tmp_path / "site-packages"
    site.mkdir()
    (site / "numpy-2.0.dist-info").mkdir()  # already there: untouched by either build
    monkeypatch.setenv("SHARED", str(site))
    cache = tmp_path / "cache"
    into_copy = 'mkdir -p "$B70BENCH_SITE/scaler-1.dist-info"'
    command, group = tree_patches(series(tmp_path, tree, build=into_copy))
    trees.build(str(tree), group, command, cache, out=lambda _l: None, sites=[site])
    editable = 'touch "$SHARED/__editable__.scaler-1.pth" && mkdir "$SHARED/scaler-1.dist-info"'
    command, group = tree_patches(series(tmp_path, tree, build=editable, name="q"))
    with pytest.raises(trees.BuildFailed) as err:
        trees.build(str(tree), group, command, cache, out=lambda _l: None, sites=[site])
    rec = err.value.record
    assert rec["headline"].startswith("b70bench: error: the build installed into the environment both sides share")
    assert "__editable__.scaler-1.pth" in rec["headline"] and '--target "$B70BENCH_SITE"' in rec["headline"]
    assert not (cache / rec["key"]).exists()


def test_patches_apply_built_trees_puts_the_copy_on_the_path_and_restore_takes_it_off(tmp_path, tree):
    """asv's managed environments: `patches apply --built-trees` builds the tree patch into a copy and puts it on
    the environment's path (a .pth), the tree untouched; `restore` takes it off."""
    before = checksums(tree)
    site = tmp_path / "site"
    site.mkdir()
    d = series(tmp_path, tree)
    env = dict(os.environ, B70BENCH_CACHE=str(tmp_path / "cache"))

    def patches_cli(*args):
        cmd = [sys.executable, "-m", "b70bench.patches", *args, "--site-dir", str(site)]
        return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)

    done = patches_cli("apply", "--dir", str(d), "--built-trees")
    assert done.returncode == 0, done.stderr
    copy = Path((site / trees.PTH).read_text().splitlines()[0])
    assert (copy / "kernel.py").read_text() == "TILE = 128\n" and (copy / "built.txt").read_text() == "128"
    assert checksums(tree) == before
    done = patches_cli("restore")
    assert done.returncode == 0, done.stderr
    assert not (site / trees.PTH).exists() and checksums(tree) == before


def test_refusals_in_one_line(tmp_path, tree):
    command, group = tree_patches(series(tmp_path, tree))
    (tree / "kernel.py").write_text("TILE = 32\n")  # a tracked file edited: the copy would leave it out
    with pytest.raises(UsageError, match="uncommitted changes .*kernel.py.*commit or stash"):
        trees.build(str(tree), group, command, tmp_path / "cache")
    git(tree, "checkout", "--", ".")
    bad = series(tmp_path, tree, name="r")
    fakedist.write_patch(bad, "second.patch", f"tree:{tree}", "x\n", "y\n", "other.py")
    second = bad / "second.patch"
    second.write_text(second.read_text().replace("\n\n---", "\nB70bench-Build: make\n\n---", 1))
    with pytest.raises(UsageError, match="two build commands"):
        trees.by_tree(patches.load(bad).patches)
    stale = series(tmp_path, tree, name="s")
    (stale / "htile.patch").write_text((stale / "htile.patch").read_text().replace("-TILE = 64", "-TILE = 16"))
    command, group = tree_patches(stale)
    with pytest.raises(UsageError, match="does not apply to the HEAD"):
        trees.build(str(tree), group, command, tmp_path / "cache")


def test_kill_9_mid_build_leaves_nothing_imported(tmp_path, tree):
    """A kill -9 of the process that builds: the user's tree as it was, no copy in the cache, the next build
    clears the leftover and succeeds."""
    before = checksums(tree)
    pidfile = tmp_path / "build.pid"
    slow = f"echo $$ > {pidfile}; sleep 60; {BUILD}"
    d = series(tmp_path, tree, build=slow)
    cache = tmp_path / "cache"
    code = textwrap.dedent(f"""
        from b70bench import patches
        from b70bench.patches import trees
        (command, group), = trees.by_tree(patches.load({str(d)!r}).patches).values()
        trees.build({str(tree)!r}, group, command, {str(cache)!r})
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    try:
        deadline = time.monotonic() + 60
        while not pidfile.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pidfile.exists(), "the build never started"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        build_pid = int(pidfile.read_text() or 0) if pidfile.exists() else 0
        if build_pid:  # the build's own session outlives a kill -9 of its parent: end it as a user would
            os.killpg(build_pid, signal.SIGKILL)
    assert checksums(tree) == before
    assert not [p for p in cache.iterdir() if p.is_dir() and not p.name.startswith(".")]
    command, group = tree_patches(series(tmp_path, tree, name="again"))
    built = trees.build(str(tree), group, command, cache, out=lambda _l: None)
    assert (built.path / "built.txt").read_text() == "128"
    assert not list(cache.glob(".*.*"))  # the killed build's temporary copy is gone
    assert checksums(tree) == before


def test_overlay_puts_the_built_copy_first(tmp_path, tree):
    """A side's process imports the tree from its built copy (overlay.python_path), the user's tree never."""
    d = series(tmp_path, tree)
    env = patches.Env(tmp_path / "prefix", (str(tmp_path / "nothing"),))
    dest = patches.overlay.build(d, env, tmp_path / "overlay", builds=tmp_path / "cache")
    paths = patches.overlay.python_path(dest)
    assert paths[-1] == str(dest) and Path(paths[0]).parent == tmp_path / "cache"
    got = subprocess.run(
        [sys.executable, "-c", "import kernel; print(kernel.TILE, kernel.__file__)"],
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(paths)),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=True,
    ).stdout.split()
    assert got[0] == "128" and Path(got[1]).parent == Path(paths[0])
    assert (tree / "kernel.py").read_text() == "TILE = 64\n"
