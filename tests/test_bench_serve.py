"""The serve suite's asv adapter (benchmarks/bench_serve.py): one sample per start and level, gate-withheld starts
give none, and the figures the website decides are the ones asv_plugin lists; walking commits, one sample per
paired block against the parent."""

import math

import pytest

from b70bench.stack import description


def level(c, e2e, tpot, completed=True):
    return {
        "concurrency": c,
        "completed": completed,
        "e2e_s_median": e2e,
        "tpot_s_median": tpot,
        "ttft_s_median": e2e / 4,
        "goodput_request_per_s": 3.0 * c,
        "output_tok_per_s": 100.0 * c,
    }


def test_serve_adapter_samples_per_start_and_level(monkeypatch):
    from b70bench import asv_plugin
    from b70bench.serve import cli as serve_cli
    from benchmarks import bench_serve

    records = [
        {"gate": 0, "startup_s": [53.0], "levels": [level(1, 0.25, 1e-5), level(16, 0.88, 5e-3)]},
        {"gate": 1, "startup_s": [54.0], "levels": [level(1, 9.0, 9.0), level(16, 9.0, 9.0)]},  # tokens differ
        {"gate": 0, "startup_s": [52.0], "levels": [level(1, 0.27, 1e-3), level(16, 0.9, 5e-3, completed=False)]},
    ]
    monkeypatch.setattr(serve_cli, "measure", lambda load, starts, stack, device: records)
    monkeypatch.setattr(bench_serve.Serve, "params", [[1, 16]])
    monkeypatch.setattr(
        bench_serve,
        "stack_and_device",
        lambda: (description.default(), type("D", (), {"backend": "cpu", "count": 1})()),
    )
    monkeypatch.setattr(bench_serve.serve, "unavailable_reason", lambda dev: None)
    b = bench_serve.Serve()
    cache = b.setup_cache()
    assert b.track_e2e_s(cache, 1) == {"samples": [0.25, 0.27], "number": 1}
    assert b.track_e2e_s(cache, 16) == {"samples": [0.88], "number": 1}  # the failed level gives none
    assert b.track_tpot_s(cache, 1)["samples"] == [1e-5, 1e-3]
    assert b.track_startup_s(cache, 1)["samples"] == [53.0, 54.0, 52.0]  # start-up counts whatever the gate
    for name in ("track_e2e_s", "track_tpot_s", "track_ttft_s"):
        assert f"bench_serve.Serve.{name}" in asv_plugin.DECIDED
    with pytest.raises(NotImplementedError):
        b.setup(cache, 4)


def test_walking_commits_pairs_each_level_with_the_parent(monkeypatch, tmp_path):
    """In an asv walk each level is sides.against_parent with serve's pairing: per block, this
    commit's E2E and its B/A; a gate that failed withholds the speed samples but keeps the minutes."""
    from types import SimpleNamespace

    from b70bench import sides
    from b70bench.paired import stopping
    from b70bench.serve import pair as serve_pair
    from benchmarks import bench_serve, common

    cpu = SimpleNamespace(backend="cpu", count=1)
    monkeypatch.delenv("B70BENCH_SERVE_PAIRED", raising=False)
    monkeypatch.delenv("ASV_COMMIT", raising=False)
    assert not common.paired_walk(cpu, "B70BENCH_SERVE_PAIRED")  # `make bench`-like: no commit walked
    monkeypatch.setenv("ASV_COMMIT", "cd" * 20)
    assert common.paired_walk(cpu, "B70BENCH_SERVE_PAIRED")
    assert common.paired_walk(SimpleNamespace(backend="cuda"), "B70BENCH_SERVE_PAIRED")  # alternate there

    seen = []

    def fake_against_parent(repo, commit, env, out_dir, measure, **kw):
        rule = kw["rule"]
        seen.append((commit, out_dir.name, measure, kw["concurrency"], rule.first_blocks, rule.budget_s))
        assert kw["backend"] == "cpu"
        gate = 1 if kw["concurrency"] == 4 else 0
        return {
            "sides": {"B": {"gate": gate}},
            "block_e2e_s": {"A": [0.80, 0.82, 0.81], "B": [0.90, 0.93, 0.91]},
            "block_ratios": [1.12, 1.13, 1.11],
            "block_log_ses": [0.02, 0.03, 0.02],
            "minutes": 13.5,
            "levels_per_side": 24,
            "blocks": 3,
        }

    monkeypatch.setattr(sides, "against_parent", fake_against_parent)
    monkeypatch.setattr(bench_serve.Serve, "params", [[1, 4, 16]])
    monkeypatch.setattr(bench_serve, "stack_and_device", lambda: (description.default(), cpu))
    monkeypatch.setattr(bench_serve.serve, "unavailable_reason", lambda dev: None)
    monkeypatch.setenv("B70BENCH_CACHE", str(tmp_path))
    monkeypatch.setenv("B70BENCH_SERVE_BUDGET_MIN", "12")
    b = bench_serve.Serve()
    cache = b.setup_cache()
    assert [(c, n, m, k, f) for c, n, m, k, f, _ in seen] == [
        ("cd" * 20, f"c{k}", serve_pair.compare_series, k, stopping.WALK_FIRST_BLOCKS) for k in (1, 4, 16)
    ]
    assert {budget for *_, budget in seen} == {720}
    assert b.track_ratio_to_parent(cache, 16) == {"samples": [1.12, 1.13, 1.11], "number": 1}
    assert b.track_ratio_se_to_parent(cache, 16)["samples"] == [0.02, 0.03, 0.02]
    assert b.track_e2e_s(cache, 16)["samples"] == [0.90, 0.93, 0.91]  # this commit's side, per block
    assert b.track_minutes(cache, 16) == 13.5 and b.track_levels(cache, 16) == 24
    assert math.isnan(b.track_ratio_to_parent(cache, 4)) and math.isnan(b.track_e2e_s(cache, 4))  # gate failed
    assert b.track_minutes(cache, 4) == 13.5
    assert math.isnan(b.track_tpot_s(cache, 16)) and math.isnan(b.track_startup_s(cache, 16))  # not paired
    monkeypatch.setenv("B70BENCH_SERVE_BUDGET_MIN", "0.5")
    with pytest.raises(NotImplementedError, match="B70BENCH_SERVE_BUDGET_MIN"):
        b.setup_cache()


def test_a_walk_whose_sides_differ_by_settings_measures_each_commit_against_itself(monkeypatch, tmp_path):
    """`revisions --b-env FLAG=1` sweeps a flag over the commits: each adapter measures the walked commit with B's
    settings against the same commit with A's (sides.against_self, both sides its series), and the page's
    stack parameter names what differs, so those figures never share a series with the walk against parents."""
    from types import SimpleNamespace

    from gitrepo import git

    from b70bench import side_settings, sides
    from b70bench.paired.blocks import Settings
    from benchmarks import common

    repo = tmp_path / "repo"
    (repo / "patches").mkdir(parents=True)
    git(repo.parent, "init", "-q", "-b", "main", str(repo))
    (repo / "patches" / "series").write_text("")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "one")
    commit = git(repo, "rev-parse", "HEAD")
    monkeypatch.setenv("B70BENCH_REPO", str(repo))
    seen = {}

    def measure(dirs, env, out_dir, settings=None, **kw):
        seen.update(dirs={s: (d / "series").read_text() for s, d in dirs.items()}, settings=settings, kw=kw)
        return {"blocks": 2}

    monkeypatch.setattr(sides, "against_parent", lambda *a, **k: pytest.fail("a flag sweep has no parent side"))
    wanted = {"A": Settings(), "B": Settings({"VLLM_FLAG": "1"})}
    monkeypatch.setenv(side_settings.ENV_VAR, side_settings.to_env(wanted))
    res = common.against_base(commit, tmp_path / "out", measure, shape="p16n16")
    assert res["commit"] == res["parent"] == commit and seen["settings"] == wanted
    assert seen["dirs"] == {"A": "", "B": ""} and seen["kw"] == {"shape": "p16n16", "out": common.say}
    monkeypatch.setattr(common, "select_device", lambda *a: SimpleNamespace(backend="cpu"))
    assert common.stack_param().endswith("@cpu (B: VLLM_FLAG=1 against A: -)")
    monkeypatch.delenv(side_settings.ENV_VAR)
    assert common.stack_param().endswith("@cpu")
    monkeypatch.setenv(side_settings.ENV_VAR, "{not json")
    with pytest.raises(NotImplementedError, match="unset it"):
        common.against_base(commit, tmp_path / "out", measure)
