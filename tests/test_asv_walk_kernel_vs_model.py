"""kernel-vs-model over asv result files: the htile case is flagged, a corrupted file is skipped."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from b70bench import kernel_vs_model as kvm
from b70bench import stats

ROOT = Path(__file__).resolve().parent.parent
COLS = ["result", "params", "version", "started_at", "duration"]


def write_result(d: Path, commit: str, date: int, kernel_s: list[float], decode_s: float) -> None:
    data = {
        "commit_hash": commit,
        "env_name": "existing-py",
        "date": date,
        "version": 2,
        "result_columns": COLS,
        "results": {
            "bench_moe_down.MoeDown.track_time": [kernel_s, [["'reference'", "'triton-htile'"]], "v", 0, 1.0],
            "bench_decode.Decode.track_s_per_output_token": [[decode_s], [["'p128n128b1'"]], "v", 0, 1.0],
            "bench_copy.Copy.track_time": [[1.0], [["64"]], "v", 0, 1.0],
        },
    }
    (d / f"{commit[:8]}-existing-py.json").write_text(json.dumps(data))


def test_htile_commit_is_flagged_and_corrupted_file_skipped(tmp_path, capsys):
    d = tmp_path / "results" / "box"
    d.mkdir(parents=True)
    (d / "machine.json").write_text("{}")
    write_result(d, "a" * 40, 1, [140e-6, 140e-6], 1 / 39.0)  # baseline
    write_result(d, "b" * 40, 2, [140e-6, 44e-6], 1 / 35.1)  # htile: kernel 3x faster, decode slower
    write_result(d, "c" * 40, 3, [140e-6, 44e-6], 1 / 35.0)  # no kernel change
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
    assert (
        abs(htile["model"]["bench_decode.Decode.track_s_per_output_token('p128n128b1')"]["ratio"] - 39.0 / 35.1) < 1e-12
    )
    assert not any("bench_copy" in n for r in rows for n in r["kernels"])  # the anchor is neither
    table = kvm.format_rows(rows)
    assert "KERNEL FASTER, DECODE SLOWER" in table.splitlines()[2]


def test_cli_reads_results_dir(tmp_path):
    d = tmp_path / "results" / "box"
    d.mkdir(parents=True)
    write_result(d, "a" * 40, 1, [1.0, 1.0], 1.0)
    write_result(d, "b" * 40, 2, [1.0, 0.5], 1.2)
    out = subprocess.run(
        [sys.executable, "-m", "b70bench", "kernel-vs-model", "--results", str(tmp_path / "results")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    assert "kernel faster but decode slower at: bbbbbbbbbb" in out.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "b70bench", "kernel-vs-model", "--results", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert missing.returncode == 2 and "holds no asv results" in missing.stderr


SAMPLE_COLS = ["result", "params", "version", "started_at", "duration", "samples"]
DECODE = "bench_decode.Decode.track_s_per_output_token('p128n128b1')"


def write_sampled(d: Path, commit: str, date: int, kernels: dict[str, list[float]], decode: list[float]) -> None:
    """One asv result file with samples: kernels maps "'variant'" or "'path', 'mode', size" to samples."""
    import statistics

    results = {
        "bench_decode.Decode.track_s_per_output_token": [
            [statistics.median(decode)],
            [["'p128n128b1'"]],
            "v",
            0,
            1.0,
            [decode],
        ]
    }
    moe = {k: v for k, v in kernels.items() if "," not in k}
    ar = {k: v for k, v in kernels.items() if "," in k}
    if moe:
        results["bench_moe_down.MoeDown.track_time"] = [
            [statistics.median(v) for v in moe.values()],
            [list(moe), ["1"]],
            "v",
            0,
            1.0,
            list(moe.values()),
        ]
    if ar:  # one path and mode per key, one size: enough for the name matching
        paths = [k.split(",")[0] for k in ar]
        results["bench_allreduce.Allreduce.track_time"] = [
            [statistics.median(v) for v in ar.values()],
            [paths, ["'in-place'"], ["8"]],
            "v",
            0,
            1.0,
            list(ar.values()),
        ]
    data = {
        "commit_hash": commit,
        "env_name": "e",
        "date": date,
        "version": 2,
        "result_columns": SAMPLE_COLS,
        "results": results,
    }
    (d / f"{commit[:8]}-e.json").write_text(json.dumps(data))


def test_with_samples_only_a_real_decode_slowdown_and_a_large_kernel_win_flag(tmp_path):
    """Decode per-start samples with the CPU's 5.5% spread: a 25% slowdown beside a 3x kernel win is
    flagged; a within-noise decode wobble beside the same win is not, nor a 25% slowdown beside a
    kernel 10% faster (below --kernel-effect), nor beside the c10d anchor twice as fast."""
    import random

    rng = random.Random(7)

    def starts(scale: float) -> list[float]:
        return [scale * 1e-3 * rng.lognormvariate(0, 0.055) for _ in range(8)]

    def kernel(t: float) -> list[float]:
        return [t * rng.lognormvariate(0, 0.01) for _ in range(5)]

    d = tmp_path / "results" / "box"
    d.mkdir(parents=True)
    steps = [  # (kernel times, decode scale)
        ({"'vllm'": kernel(3e-3), "'c10d', 'in-place'": kernel(6e-4)}, 1.0),
        ({"'vllm'": kernel(1e-3), "'c10d', 'in-place'": kernel(6e-4)}, 1.25),  # the htile case
        ({"'vllm'": kernel(3e-4), "'c10d', 'in-place'": kernel(6e-4)}, 1.26),  # decode within noise
        ({"'vllm'": kernel(2.7e-4), "'c10d', 'in-place'": kernel(6e-4)}, 1.6),  # kernel only 10% faster
        ({"'vllm'": kernel(2.7e-4), "'c10d', 'in-place'": kernel(3e-4)}, 2.0),  # the anchor moved
    ]
    for i, (kernels, scale) in enumerate(steps):
        write_sampled(d, chr(ord("a") + i) * 40, i + 1, kernels, starts(scale))
    rows = kvm.compare(kvm.read_results(tmp_path / "results"))
    assert [r["flag"] for r in rows] == [False, True, False, False, False], [
        (r["faster_kernels"], r["slower_decode"]) for r in rows
    ]
    assert rows[1]["faster_kernels"] == ["bench_moe_down.MoeDown.track_time('vllm', 1)"]
    lo, hi = rows[1]["model"][DECODE]["interval"]
    assert 1.0 < lo < rows[1]["model"][DECODE]["ratio"] < hi
    assert rows[2]["model"][DECODE]["verdict"] == stats.UNDECIDED  # 8 starts at 5.5%: 5% not ruled out
    assert rows[3]["slower_decode"] == [DECODE] and rows[3]["faster_kernels"] == []
    assert not any("'c10d'" in n for r in rows for n in r["kernels"])  # an anchor: never a kernel figure
    # --exclude '' keeps the anchor: then its halving beside a 25% slowdown is flagged.
    rows = kvm.compare(kvm.read_results(tmp_path / "results"), exclude_re="")
    anchor = "bench_allreduce.Allreduce.track_time('c10d', 'in-place', 8)"
    assert rows[4]["flag"] and rows[4]["faster_kernels"] == [anchor]


def test_a_kernel_back_from_one_slow_reading_is_not_a_win(tmp_path):
    """As in a CI walk: vLLM's 8 B allreduce read 2.3, then 5.0 us in one slow process, then 3.25 us at a
    commit that slowed decode 11%. At --kernel-effect 0.25, against the 5.0 alone that is a 35% kernel win,
    flagged with --kernel-window 1; against the last two readings (the default) it is not, while a MoE kernel
    3x faster than both its earlier readings beside a slower decode still is."""
    import random

    rng = random.Random(3)

    def samples(t: float, n: int, spread: float) -> list[float]:
        return [t * rng.lognormvariate(0, spread) for _ in range(n)]

    d = tmp_path / "results" / "box"
    d.mkdir(parents=True)
    steps = [  # (allreduce us, moe us, decode ms)
        (2.3, 3000, 0.70),
        (5.0, 3000, 0.70),  # the slow process: nothing changed
        (3.25, 3000, 0.78),  # decode slower (real), the allreduce back to its level
        (3.3, 1000, 0.98),  # the htile case
    ]
    for i, (ar, moe, dec) in enumerate(steps):
        kernels = {"'vllm', 'in-place'": samples(ar * 1e-6, 20, 0.02), "'vllm'": samples(moe * 1e-6, 5, 0.01)}
        write_sampled(d, chr(ord("a") + i) * 40, i + 1, kernels, samples(dec * 1e-3, 8, 0.03))
    results = kvm.read_results(tmp_path / "results")
    rows = kvm.compare(results, kernel_effect=0.25)
    assert [r["flag"] for r in rows] == [False, False, False, True], [
        (r["faster_kernels"], r["slower_decode"]) for r in rows
    ]
    assert rows[3]["faster_kernels"] == ["bench_moe_down.MoeDown.track_time('vllm', 1)"]
    ar = "bench_allreduce.Allreduce.track_time('vllm', 'in-place', 8)"
    assert rows[2]["kernels"][ar]["ratio"] < 0.7 and rows[2]["kernels"][ar]["not_faster_than_earlier"]
    assert [r["flag"] for r in kvm.compare(results, kernel_window=1, kernel_effect=0.25)] == [False, False, True, True]
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "b70bench",
            "kernel-vs-model",
            "--results",
            str(tmp_path / "results"),
            "--kernel-window",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert bad.returncode == 2 and "--kernel-window 0" in bad.stderr


def test_one_process_per_commit_swinging_as_the_vm_does_is_not_a_kernel_win(tmp_path):
    """The failed CI walk of 57f1e46: moe-down measured once per commit, in one process each. On the 2-core VM
    fresh processes read the same kernel with a log sd of ~0.13 (a reading 1.45x faster than the one before
    is 2 sds of a two-process ratio); beside the decode slowdown that commit really has, a 25% floor named
    it. At the default floor (1.6x) it is not named, while the htile case (3x, read 0.36-0.47 in CI walks)
    still is, even when its process reads slow."""
    import random

    rng = random.Random(5)

    def one_process(t: float) -> list[float]:  # asv's own +- within one process in the CI walks: 1-12%
        return [t * rng.lognormvariate(0, 0.03) for _ in range(5)]

    d = tmp_path / "results" / "box"
    d.mkdir(parents=True)
    steps = [(6.9e-3, 0.70), (6.9e-3 / 1.45, 0.80), (2.0e-3 * 1.3, 0.95)]  # (moe s, decode ms)
    for i, (moe, dec) in enumerate(steps):
        decode = [dec * 1e-3 * rng.lognormvariate(0, 0.02) for _ in range(8)]
        write_sampled(d, chr(ord("a") + i) * 40, i + 1, {"'vllm'": one_process(moe)}, decode)
    results = kvm.read_results(tmp_path / "results")
    assert [r["flag"] for r in kvm.compare(results)] == [False, False, True]
    assert [r["flag"] for r in kvm.compare(results, kernel_effect=0.25)] == [False, True, True]


def test_decode_measured_against_the_parent_decides_from_its_paired_ratios():
    """As in the walk: 4 blocks a commit. Four unpaired samples a side cannot show any change at 99% (the rank
    test's smallest p is 0.029), but the commit's own ratios to its parent can; a paired no-op is not slower."""
    dec = "bench_decode.Decode.track_s_per_output_token('p128n128b1')"
    ratio = "bench_decode.Decode.track_ratio_to_parent('p128n128b1')"
    moe = "bench_moe_down.MoeDown.track_time('vllm', 1)"
    flat = [1.0e-3, 1.02e-3, 0.98e-3, 1.01e-3]
    results = {
        "a": {"date": 1, "figures": {dec: 1e-3, moe: 3e-3}, "samples": {dec: flat, moe: [3e-3] * 5}},
        "b": {  # a no-op for decode, paired
            "date": 2,
            "figures": {dec: 1e-3, moe: 3e-3},
            "samples": {dec: flat, ratio: [1.01, 0.99, 1.0, 1.02], moe: [3e-3] * 5},
        },
        "c": {  # the htile case: kernel 3x faster, decode 25% slower than its parent in every block
            "date": 3,
            "figures": {dec: 1.25e-3, moe: 1e-3},
            "samples": {dec: [x * 1.25 for x in flat], ratio: [1.22, 1.27, 1.25, 1.24], moe: [1e-3] * 5},
        },
    }
    rows = kvm.compare(results)
    assert [r["flag"] for r in rows] == [False, False, True], rows
    assert rows[1]["model"][dec]["verdict"] != stats.SLOWER and rows[2]["model"][dec]["paired"]
    assert rows[2]["model"][dec]["interval"][0] > 1.15
    no_pairs = {c: {**v, "samples": {k: s for k, s in v["samples"].items() if k != ratio}} for c, v in results.items()}
    assert not kvm.compare(no_pairs)[2]["flag"]  # without the ratios, four samples a side decide nothing


def test_two_paired_blocks_decide_as_the_regressions_page_does():
    """A walk on a slow host fits two blocks into a commit's budget. With each block's standard error recorded,
    kernel-vs-model reads them by the page's own rule (verdicts.paired): a 1.3x decode slowdown is named, as on
    the page, and a paired no-op beside it is not; the t over two block values alone (1 degree of freedom)
    cannot name even that."""
    from b70bench import verdicts

    dec = "bench_decode.Decode.track_s_per_output_token('p128n128b1')"
    ratio = "bench_decode.Decode.track_ratio_to_parent('p128n128b1')"
    se = "bench_decode.Decode.track_ratio_se_to_parent('p128n128b1')"
    moe = "bench_moe_down.MoeDown.track_time('vllm', 1)"
    blocks = {"b": ([1.02, 0.985], [0.012, 0.014]), "c": ([1.31, 1.27], [0.012, 0.014])}
    results = {"a": {"date": 1, "figures": {dec: 1e-3, moe: 3e-3}, "samples": {moe: [3e-3] * 5}}}
    results["b"] = {"date": 2, "figures": {dec: 1e-3, moe: 3e-3}, "samples": {moe: [3e-3] * 5}}
    results["c"] = {"date": 3, "figures": {dec: 1.3e-3, moe: 1e-3}, "samples": {moe: [1e-3] * 5}}
    for c, (ratios, ses) in blocks.items():
        results[c]["samples"].update({ratio: ratios, se: ses})
    rows = kvm.compare(results)
    page = {
        c: verdicts.paired([verdicts.Point(0, c, tuple(r), ses=tuple(s))], kvm.LEVEL, 0.05, 0.03)[0].verdict
        for c, (r, s) in blocks.items()
    }
    assert page == {"b": stats.NO_CHANGE, "c": stats.SLOWER}, page
    assert [r["model"].get(dec, {}).get("verdict") for r in rows[1:]] == [page["b"], page["c"]], rows
    assert [r["flag"] for r in rows] == [False, False, True], rows
    no_ses = {c: {**v, "samples": {k: s for k, s in v["samples"].items() if k != se}} for c, v in results.items()}
    assert kvm.compare(no_ses)[2]["model"][dec]["verdict"] == stats.UNDECIDED
