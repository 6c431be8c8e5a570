"""moe-down as a paired target (moe/pair.py, moe/live.py): two kernels, each side its own process, through the
same placements, blocks and stopping rule as decode and serve. On the CPU with torch's int4 op; the Triton variants
on a GPU are the same path (docs/moe-down.md)."""

from __future__ import annotations

import subprocess
import sys

from b70bench import children, stats
from b70bench.moe import pair as moe_pair
from b70bench.paired import stopping


def test_identical_kernels_one_process_at_a_time_are_not_named(tmp_path):
    res = moe_pair.compare_kernels(
        {"A": "torch-int4", "B": "torch-int4"},
        tmp_path,
        stopping.Rule(rounds=6, first_blocks=2, budget_s=60),
        backend="cpu",
        tokens=1,
        placement="alternate",
        number=4,
        repeat=3,
        out=lambda _line: None,
    )
    assert res["placement"] == "alternate" and res["blocks"] >= 2, res["text"]
    assert res["verdict"] not in (stats.SLOWER, stats.FASTER), res["text"]
    assert res["starts"] == 2 * len(res["block_records"]) + 2
    assert all(res["sides"][s]["rel_err"] < 1e-2 for s in "AB"), res["sides"]  # each process checked its kernel
    pids = [x["pid"] for b in res["block_records"] for x in (*b["starts"].values(), *b["warm_starts"].values())]
    assert len(set(pids)) == len(pids) and not any(children.group_members(p) for p in pids)


def test_a_kernel_that_does_not_exist_is_one_line_and_exit_2(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "b70bench",
            "compare",
            "--suite",
            "moe-down",
            "torch-int4",
            "no-such-kernel",
            "--backend",
            "cpu",
            "--budget",
            "2",
            "--rounds",
            "4",
            "--out-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "no block completed" in last and "no-such-kernel" in last, done.stderr
