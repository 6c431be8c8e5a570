"""asv.conf.json as asv itself parses it: the patch set goes on at install and comes off at uninstall."""

from __future__ import annotations

from pathlib import Path

from asv import util

ROOT = Path(__file__).resolve().parent.parent
VARS = {"env_dir": "/e", "build_dir": "/b", "conf_dir": "/c", "build_cache_dir": "/bc", "wheel_file": "/bc/x.whl"}


def commands(key: str):
    conf = util.load_json(str(ROOT / "asv.conf.json"), js_comments=True)
    return [util.interpolate_command(c, VARS) for c in conf[key]]


def test_install_applies_the_commits_patch_set_with_the_working_tree_tool():
    cmd, env, codes, cwd = commands("install_command")[-1]
    assert cmd == [
        *("python", "-m", "b70bench.patches", "apply", "--dir", "/b/patches", "--allow-missing"),
        "--built-trees",  # source-tree patches into built copies, never into the user's tree
    ]
    # asv drops PYTHONPATH but passes ASV_PYTHONPATH through as PYTHONPATH.
    assert env == {"ASV_PYTHONPATH": "/c"} and codes == {0} and cwd == "/e"


def test_uninstall_restores_before_removing_the_project_and_must_succeed():
    (restore, env, codes, _), (pip, _, pip_codes, _) = commands("uninstall_command")
    assert restore == ["python", "-m", "b70bench.patches", "restore"]
    assert env == {"ASV_PYTHONPATH": "/c"} and codes == {0}
    assert pip[:4] == ["python", "-m", "pip", "uninstall"] and pip_codes is None


def test_build_makes_only_the_project_wheel():
    ((cmd, _, _, _),) = commands("build_command")
    assert "--no-deps" in cmd and cmd[-1] == "/b"
