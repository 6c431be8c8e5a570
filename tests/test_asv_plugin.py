"""b70bench's verdicts on asv's own website: the real `asv publish` over written result files.

Per-start samples at the spread measured on the CPU default (tests/test_verdicts.START_CV), a
history of six commits where the newest is 12% slower (the CI walk's size), plus a throughput figure whose noise asv
would list as regressions. Asserted: regressions.json names the newest commit on the seconds figure
and nothing else on any decode speed figure, while asv's own entries for other figures stay.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

from gitrepo import git
from test_verdicts import START_CV

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
SECONDS = "bench_decode.Decode.track_s_per_output_token"
RATE = "bench_decode.Decode.track_output_tok_per_s"
KEY = "bench_decode.Decode.track_aot_key_differs_from_pin"


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


def write_result(d: Path, commit: str, date: int, samples: list[float], key: float, record_samples=True) -> None:
    med = sorted(samples)[len(samples) // 2]
    row = lambda value, s: [
        [value],
        [["'p128n128b1'"]],
        "4",
        date,
        1.0,
        [value * 0.99],
        [value * 1.01],  # noqa: E731
        [value],
        [value],
        [1],
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
            RATE: row(128 / (med * 128), None),
            KEY: row(key, None),
        },
    }
    (d / f"{commit[:8]}-virtualenv-py3.11.json").write_text(json.dumps(data))


def project(tmp_path, levels, record_samples=True, interfered=None):
    """Six commits, their result files (8 starts each at START_CV around `levels`), `asv publish`.

    Returns (html directory, commits)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    commits = []
    for i in range(6):
        (repo / "f").write_text(str(i))
        git(repo, "add", "f")
        git(repo, "commit", "-qm", f"c{i}")
        commits.append(git(repo, "rev-parse", "HEAD"))
    results = tmp_path / "results"
    (results / "box").mkdir(parents=True)
    (results / "box" / "machine.json").write_text(json.dumps({"machine": "box", "version": 1}))
    (results / "benchmarks.json").write_text(
        json.dumps(
            {SECONDS: bench(SECONDS, "seconds"), RATE: bench(RATE, "tok/s"), KEY: bench(KEY, "changed"), "version": 2}
        )
    )
    rng = random.Random(2)
    for i, c in enumerate(commits):
        samples = [levels[i] * 1e-3 * math.exp(rng.gauss(0, START_CV)) for _ in range(8)]
        if i == interfered:
            samples[3] *= 12  # a start another process took: must not name this commit
        write_result(results / "box", c, 1_000 + i, samples, 1.0 if i >= 3 else 0.0, record_samples)
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
        "b70bench_verdicts": {"level": 0.99, "min_effect": 0.02},
    }
    (tmp_path / "asv.conf.json").write_text(json.dumps(conf))
    publish(tmp_path)
    return tmp_path / "html", commits


def publish(tmp_path) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "asv", "publish", "--config", str(tmp_path / "asv.conf.json")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
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
    assert rows == [(c, "no difference") for c in commits[1:5]] + [(commits[5], "slower")], rows
    page = (html / "index.html").read_text()
    assert page.count('id="b70bench-verdicts"') == 1 and "Hodges-Lehmann" in page
    # Publishing again replaces the note rather than stacking a second one.
    publish(tmp_path)
    assert (html / "index.html").read_text().count('id="b70bench-verdicts"') == 1


def test_results_without_samples_keep_asvs_own_verdict(tmp_path):
    """asv run without --record-samples: nothing for b70bench to walk, so asv's step fit is not thrown away."""
    html, commits = project(tmp_path, [1.0, 1.0, 1.0, 2.0, 2.0, 2.0], record_samples=False)
    assert named_commits(html).get(SECONDS) == {commits[3]}
    rows = json.loads((html / "b70bench-verdicts.json").read_text())["verdicts"]
    assert not [v for v in rows if v["benchmark"].startswith(SECONDS)]
