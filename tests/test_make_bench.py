"""The README's first command, `make bench`, as CI runs it: the Makefile's own recipe (`make bench-run`, what `make
bench` runs once .venv exists), every suite, the same mode and adapters, then `asv publish` and the page in Chromium.

Only the sizes are smaller: two decode starts instead of eight, one serve start at 1 and 4 requests instead of two
at 1, 4 and 16. asv writes under a temp dir through a copy of asv.conf.json (ASV_CONF), so a developer's own
results/ are left alone. A change that breaks `make bench` (a figure the website cannot read, an adapter that
fails, a Makefile line) fails here.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from asv import util

ROOT = Path(__file__).resolve().parent.parent
SUITES = ("bench_allreduce", "bench_copy", "bench_decode", "bench_moe_down", "bench_serve")
SMALLER = {
    "B70BENCH_DECODE_STARTS": "2",
    "B70BENCH_SERVE_STARTS": "1",
    "B70BENCH_SERVE_CONCURRENCY": "1 4",
}

pytestmark = pytest.mark.slow


def conf_copy(work: Path) -> Path:
    """asv.conf.json with its results and website under work; everything else as shipped."""
    conf = util.load_json(str(ROOT / "asv.conf.json"), js_comments=True)
    conf.update(
        repo=str(ROOT),
        benchmark_dir=str(ROOT / "benchmarks"),
        results_dir=str(work / "results"),
        html_dir=str(work / "html"),
    )
    path = work / "asv.conf.json"
    path.write_text(json.dumps(conf, indent=2))
    return path


def measured(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed: apt-get install make")
def test_make_bench_runs_every_suite_and_publishes_the_verdicts(tmp_path):
    conf = conf_copy(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ASV_COMMIT")}
    env.update(SMALLER, PYTHONUNBUFFERED="1")
    done = subprocess.run(
        ["make", "--no-print-directory", "bench-run", f"ASV_CONF={conf}", f"PY={sys.executable}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    (tmp_path / "make-bench.log").write_text(done.stdout + done.stderr)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    assert f"website: {tmp_path / 'html'}/index.html" in done.stdout

    # Every suite measured something on this commit; the decode figure has one sample per start.
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    (result,) = [p for p in (tmp_path / "results").glob(f"*/{head[:8]}-*.json")]
    data = json.loads(result.read_text())
    cols = data["result_columns"]
    rows = {name: dict(zip(cols, row, strict=False)) for name, row in data["results"].items()}
    for suite in SUITES:
        values = [v for name, r in rows.items() if name.startswith(suite + ".") for v in r["result"] or ()]
        assert any(measured(v) for v in values), (suite, {n: r["result"] for n, r in rows.items()})
    decode = rows["bench_decode.Decode.track_s_per_output_token"]
    assert [len(s) for s in decode["samples"]] == [2], decode
    serve = rows["bench_serve.Serve.track_e2e_s"]
    assert [p.strip("'") for p in serve["params"][0]] == ["1", "4"] and all(map(measured, serve["result"])), serve

    # The website: regressions page with b70bench's note and table, its JSON and both feeds.
    html = tmp_path / "html"
    for name in (
        "index.html",
        "regressions.json",
        "regressions.xml",
        "b70bench-verdicts.json",
        "b70bench-verdicts.xml",
    ):
        assert (html / name).is_file(), name
    verdicts = json.loads((html / "b70bench-verdicts.json").read_text())
    assert "track_s_per_output_token" in " ".join(verdicts["decided"])

    sys.path.insert(0, str(ROOT / "scripts"))
    import asv_screenshot

    png = tmp_path / "make-bench-regressions.png"
    dom = asv_screenshot.screenshot(html, png)  # raises if the site's scripts did not load
    assert 'id="b70bench-verdicts"' in dom and "Decode speed verdicts by b70bench" in dom, dom[:3000]
    assert "<th>verdict</th>" in dom, dom[:3000]
    assert png.stat().st_size > 10_000
    keep = os.environ.get("B70BENCH_KEEP_RESULTS")
    if keep:
        dest = Path(keep)
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(png, dest / png.name)
        shutil.copy2(tmp_path / "make-bench.log", dest / "make-bench.log")
