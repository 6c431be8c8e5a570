"""kernel-vs-model over asv result files: the htile case is flagged, a corrupted file is skipped."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from b70bench import kernel_vs_model as kvm

ROOT = Path(__file__).resolve().parent.parent
COLS = ["result", "params", "version", "started_at", "duration"]


def write_result(d: Path, commit: str, date: int, kernel_s: list[float], decode_s: float) -> None:
    data = {"commit_hash": commit, "env_name": "existing-py", "date": date, "version": 2, "result_columns": COLS,
            "results": {
                "bench_moe_down.MoeDown.track_time": [kernel_s, [["'reference'", "'triton-htile'"]], "v", 0, 1.0],
                "bench_decode.Decode.track_s_per_output_token": [[decode_s], [["'p128n128b1'"]], "v", 0, 1.0],
                "bench_copy.Copy.track_time": [[1.0], [["64"]], "v", 0, 1.0],
            }}
    (d / f"{commit[:8]}-existing-py.json").write_text(json.dumps(data))


def test_htile_commit_is_flagged_and_corrupted_file_skipped(tmp_path, capsys):
    d = tmp_path / "results" / "box"
    d.mkdir(parents=True)
    (d / "machine.json").write_text("{}")
    write_result(d, "a" * 40, 1, [140e-6, 140e-6], 1 / 39.0)  # baseline
    write_result(d, "b" * 40, 2, [140e-6, 44e-6], 1 / 35.1)   # htile: kernel 3x faster, decode slower
    write_result(d, "c" * 40, 3, [140e-6, 44e-6], 1 / 35.0)   # no kernel change
    (d / "dddddddd-existing-py.json").write_text('{"commit_hash": "dddd", "results": {"bench_')  # half-written
    warnings = []
    results = kvm.read_results(tmp_path / "results", warn=warnings.append)
    assert sorted(results) == ["a" * 40, "b" * 40, "c" * 40]
    assert len(warnings) == 1 and "dddddddd-existing-py.json" in warnings[0]
    rows = kvm.compare(results)
    assert [r["flag"] for r in rows] == [False, True, False]
    htile = rows[1]
    assert htile["faster_kernels"] == ["bench_moe_down.MoeDown.track_time('triton-htile')"]
    ratio = htile["kernels"]["bench_moe_down.MoeDown.track_time('triton-htile')"]["ratio"]
    assert abs(ratio - 44 / 140) < 1e-12
    assert abs(htile["model"]["bench_decode.Decode.track_s_per_output_token('p128n128b1')"]["ratio"]
               - 39.0 / 35.1) < 1e-12
    assert not any("bench_copy" in n for r in rows for n in r["kernels"])  # the anchor is neither
    table = kvm.format_rows(rows)
    assert "KERNEL FASTER, DECODE SLOWER" in table.splitlines()[2]


def test_cli_reads_results_dir(tmp_path):
    d = tmp_path / "results" / "box"
    d.mkdir(parents=True)
    write_result(d, "a" * 40, 1, [1.0, 1.0], 1.0)
    write_result(d, "b" * 40, 2, [1.0, 0.5], 1.2)
    out = subprocess.run([sys.executable, "-m", "b70bench", "kernel-vs-model", "--results", str(tmp_path / "results")],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "kernel faster but decode slower at: bbbbbbbbbb" in out.stdout
    missing = subprocess.run([sys.executable, "-m", "b70bench", "kernel-vs-model", "--results",
                              str(tmp_path / "nope")], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert missing.returncode == 2 and "holds no asv results" in missing.stderr
