"""Allreduce suite with real rank processes (gloo, 2 ranks on the CPU): sums, faults, no orphans."""

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from b70bench import allreduce
from b70bench.comm.launch import free_port
from b70bench.comm.params import MODES, Params

ROOT = Path(__file__).resolve().parents[1]
FAST = dict(backend="gloo", world_size=2, iters=5, repeat=3, warmup=1, budget_s=0.2, timeout_s=60)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_two_ranks_every_mode_sums_right():
    rows = allreduce.measure(Params(sizes=[6, 8, 6144, 65536 + 2], modes=list(MODES), dtype="fp16", **FAST))
    assert [(r["size_bytes"], r["mode"]) for r in rows] == [(s, m) for s in (6, 8, 6144, 65538) for m in MODES]
    for r in rows:
        assert r["wrong"] == 0, r
        assert r["world_size"] == 2 and r["collective"] == "gloo" and r["path"] == "c10d"
        assert r["time_us"] > 0 and r["latency_us"] > 0 and len(r["samples_s"]) == r["repeat"]
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * 2 * (2 - 1) / 2)
        assert r["algbw_gbps"] == pytest.approx(r["size_bytes"] / (r["time_us"] * 1e-6) / 1e9)
        assert "fingerprint" in r
    inplace = {r["size_bytes"]: r["time_us"] for r in rows if r["mode"] == "in-place"}
    for r in rows:
        assert r["tax_us"] == pytest.approx(r["time_us"] - inplace[r["size_bytes"]])


def test_bf16_fp32_and_raw_skipped_with_reason():
    rows = allreduce.measure(
        Params(sizes=[8], modes=["in-place", "clone"], dtype="bf16", paths=["c10d", "raw"], **FAST)
    )
    assert [r["wrong"] for r in rows if r["path"] == "c10d"] == [0, 0]
    raw = [r for r in rows if r["path"] == "raw"]
    assert len(raw) == 2 and all("CUDA" in r["skipped"] and "time_us" not in r for r in raw)
    rows = allreduce.measure(Params(sizes=[4096], modes=["empty-copy"], dtype="fp32", **{**FAST, "world_size": 3}))
    assert rows[0]["wrong"] == 0 and rows[0]["world_size"] == 3 and rows[0]["count"] == 1024


@pytest.mark.parametrize(
    "fault,words,limit_s",
    [
        ("rank1:die", "rank 1 died (exit code 3)", 30),
        ("rank1:hang", "rank 1 hung", 40),
        ("rank1:hang@teardown", "rank 1 hung at 'teardown'", 40),
    ],
)
def test_fault_names_rank_within_timeout_and_leaves_no_process(monkeypatch, fault, words, limit_s):
    monkeypatch.setenv("B70BENCH_FAULT", fault)
    t0 = time.monotonic()
    with pytest.raises(allreduce.RankFailure) as info:
        allreduce.measure(Params(sizes=[8], modes=["in-place"], **{**FAST, "timeout_s": 12}))
    assert time.monotonic() - t0 < limit_s
    message = str(info.value)
    assert words in message and "\n" not in message
    assert len(info.value.pids) == 2 and all(_gone(pid) for pid in info.value.pids)
    for pid in info.value.pids:  # each rank led its own process group: nothing of it is left either
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)


def test_cli_prints_table_and_json(tmp_path):
    out = tmp_path / "ar.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "b70bench",
            "allreduce",
            "--backend",
            "gloo",
            "--sizes",
            "8",
            "1K",
            "--modes",
            "in-place,clone",
            "--iters",
            "5",
            "--repeat",
            "3",
            "--budget-s",
            "0.2",
            "--json",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "busbw_gbps" in proc.stdout and "tax_us" in proc.stdout
    assert allreduce.records.read_json(out)[1]["mode"] == "clone"


def test_same_entry_point_runs_under_torchrun():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(free_port()),
            "-m",
            "b70bench.allreduce",
            "--backend",
            "gloo",
            "--sizes",
            "8",
            "--modes",
            "in-place",
            "--iters",
            "5",
            "--repeat",
            "3",
            "--budget-s",
            "0.2",
            "--timeout",
            "60",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip().startswith("8 ")]
    assert len(lines) == 1 and lines[0].split()[-1] == "0"  # one table (rank 0's), wrong == 0


def test_asv_adapter_reads_one_launch(monkeypatch):
    sys.path.insert(0, str(ROOT))
    from benchmarks import bench_allreduce

    monkeypatch.setattr(bench_allreduce, "CPU_SIZES", [8])
    monkeypatch.setenv("B70BENCH_BACKEND", "cpu")
    bench = bench_allreduce.Allreduce()
    assert bench.param_names == ["path", "mode", "size"] and bench.params[0] == ["c10d", "raw", "vllm"]
    cache = bench.setup_cache()
    runs = [("c10d", mode) for mode in MODES] + ([("vllm", "in-place")] if importlib.util.find_spec("vllm") else [])
    for path, mode in runs:
        bench.setup(cache, path, mode, 8)
        samples = bench.track_time(cache, path, mode, 8)
        assert samples["number"] == 1 and all(s > 0 for s in samples["samples"])
        assert bench.track_busbw(cache, path, mode, 8) > 0 and bench.track_latency(cache, path, mode, 8) > 0
    for path, mode in (("raw", "in-place"), ("vllm", "clone")):  # each skipped with its reason
        with pytest.raises(NotImplementedError):
            bench.setup(cache, path, mode, 8)
    with pytest.raises(NotImplementedError, match="not measured"):
        bench.setup(cache, "c10d", "clone", 256 * 1024 * 1024)
