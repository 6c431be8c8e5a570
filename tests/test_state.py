"""Runtime state outside the package: B70BENCH_HOME, else the asv project's results/, found from any
directory of the project; and global options before the subcommand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import b70bench
from b70bench import state
from tests.test_cachekey import AOT_A, AOT_B

ROOT = Path(__file__).resolve().parent.parent


def _clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("ASV_CONF_DIR", state.HOME_ENV)}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def _project(tmp_path: Path) -> Path:
    proj = tmp_path / "proj"
    (proj / "benchmarks" / "deep").mkdir(parents=True)
    (proj / "asv.conf.json").write_text('{\n  // a comment, as asv allows\n  "results_dir": "out/asv"\n}\n')
    return proj


def test_home_is_the_projects_results_from_any_subdirectory(tmp_path, monkeypatch):
    proj = _project(tmp_path)
    monkeypatch.delenv("ASV_CONF_DIR", raising=False)
    monkeypatch.delenv(state.HOME_ENV, raising=False)
    monkeypatch.chdir(proj / "benchmarks" / "deep")
    assert state.project_dir() == proj.resolve()
    assert state.records_dir() == proj.resolve() / "results" / "records"
    assert state.asv_results_dir() == proj.resolve() / "out" / "asv"
    monkeypatch.setenv("ASV_CONF_DIR", str(tmp_path / "elsewhere"))  # asv running a benchmark says where
    assert state.home() == tmp_path / "elsewhere" / "results"
    monkeypatch.setenv(state.HOME_ENV, str(tmp_path / "home"))
    assert state.pins_path() == tmp_path / "home" / "cache-key-pins.json"


def test_outside_any_project_home_is_the_user_cache_never_the_package(tmp_path, monkeypatch):
    monkeypatch.delenv("ASV_CONF_DIR", raising=False)
    monkeypatch.delenv(state.HOME_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    monkeypatch.chdir(tmp_path)
    assert state.home() == tmp_path / "user" / ".cache" / "b70bench" / "state"
    package = Path(b70bench.__file__).resolve().parent
    assert package not in state.home().parents and package not in state.records_dir().parents


def test_cache_key_explain_finds_records_from_a_subdirectory(tmp_path):
    proj = _project(tmp_path)
    for commit, key in (("1111aaaa", AOT_A), ("2222bbbb", AOT_B)):
        d = proj / "results" / "records" / "box" / commit
        d.mkdir(parents=True)
        (d / "cachekey.json").write_text(
            json.dumps({"records": [{"keys": [{"kind": "aot", "key": key}], "config": "tiny"}]})
        )
    out = subprocess.run(
        [sys.executable, "-m", "b70bench", "cache-key", "explain", "1111", "2222"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=proj / "benchmarks" / "deep",
        env=_clean_env(),
    )
    assert out.returncode == 0, out.stderr
    assert f"aot key: {AOT_A} -> {AOT_B}  (CHANGED)" in out.stdout


def test_global_options_before_the_subcommand(tmp_path):
    run = lambda *a: subprocess.run(
        [sys.executable, "-m", "b70bench", *a],
        capture_output=True,  # noqa: E731
        text=True,
        timeout=300,
        cwd=ROOT,
        env=_clean_env(),
    )
    ok = run("--backend", "cpu", "info", "--json", str(tmp_path / "info.json"))
    assert ok.returncode == 0, ok.stderr
    assert json.loads((tmp_path / "info.json").read_text())["fingerprint"]["backend"] == "cpu"
    wrong = run("--backend", "cpu", "patches", "status")
    assert wrong.returncode == 2
    assert wrong.stderr.strip() == "b70bench patches: error: --backend does not apply to `b70bench patches`: drop it"
    bad = run("--backend", "tpu", "info")
    assert bad.returncode == 2 and "tpu" in bad.stderr
