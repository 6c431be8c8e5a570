"""A vLLM built from source as a target: an editable install is recognised and overlaid from its tree, a Python-only
change is never built, a change to a compiled source is built once per distinct compiled input; the user's tree and
environment stay as they were (patches.installed.source_tree, patches.trees.split, patches.overlay)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import fakedist
import pytest
from gitrepo import git
from test_trees import checksums

from b70bench import patches, revisions
from b70bench.errors import UsageError
from b70bench.patches import trees

ROOT = Path(__file__).resolve().parent.parent
MODEL_REL = "fakevllm/models/minimax_m2.py"
KERNEL_REL = "csrc/tile.cu"
# The tree's "compiler": counts its runs and writes the package's compiled module from csrc/, as an in-place build
# (python setup.py build_ext --inplace) puts vLLM's _C beside its Python files.
BUILD = (
    'echo run >> "$COUNT" && python3 -c "import pathlib; '
    "t = pathlib.Path('csrc/tile.cu').read_text().split()[-1]; "
    "pathlib.Path('fakevllm/_C.py').write_text('TILE = ' + t + chr(10))\""
)


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A vLLM-like git tree: a package (its compiled module built in place, untracked) and csrc/."""
    t = tmp_path / "vllm-src"
    (t / "fakevllm" / "models").mkdir(parents=True)
    (t / "csrc").mkdir()
    (t / "fakevllm" / "__init__.py").write_text('__version__ = "0.20.1"\n')
    (t / "fakevllm" / "models" / "__init__.py").write_text("")
    (t / MODEL_REL).write_text(fakedist.MODEL)
    (t / KERNEL_REL).write_text("tile 64\n")
    (t / ".gitignore").write_text("_C.py\n__pycache__/\n")
    git(t, "init", "-q")
    git(t, "add", ".")
    git(t, "commit", "-qm", "base")
    (t / "fakevllm" / "_C.py").write_text("TILE = 64\n")  # the user's own in-place build
    monkeypatch.setenv("COUNT", str(tmp_path / "count"))
    return t


def editable_site(tmp_path: Path, tree: Path) -> Path:
    """A site-packages where fakevllm is installed editable from tree, as pip records it (direct_url.json)."""
    site = tmp_path / "site"
    info = site / "fakevllm-0.20.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakevllm\nVersion: 0.20.1\n")
    (info / "direct_url.json").write_text(json.dumps({"url": tree.as_uri(), "dir_info": {"editable": True}}))
    (info / "RECORD").write_text("fakevllm-0.20.1.dist-info/METADATA,,\n__editable__.fakevllm.pth,,\n")
    (site / "__editable__.fakevllm.pth").write_text(f"{tree}\n")
    return site


def imported(paths: list[str], code: str, cwd: Path) -> str:
    return subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(paths)),
        capture_output=True,
        text=True,
        cwd=cwd,
        check=True,
    ).stdout.strip()


def series(d: Path, target: str, edits: dict[str, tuple[str, str]], build: str | None = None) -> Path:
    """A one-patch series changing each path old -> new, for target (plus a build line)."""
    import difflib

    body = "".join(
        "".join(difflib.unified_diff(o.splitlines(True), n.splitlines(True), fromfile=f"a/{r}", tofile=f"b/{r}"))
        for r, (o, n) in edits.items()
    )
    header = f"B70bench-Target: {target}\n" + (f"B70bench-Build: {build}\n" if build else "")
    d.mkdir(parents=True)
    (d / "p.patch").write_text(f"a test patch\n\n{header}\n{body}")
    (d / "series").write_text("p.patch\n")
    return d


SLOWER = (fakedist.MODEL, fakedist.MODEL.replace("q + k", "k + q"))
OTHER = (fakedist.MODEL, fakedist.MODEL.replace("renormalize=True", "renormalize=False"))
WIDER = ("tile 64\n", "tile 128\n")


def runs(tmp_path: Path) -> int:
    count = tmp_path / "count"
    return len(count.read_text().splitlines()) if count.exists() else 0


def test_the_rule_for_what_a_build_reads(tree):
    assert trees.overlaid(tree, MODEL_REL) and trees.overlaid(tree, "fakevllm/configs/moe.json")
    assert not trees.overlaid(tree, KERNEL_REL) and not trees.overlaid(tree, "setup.py")
    assert not trees.overlaid(tree, "fakevllm/kernels.cpp") and not trees.overlaid(tree, "tools/gen.py")


def test_python_only_commits_share_one_build_and_compiled_ones_build_once_each(tmp_path, tree):
    """Four series over one tree target: two Python-only, two with the same compiled change and different Python. Two
    builds in all; each side imports its own Python over the copy of its compiled input; the tree is never written."""
    before = checksums(tree)
    target = f"tree:{tree}"
    cache = tmp_path / "cache"
    sides = {
        "py1": {MODEL_REL: SLOWER},
        "py2": {MODEL_REL: OTHER},
        "cu1": {KERNEL_REL: WIDER, MODEL_REL: SLOWER},
        "cu2": {KERNEL_REL: WIDER, MODEL_REL: OTHER},
    }
    got = {}
    for name, edits in sides.items():
        d = series(tmp_path / name, target, edits, BUILD)
        ps = patches.load(d)
        ((command, group),) = trees.by_tree(ps.patches).values()
        if name in ("py2", "cu2"):
            assert trees.planned(str(tree), group, command, cache) == "cached"
        paths = patches.overlay.built_trees(ps.patches, tmp_path / f"mirror-{name}", cache, out=lambda _l: None)
        code = "import fakevllm._C as c, fakevllm.models.minimax_m2 as m, inspect; print(c.TILE, 'k + q' in "
        code += "inspect.getsource(m), 'renormalize=False' in inspect.getsource(m), m.__file__)"
        got[name] = imported(paths, code, tmp_path).split()
        got[name].append(runs(tmp_path))
    assert got["py1"][:3] == ["64", "True", "False"] and got["py2"][:3] == ["64", "False", "True"]
    assert got["cu1"][:3] == ["128", "True", "False"] and got["cu2"][:3] == ["128", "False", "True"]
    assert [got[n][-1] for n in sides] == [1, 1, 2, 2]  # one build per distinct compiled input
    assert all(Path(got[n][3]).is_relative_to(tmp_path / f"mirror-{n}") for n in sides)
    assert checksums(tree) == before


def test_an_editable_install_is_overlaid_from_its_tree_and_never_written(tmp_path, tree):
    before = checksums(tree)
    site = editable_site(tmp_path, tree)
    env = patches.Env(tmp_path / "prefix", (str(site),))
    res = patches.resolve(patches.Target("dist", "fakevllm"), env, "p.patch")
    assert res.editable and res.root == tree.resolve()
    d = series(tmp_path / "py", "dist:fakevllm", {MODEL_REL: SLOWER})
    dest = patches.overlay.build(d, env, tmp_path / "overlay")
    paths = patches.overlay.python_path(dest)
    code = "import fakevllm._C as c, fakevllm.models.minimax_m2 as m, inspect; print(c.TILE, 'k + q' in "
    code += "inspect.getsource(m))"
    # The side imports its patched model file and the user's own compiled module, through the overlay's links.
    assert imported([*paths, str(tree)], code, tmp_path) == "64 True"
    assert imported([str(tree)], code, tmp_path) == "64 False"
    # A compiled source of an editable install needs a build: refused with the target that gets one.
    cu = series(tmp_path / "cu", "dist:fakevllm", {KERNEL_REL: WIDER})
    with pytest.raises(UsageError, match=rf"csrc/tile.cu of fakevllm, an editable install .*tree:{tree}"):
        patches.overlay.build(cu, env, tmp_path / "overlay-cu")
    # Writing into the tree is refused; --overlay-dir writes the overlay instead (what `revisions` asks for).
    with pytest.raises(UsageError, match="never writes into a source tree"):
        patches.apply(patches.load(d), env)
    argv = ["apply", "--dir", str(d), "--site-dir", str(site), "--prefix", str(env.prefix)]
    done = subprocess.run(
        [sys.executable, "-m", "b70bench.patches", *argv, "--overlay-dir", str(tmp_path / "walk-overlay")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert "overlaid in" in done.stdout
    walk_paths = patches.overlay.python_path(tmp_path / "walk-overlay")
    assert imported([*walk_paths, str(tree)], code, tmp_path) == "64 True"
    # An edited tracked file the series changes: refused, and the fix never discards the user's edits.
    (tree / MODEL_REL).write_text(fakedist.MODEL + "# local edit\n")
    with pytest.raises(UsageError, match="not pristine.*commit or stash"):
        patches.overlay.build(d, env, tmp_path / "overlay-dirty")
    (tree / MODEL_REL).write_text(fakedist.MODEL)
    assert checksums(tree) == before


def test_a_walk_of_an_editable_vllm_overlays_each_commit_and_leaves_tree_and_environment(tmp_path, tree):
    site = editable_site(tmp_path, tree)
    repo = tmp_path / "repo"
    git(repo.parent, "init", "-q", "-b", "main", str(repo))
    series(repo / "patches", "dist:fakevllm", {MODEL_REL: SLOWER})
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "slower")
    before_tree, before_site = checksums(tree), checksums(site)
    walker = revisions.Walker(sys.executable, repo, str(site), tmp_path / "prefix")
    seen = []

    def fake_asv(cmd, env):
        paths = env["ASV_PYTHONPATH"].split(os.pathsep)
        code = "import fakevllm.models.minimax_m2 as m, inspect; print('k + q' in inspect.getsource(m), m.__file__)"
        seen.append(imported([*paths, str(tree)], code, tmp_path).split())
        seen.append((tree / MODEL_REL).read_text() == fakedist.MODEL)
        # The adapters pair each side on an overlay of their own: built from the same install, so from the tree.
        code = "from b70bench import patches; e = patches.Env.from_environ(); "
        code += "print(patches.resolve(patches.Target('dist', 'fakevllm'), e, 'p').root)"
        seen.append(
            subprocess.run(
                [sys.executable, "-c", code],
                env=dict(env, PYTHONPATH=str(ROOT)),
                capture_output=True,
                text=True,
                cwd=tmp_path,
            ).stdout.strip()
        )
        return 0

    rows = revisions.walk(walker, revisions.commits_in(repo, "HEAD"), [], run_benchmarks=fake_asv, out=lambda *a: None)
    assert rows[0]["outcome"] == "measured" and rows[0]["restored"], rows
    assert seen[0][0] == "True" and not Path(seen[0][1]).is_relative_to(tree) and seen[1]
    assert seen[2] == str(tree.resolve()), seen
    assert checksums(tree) == before_tree and checksums(site) == before_site
