"""b70bench's verdicts on asv's own website: the real `asv publish` over written result files.

Walk: per-start samples at the spread measured on the CPU default (tests/test_verdicts.START_CV), a
history of six commits where the newest is 12% slower (the CI walk's size), plus a throughput figure whose noise asv
would list as regressions. Asserted: regressions.json names the newest commit on the seconds figure
and nothing else on any decode speed figure, while asv's own entries for other figures stay.

Paired: each commit's B/A blocks to its parent (track_ratio_to_parent), one commit 8% slower, no-op
commits, one commit with two blocks only. Asserted: the four words, the page's table, the Atom feed.
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
import xml.etree.ElementTree as ET
from html import escape as html_escape
from pathlib import Path

import pytest
from gitrepo import git
from test_verdicts import START_CV

from b70bench import asv_plugin, stats, verdicts, walklog
from b70bench.paired import placement

COLS = [
    "result",
    "params",
    "version",
    "started_at",
    "duration",
    "stats_ci_99_a",
    "stats_ci_99_b",
    "stats_q_25",
    "stats_q_75",
    "stats_number",
    "stats_repeat",
    "samples",
    "profile",
]
MISSING = object()  # a figure with no entry at all in the result file
# The three forms asv leaves for a figure that was not measured: all must read as "not measured".
UNMEASURED = {"none": None, "nan": math.nan, "missing": MISSING}
SECONDS = "bench_decode.Decode.track_s_per_output_token"
RATE = "bench_decode.Decode.track_output_tok_per_s"
KEY = "bench_decode.Decode.track_aot_key_differs_from_known_good"
RATIO = "bench_decode.Decode.track_ratio_to_parent"
MINUTES = "bench_decode.Decode.track_minutes"
CALLS = "bench_decode.Decode.track_calls"
RATIO_SE = "bench_decode.Decode.track_ratio_se_to_parent"
GATE = "bench_decode.Decode.track_gate"
PLACEMENT = "bench_decode.Decode.track_placement"
KEY_PARENT = "bench_decode.Decode.track_aot_key_differs_from_parent"
STOPPED = "bench_decode.Decode.track_stopped"
UNITS = {
    KEY_PARENT: "changed",
    STOPPED: "stop",
    PLACEMENT: "placement",
    GATE: "fail",
    SECONDS: "seconds",
    RATE: "tok/s",
    KEY: "changed",
    RATIO: "ratio",
    RATIO_SE: "log ratio",
    MINUTES: "minutes",
    CALLS: "calls",
}


def bench(name: str, unit: str) -> dict:
    return {
        "name": name,
        "type": "track",
        "unit": unit,
        "param_names": ["shape"],
        "params": [["'p128n128b1'"]],
        "version": "4",
        "timeout": 60,
        "code": "",
        "setup_cache_key": "bench_decode:1",
    }


def write_result(
    d: Path, commit: str, date: int, samples: list[float], key: float, record_samples=True, extra=None
) -> None:
    """One commit's result file; extra: {figure: (value, samples or None)} beside the decode figures."""
    measured = sorted(x for x in samples if x == x)  # NaN is a start that measured nothing
    med = measured[len(measured) // 2] if measured else math.nan
    samples = [x for x in samples if x == x] if not measured else samples

    def row(value, s):
        if value is MISSING:
            return None
        spread = [None, None] if value is None or value != value else [value * 0.99, value * 1.01]
        return [[value], [["'p128n128b1'"]], "4", date, 1.0, *([v] for v in spread), [value], [value], [1]] + [
            [len(s) if s else 1],
            [s] if s else None,
        ]

    data = {
        "commit_hash": commit,
        "env_name": "virtualenv-py3.11",
        "date": date,
        "version": 2,
        "params": {"machine": "box", "python": "3.11"},
        "python": "3.11",
        "requirements": {},
        "env_vars": {},
        "result_columns": COLS,
        "results": {
            SECONDS: row(med, samples if record_samples else None),
            RATE: row(1 / med, None),
            KEY: row(key, None),
            **{name: row(value, s) for name, (value, s) in (extra or {}).items()},
        },
    }
    data["results"] = {k: v for k, v in data["results"].items() if v is not None}
    (d / f"{commit[:8]}-virtualenv-py3.11.json").write_text(json.dumps(data))


def project(
    tmp_path,
    levels,
    record_samples=True,
    interfered=None,
    paired=None,
    subjects=None,
    settings=None,
    nan_sample=False,
    withheld=None,
    placement=None,
    build_failed=None,
    more=None,
):
    """Six commits, their result files (8 starts each at START_CV around `levels`), `asv publish`.

    paired: {commit index: (B/A blocks to the parent, machine minutes, calls a side[, each block's standard
    error of its log ratio])} written as the track_ratio_to_parent / track_minutes / track_calls (and
    track_ratio_se_to_parent) figures. Returns (html directory, commits)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    commits = []
    for i in range(6):
        (repo / "f").write_text(str(i))
        git(repo, "add", "f")
        git(repo, "commit", "-qm", subjects[i] if subjects else f"c{i}")
        commits.append(git(repo, "rev-parse", "HEAD"))
    results = tmp_path / "results"
    (results / "box").mkdir(parents=True)
    (results / "box" / "machine.json").write_text(json.dumps({"machine": "box", "version": 1}))
    (results / "benchmarks.json").write_text(
        json.dumps({**{name: bench(name, unit) for name, unit in UNITS.items()}, "version": 2})
    )
    rng = random.Random(2)
    for i, c in enumerate(commits):
        samples = [levels[i] * 1e-3 * math.exp(rng.gauss(0, START_CV)) for _ in range(8)]
        if i == interfered:
            samples[3] *= 12  # a start another process took: must not name this commit
        if nan_sample:
            samples[2] = math.nan
        extra = None
        if paired and i in paired:
            blocks, minutes, calls, *ses = paired[i]
            ratio = (stats.geomean(blocks), blocks) if isinstance(blocks, list) else (blocks, None)
            extra = {RATIO: ratio, MINUTES: (minutes, None), CALLS: (calls, None)}
            if ses:
                extra[RATIO_SE] = (stats.geomean(ses[0]), ses[0]) if isinstance(ses[0], list) else (ses[0], None)
            if placement is not None:
                extra[PLACEMENT] = (float(placement), None)
        extra = {**(extra or {}), GATE: (float(i == withheld), None), **(more or {}).get(i, {})}
        if i == withheld:  # the gate failed: bench_decode withholds the speed (NaN, no samples)
            samples = [math.nan] * 8
            extra = {**extra, **{name: (math.nan, None) for name in (RATIO, RATIO_SE, MINUTES, CALLS) if paired}}
        if i == build_failed:  # b70bench revisions measured nothing and recorded the failed build
            record = {"tree": "/src/scaler", "command": "make -C csrc", "exit": 2, "tail": ["work.c:3: error: x"]}
            walklog.append(
                walklog.path(results, "box"), {"commit": c, "outcome": walklog.BUILD_FAILED, "build": record}
            )
            continue
        write_result(results / "box", c, 1_000 + i, samples, 1.0 if i >= 3 else 0.0, record_samples, extra)
    conf = {
        "version": 1,
        "project": "t",
        "project_url": "",
        "repo": str(repo),
        "branches": ["main"],
        "dvcs": "git",
        "environment_type": "virtualenv",
        "results_dir": str(results),
        "html_dir": str(tmp_path / "html"),
        "plugins": [".b70bench.asv_plugin"],
        "b70bench_verdicts": settings or {"level": 0.99, "min_effect": 0.05, "floor": 0.02},
    }
    (tmp_path / "asv.conf.json").write_text(json.dumps(conf))
    publish(tmp_path)
    return tmp_path / "html", commits


ROOT = Path(__file__).resolve().parent.parent


def publish(tmp_path) -> subprocess.CompletedProcess:
    # This checkout's plugin, also where the interpreter has another checkout installed (editable).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run(
        [sys.executable, "-m", "asv", "publish", "--config", str(tmp_path / "asv.conf.json")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def named_commits(html: Path) -> dict[str, set[str]]:
    index = json.loads((html / "index.json").read_text())
    rev_to_hash = {int(k): v for k, v in index["revision_to_hash"].items()}
    named = {}
    for name, _path, _params, _j, _last, _best, jumps in json.loads((html / "regressions.json").read_text())[
        "regressions"
    ]:
        named.setdefault(name.split("(")[0], set()).update(rev_to_hash[bad] for _good, bad, _b, _a in jumps)
    return named


def test_publish_names_the_slow_commit_and_no_other(tmp_path):
    html, commits = project(tmp_path, [1.0] * 5 + [1.12], interfered=2)
    named = named_commits(html)
    assert named.get(SECONDS) == {commits[5]}, named
    assert RATE not in named, named  # asv reads a throughput rise as a regression; b70bench withdraws it
    assert named.get(KEY) == {commits[3]}, named  # asv's own step fit still decides the key figure
    verdicts = json.loads((html / "b70bench-verdicts.json").read_text())
    rows = [(v["commit"], v["verdict"]) for v in verdicts["verdicts"]]
    # Eight starts at 5.5% a commit cannot rule out a 5% change: the no-op commits are undecided, not named.
    assert rows == [(c, stats.UNDECIDED) for c in commits[1:5]] + [(commits[5], stats.SLOWER)], rows
    assert all(v["text"].endswith("still holds a 5% change") for v in verdicts["verdicts"][:4]), verdicts
    assert {v["rule"] for v in verdicts["verdicts"]} == {"unpaired"} and verdicts["floor"] == 0.02
    page = (html / "index.html").read_text()
    assert page.count('id="b70bench-verdicts"') == 1 and "Hodges-Lehmann" in page
    assert "Paired:" not in page  # the note names the rule that decided
    # Publishing again replaces the note rather than stacking a second one.
    publish(tmp_path)
    assert (html / "index.html").read_text().count('id="b70bench-verdicts"') == 1


def test_results_without_samples_keep_asvs_own_verdict(tmp_path):
    """asv run without --record-samples: nothing for b70bench to walk, so asv's step fit is not thrown away."""
    html, commits = project(tmp_path, [1.0, 1.0, 1.0, 2.0, 2.0, 2.0], record_samples=False)
    assert named_commits(html).get(SECONDS) == {commits[3]}
    rows = json.loads((html / "b70bench-verdicts.json").read_text())["verdicts"]
    assert not [v for v in rows if v["benchmark"].startswith(SECONDS)]


NOOP, SLOW = 1.0, 1.08  # paired B/A centres: a commit that changed nothing, an 8% slowdown
BLOCK_SD = 0.02  # log-normal spread of one block's B/A
SUBJECTS = ["baseline", "tidy imports", "rename a helper", "slow down the decode loop", "docs only", "flaky one"]


def test_paired_ratios_decide_each_commit_against_its_parent(tmp_path):
    """Eight blocks a commit: the 8% slowdown is slower, the no-op commits "no change beyond X%", the commit with
    two blocks undecided. The per-start samples are flat (the walk would name nothing): the paired rule decides.

    Eight, not six: at 2% a block and 99%, six blocks put a no-op's bound at 3.3% plus the mean's own error,
    too near 5% for a test; eight at 2.5% plus it."""
    rng = random.Random(4)
    blocks = lambda centre, n, sd=BLOCK_SD: [centre * math.exp(rng.gauss(0, sd)) for _ in range(n)]  # noqa: E731
    paired = {
        1: (blocks(NOOP, 8), 10.0, 40),
        2: (blocks(NOOP, 8), 10.5, 40),
        3: (blocks(SLOW, 8), 21.5, 40),
        4: (blocks(NOOP, 8), 20.0, 40),
        5: (blocks(NOOP, 2, 0.05), 19.5, 40),
    }
    html, commits = project(tmp_path, [1.0] * 6, paired=paired, subjects=SUBJECTS)
    named = named_commits(html)
    assert named.get(SECONDS) == {commits[3]}, named
    # asv would step-fit the paired measurement's own figures (minutes double at commit 3): withdrawn.
    assert not {RATIO, MINUTES, CALLS, RATE} & set(named), named
    index = json.loads((html / "index.json").read_text())
    rev = {h: int(r) for r, h in index["revision_to_hash"].items()}
    entries = json.loads((html / "regressions.json").read_text())["regressions"]
    jumps = [jump for e in entries if e[0].startswith(SECONDS) for jump in e[6]]
    assert [(good, bad) for good, bad, _b, _a in jumps] == [(rev[commits[2]], rev[commits[3]])], jumps
    assert jumps[0][3] / jumps[0][2] > 1.02, jumps  # before and after as the paired ratio reads them

    out = json.loads((html / "b70bench-verdicts.json").read_text())
    rows = {v["commit"]: v for v in out["verdicts"]}
    assert list(rows) == commits[1:], rows  # one verdict per commit with blocks; the baseline has none
    assert all(v["rule"] == "paired" and v["reference"] == [commits[i]] for i, v in enumerate(rows.values()))
    words = [rows[c]["verdict"] for c in commits[1:]]
    assert words == [stats.NO_CHANGE, stats.NO_CHANGE, stats.SLOWER, stats.NO_CHANGE, stats.UNDECIDED], out
    for i in (1, 2, 4):
        v = rows[commits[i]]
        assert v["text"] == f"no change beyond {v['bound'] * 100:.1f}%" and v["bound"] <= 0.04, v  # margin to 5%
        assert v["lo"] < 1 < v["hi"], v
    assert rows[commits[3]]["lo"] > 1.03 and rows[commits[3]]["text"] == "slower", rows[commits[3]]
    last = rows[commits[5]]
    assert last["text"].startswith("undecided: [") and last["text"].endswith("still holds a 5% change"), last
    assert (last["n"], last["calls"], last["minutes"], last["subject"]) == (2, 40, 19.5, "flaky one"), last
    assert rows[commits[3]]["subject"] == "slow down the decode loop" and rows[commits[3]]["min_effect"] == 0.05

    page = (html / "index.html").read_text()
    note = page[page.index('id="b70bench-verdicts"') : page.index("</table></div>")]
    assert "slow down the decode loop" in note and "21.5" in note and "8 blocks, 40 calls a side" in note, note
    assert "Paired:" in note and "Hodges-Lehmann" not in note  # the rule that decided, not the walk's
    assert note.count("<tr>") == 1 + 5  # header and one row per verdict
    assert f"<code>{commits[2][:8]}</code> (parent)" in note
    assert "no change beyond" in note and "undecided: [" in note

    root = ET.parse(html / "b70bench-verdicts.xml").getroot()
    atom = "{http://www.w3.org/2005/Atom}"
    titles = [e.find(f"{atom}title").text for e in root.findall(f"{atom}entry")]
    assert len(titles) == 5, titles  # every verdict, not only the slower one
    assert f"{SECONDS}('p128n128b1') at {commits[3][:8]} slow down the decode loop: slower" in titles, titles
    assert sum("no change beyond" in t for t in titles) == 3 and sum(": undecided: [" in t for t in titles) == 1


def test_blocks_with_their_standard_errors_decide_where_four_block_values_cannot(tmp_path):
    """Four blocks of a 6% slowdown whose rounds gave each a 1.5% standard error: with those recorded
    (track_ratio_se_to_parent) the page names the commit; the same four ratios alone (a t interval with 3
    degrees of freedom at 99%) leave it undecided. The no-op commit with standard errors is not named."""
    ratios = [1.09, 1.035, 1.075, 1.04]
    noop = [1.012, 0.991, 0.984, 1.006]
    ses = [0.015] * 4
    with_se = {3: (ratios, 4.0, 384, ses), 4: (noop, 4.1, 384, ses)}
    (tmp_path / "se").mkdir()
    (tmp_path / "bare").mkdir()
    html, commits = project(tmp_path / "se", [1.0] * 6, paired=with_se, subjects=SUBJECTS)
    rows = {v["commit"]: v for v in json.loads((html / "b70bench-verdicts.json").read_text())["verdicts"]}
    assert rows[commits[3]]["verdict"] == stats.SLOWER and rows[commits[3]]["lo"] > 1.02, rows[commits[3]]
    assert rows[commits[4]]["verdict"] not in (stats.SLOWER, stats.FASTER), rows[commits[4]]
    assert named_commits(html).get(SECONDS) == {commits[3]}
    assert RATIO_SE not in named_commits(html)  # the standard errors are no speed: withdrawn from asv's fit
    bare = {3: (ratios, 4.0, 384), 4: (noop, 4.1, 384)}
    html, commits = project(tmp_path / "bare", [1.0] * 6, paired=bare, subjects=SUBJECTS)
    rows = {v["commit"]: v for v in json.loads((html / "b70bench-verdicts.json").read_text())["verdicts"]}
    assert rows[commits[3]]["verdict"] == stats.UNDECIDED, rows[commits[3]]


@pytest.mark.parametrize(
    "count, figure, prefix",
    [
        ("track_levels", "e2e", ""),
        ("track_calls", "e2e", ""),
        ("track_levels", "tpot", "tpot_"),
        ("track_levels", "ttft", "ttft_"),
    ],
)
def test_serve_latency_is_decided_by_serves_own_paired_ratios(tmp_path, monkeypatch, count, figure, prefix):
    """A walk of the serve suite pairs each commit's level with its parent's (bench_serve.Serve's ratios): each of
    its E2E, TPOT and TTFT figures gets the paired verdict from its own ratios of the same blocks, an 8% slowdown
    named at its commit and the no-op commits not, and the paired figures are withdrawn from asv's fit. Decode's
    figure names are swapped for serve's in this module's result writer. The levels a side are read under their
    name and under the one results before it carry."""
    me = sys.modules[__name__]
    serve = {
        "SECONDS": f"bench_serve.Serve.track_{figure}_s",
        "RATIO": f"bench_serve.Serve.track_{prefix}ratio_to_parent",
        "RATIO_SE": f"bench_serve.Serve.track_{prefix}ratio_se_to_parent",
        "MINUTES": "bench_serve.Serve.track_minutes",
        "CALLS": f"bench_serve.Serve.{count}",
    }
    units = {serve[k]: UNITS[getattr(me, k)] for k in serve}
    for k, v in serve.items():
        monkeypatch.setattr(me, k, v)
    monkeypatch.setattr(me, "UNITS", {**units, RATE: "tok/s", KEY: "changed"})
    rng = random.Random(5)
    blocks = lambda centre: [centre * math.exp(rng.gauss(0, BLOCK_SD)) for _ in range(8)]  # noqa: E731
    paired = {i: (blocks(SLOW if i == 3 else NOOP), 14.0, 24) for i in range(1, 6)}
    html, commits = project(tmp_path, [1.0] * 6, paired=paired, subjects=SUBJECTS)
    named = named_commits(html)
    assert named.get(serve["SECONDS"]) == {commits[3]}, named
    assert not {serve["RATIO"], serve["MINUTES"], serve["CALLS"]} & set(named), named
    rows = {v["commit"]: v for v in json.loads((html / "b70bench-verdicts.json").read_text())["verdicts"]}
    assert all(v["rule"] == "paired" for v in rows.values()), rows
    assert rows[commits[3]]["verdict"] == stats.SLOWER and rows[commits[3]]["calls"] == 24, rows[commits[3]]
    assert [rows[commits[i]]["verdict"] for i in (1, 2, 4, 5)].count(stats.SLOWER) == 0, rows
    assert "8 blocks, 24 levels a side" in (html / "index.html").read_text()


@pytest.mark.parametrize("form", UNMEASURED)
def test_paired_figures_not_measured_leave_the_walk_to_decide(tmp_path, form):
    """`make bench`'s one-commit mode measures no paired figure: asv stores None, NaN or nothing for the ratios,
    their standard errors, minutes and calls. The page publishes, the per-start samples decide (the walk), and no
    row carries a made-up number."""
    gone = UNMEASURED[form]
    paired = {i: (gone, gone, gone, gone) for i in range(6)}
    html, commits = project(tmp_path, [1.0] * 5 + [1.12], paired=paired)
    rows = json.loads((html / "b70bench-verdicts.json").read_text())["verdicts"]
    assert {v["rule"] for v in rows} == {"unpaired"}, rows
    assert [v["commit"] for v in rows if v["verdict"] == stats.SLOWER] == [commits[5]], rows
    assert all(v["minutes"] is None and v["calls"] is None for v in rows), rows
    assert named_commits(html).get(SECONDS) == {commits[5]}
    assert 'id="b70bench-verdicts"' in (html / "index.html").read_text()


@pytest.mark.parametrize("form", UNMEASURED)
def test_minutes_and_calls_not_measured_beside_paired_ratios(tmp_path, form):
    """Blocks recorded but minutes and calls not: the paired verdict stands, its minutes and calls are unknown."""
    gone = UNMEASURED[form]
    rng = random.Random(6)
    paired = {
        i: ([(SLOW if i == 3 else NOOP) * math.exp(rng.gauss(0, BLOCK_SD)) for _ in range(8)], gone, gone)
        for i in range(1, 6)
    }
    html, commits = project(tmp_path, [1.0] * 6, paired=paired)
    rows = {v["commit"]: v for v in json.loads((html / "b70bench-verdicts.json").read_text())["verdicts"]}
    assert rows[commits[3]]["verdict"] == stats.SLOWER and rows[commits[3]]["rule"] == "paired", rows
    assert all(v["minutes"] is None and v["calls"] is None for v in rows.values()), rows
    note = (html / "index.html").read_text()
    assert "nan" not in note[note.index('id="b70bench-verdicts"') :].split("</table>")[0].lower()


def test_a_sample_not_measured_is_dropped_not_averaged(tmp_path):
    """One start of eight stored as NaN in the samples (a start that died): the other seven decide."""
    html, commits = project(tmp_path, [1.0] * 5 + [1.12], nan_sample=True)
    rows = json.loads((html / "b70bench-verdicts.json").read_text())["verdicts"]
    assert [v["commit"] for v in rows if v["verdict"] == stats.SLOWER] == [commits[5]], rows
    assert all(v["ratio"] == v["ratio"] for v in rows), rows  # no NaN ratio


@pytest.mark.parametrize("form", UNMEASURED)
def test_kernel_vs_model_reads_a_figure_not_measured_as_absent(tmp_path, form):
    from b70bench import kernel_vs_model

    gone = UNMEASURED[form]
    d = tmp_path / "results" / "box"
    d.mkdir(parents=True)
    write_result(d, "a" * 40, 1, [1e-3] * 4, 0.0, extra={RATIO: (gone, None), MINUTES: (gone, None)})
    got = kernel_vs_model.read_results(tmp_path / "results")["a" * 40]
    assert set(got["figures"]) == {f"{n}('p128n128b1')" for n in (SECONDS, RATE, KEY)}, got
    assert set(got["samples"]) == {f"{SECONDS}('p128n128b1')"}, got


@pytest.mark.parametrize("rule", ["paired", "unpaired"])
def test_a_commit_whose_gate_failed_says_its_speed_was_withheld(tmp_path, rule):
    """The gate withholds a commit's speed (NaN, no samples): the page says so, not "0 blocks", and the commits
    around it are decided as before."""
    rng = random.Random(7)
    paired = (
        {i: ([NOOP * math.exp(rng.gauss(0, BLOCK_SD)) for _ in range(8)], 4.0, 96) for i in range(1, 6)}
        if rule == "paired"
        else None
    )
    html, commits = project(tmp_path, [1.0] * 6, paired=paired, withheld=4)
    rows = {v["commit"]: v for v in json.loads((html / "b70bench-verdicts.json").read_text())["verdicts"]}
    failed = rows[commits[4]]
    assert failed["verdict"] == stats.UNDECIDED and failed["rule"] == rule, failed
    assert failed["text"] == "undecided: " + verdicts.WITHHELD and "parent's" in verdicts.WITHHELD
    assert all(rows[c]["verdict"] != stats.SLOWER for c in commits[1:] if c in rows), rows
    assert "speed withheld: the gate failed" in (html / "index.html").read_text()


def test_a_walk_whose_only_figures_were_withheld_still_says_why(tmp_path):
    """A walk of one commit whose tokens differ from its parent's: no figure anywhere, the row says withheld."""
    html, commits = project(tmp_path, [1.0] * 6, record_samples=False, withheld=4)
    rows = {v["commit"]: v for v in json.loads((html / "b70bench-verdicts.json").read_text())["verdicts"]}
    assert rows[commits[4]]["text"] == "undecided: " + verdicts.WITHHELD, rows
    assert "speed withheld: the gate failed" in (html / "index.html").read_text()


def test_each_paired_verdict_says_its_placement(tmp_path):
    """A walk whose blocks ran one process at a time (track_placement 1, alternate) says so in every verdict row of
    the page and of b70bench-verdicts.json, beside its blocks, calls and minutes."""
    rng = random.Random(4)
    blocks = lambda centre: [centre * math.exp(rng.gauss(0, BLOCK_SD)) for _ in range(8)]  # noqa: E731
    paired = {i: (blocks(SLOW if i == 3 else NOOP), 30.0, 48) for i in range(1, 6)}
    html, commits = project(tmp_path, [1.0] * 6, paired=paired, placement=placement.CODES[placement.ALTERNATE])
    rows = {v["commit"]: v for v in json.loads((html / "b70bench-verdicts.json").read_text())["verdicts"]}
    assert {v["placement"] for v in rows.values()} == {"alternate"}, rows
    page = (html / "index.html").read_text()
    note = page[page.index('id="b70bench-verdicts"') : page.index("</table></div>")]
    assert note.count("8 blocks (alternate), 48 calls a side") == 5, note


def test_a_failed_build_is_shown_as_such_with_its_command(tmp_path):
    """A commit whose source tree did not build (revisions' walk record): a "failed build" row with the command,
    exit and last line and the machine, never a verdict; the commits around it keep theirs."""
    rng = random.Random(5)
    blocks = lambda centre: [centre * math.exp(rng.gauss(0, BLOCK_SD)) for _ in range(8)]  # noqa: E731
    paired = {i: (blocks(NOOP), 30.0, 48) for i in (1, 2, 4, 5)}
    html, commits = project(tmp_path, [1.0] * 6, paired=paired, build_failed=3)
    data = json.loads((html / "b70bench-verdicts.json").read_text())
    assert [b["commit"] for b in data["failed_builds"]] == [commits[3]]
    assert data["failed_builds"][0]["machine"] == "box" and data["failed_builds"][0]["exit"] == 2
    assert commits[3] not in {v["commit"] for v in data["verdicts"]}
    assert {v["machine"] for v in data["verdicts"]} == {"box"}
    page = (html / "index.html").read_text()
    note = page[page.index('id="b70bench-verdicts"') : page.index("</table></div>")]
    assert "<b>failed build</b>: <code>make -C csrc</code> exit 2; <code>work.c:3: error: x</code>" in note, note
    assert "slower" not in note


def test_each_key_move_is_named_at_its_commit_beside_its_speed_verdict(tmp_path, monkeypatch):
    """Two default-off branches, the second on top of the first (commits 2 and 4): the pin figure reads 1 from
    commit 2 on, so the second move is no step there; against the parent each reads 1 at its own commit and both are
    named, each row carrying the keys and the factor the walk saved. An undecided row shows its blocks and why the
    measurement stopped; a decided one does not."""
    from b70bench import cachekey

    monkeypatch.setenv("B70BENCH_HOME", str(tmp_path / "state"))
    rng = random.Random(5)
    blocks = lambda centre, n, sd=BLOCK_SD: [centre * math.exp(rng.gauss(0, sd)) for _ in range(n)]  # noqa: E731
    paired = {i: (blocks(NOOP, 8), 10.0, 40) for i in (1, 2, 3, 4)}
    paired[5] = ([1.04, 0.97], 19.5, 40)
    moved = {2: "minimax_m2.py changed (MiniMaxM2Model.forward moved from line 480 to 483)", 4: "second branch"}
    more = {i: {KEY_PARENT: (float(i in moved), None), STOPPED: (0.0 if i < 5 else 1.0, None)} for i in range(1, 6)}
    key = lambda i: ("4" if i >= 4 else "2" if i >= 2 else "a") * 64  # noqa: E731

    def save_changes(commits):  # what the walk's adapter saves on the walking machine, per commit and shape
        for i, c in enumerate(commits[1:], start=1):
            change = {"parent_aot_key": key(i - 1), "aot_key": key(i), "aot_differs_from_parent": int(i in moved)}
            change.update(why=[moved[i]] if i in moved else [], factors=["code"] if i in moved else [])
            change["line"] = cachekey.change_line(change)
            rec = {"shape": "p128n128b1", "keys": [], "key_change": change}
            cachekey.save(rec, {"fingerprint": {"commit": c}}, machine="walker")

    html, commits = project(tmp_path, [1.0] * 6, paired=paired, subjects=SUBJECTS, more=more)
    save_changes(commits)
    publish(tmp_path)
    named = named_commits(html)
    assert named.get(KEY_PARENT) == {commits[2], commits[4]}, named
    assert named.get(KEY) == {commits[3]}, named  # the pin figure (1 from commit 3 on here) sees one step only
    assert SECONDS not in named and STOPPED not in named, named
    rows = {v["commit"]: v for v in json.loads((html / "b70bench-verdicts.json").read_text())["verdicts"]}
    assert [rows[c]["key_changed"] for c in commits[1:]] == [0, 1, 0, 1, 0], rows
    assert rows[commits[2]]["key_change"].startswith(f"AOT key {'a' * 12} -> {'2' * 12}: minimax_m2.py changed")
    assert rows[commits[4]]["key_change"] == f"AOT key {'2' * 12} -> {'4' * 12}: second branch"
    assert rows[commits[2]]["key_factors"] == ["code"] and rows[commits[4]]["aot_key"] == "4" * 64
    assert rows[commits[5]]["verdict"] == stats.UNDECIDED and rows[commits[5]]["stopped"] == "budget spent"
    assert rows[commits[5]]["block_ratios"] == [1.04, 0.97]
    page = (html / "index.html").read_text()
    note = page[page.index('id="b70bench-verdicts"') : page.index("</table></div>")]
    assert "compile-cache key against the parent" in note
    assert note.count("<b>moved</b>") == 2 and f"b70bench cache-key pin {commits[4][:8]}" in note, note
    assert "blocks B/A: 1.040 0.970; stopped: budget spent" in note
    assert note.count("blocks B/A:") == 1  # decided rows do not list their blocks


def test_a_declared_numerics_change_has_its_speed_read_and_marked(tmp_path):
    """Commit 3's tokens differ from its parent's and the walk was told that is intended (gate 2): its 8% slowdown
    is named, with the note; commit 4's gate failed undeclared (gate 1): its speed is withheld."""
    rng = random.Random(6)
    blocks = lambda centre, n, sd=BLOCK_SD: [centre * math.exp(rng.gauss(0, sd)) for _ in range(n)]  # noqa: E731
    paired = {1: (blocks(NOOP, 8), 10.0, 40), 2: (blocks(NOOP, 8), 10.0, 40), 3: (blocks(SLOW, 8), 10.0, 40)}
    html, commits = project(tmp_path, [1.0] * 6, paired=paired, withheld=4, more={3: {GATE: (2.0, None)}})
    rows = {v["commit"]: v for v in json.loads((html / "b70bench-verdicts.json").read_text())["verdicts"]}
    assert rows[commits[3]]["verdict"] == stats.SLOWER and rows[commits[3]]["notes"] == [asv_plugin.INTENDED_NOTE]
    assert rows[commits[4]]["text"] == f"{stats.UNDECIDED}: {verdicts.WITHHELD}" and not rows[commits[4]]["notes"]
    assert named_commits(html).get(SECONDS) == {commits[3]}
    page = (html / "index.html").read_text()
    assert html_escape(asv_plugin.INTENDED_NOTE) in page


def test_each_commit_is_decided_against_the_effect_its_walk_measured_at(tmp_path):
    """The page reads track_min_effect beside the blocks: a ~2% slowdown whose interval still holds 2% is undecided
    where the walk measured at 2% (never "no change beyond 4.5%", as at the page's 5%), and the commit measured with
    no effect figure keeps the page's setting."""
    effect = "bench_decode.Decode.track_min_effect"
    UNITS.setdefault(effect, "fraction")
    blocks = [1.015 * math.exp(x) for x in (-0.012, -0.008, -0.004, 0.0, 0.0, 0.004, 0.008, 0.012)]
    paired = {i: (blocks, 5.6, 40) for i in (1, 2)}
    html, commits = project(tmp_path, [1.0] * 6, paired=paired, more={1: {effect: (0.02, None)}})
    rows = {v["commit"]: v for v in json.loads((html / "b70bench-verdicts.json").read_text())["verdicts"]}
    assert rows[commits[1]]["verdict"] == stats.UNDECIDED and rows[commits[1]]["min_effect"] == 0.02
    assert rows[commits[2]]["verdict"] == stats.NO_CHANGE and rows[commits[2]]["min_effect"] == 0.05
