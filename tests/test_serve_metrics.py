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


def test_a_level_its_rates_goodput_and_no_p99_below_100_values():
    recs = [req(0.0, [0.1, 0.2, 0.3]), req(0.0, [0.5, 1.5, 2.5]), req(1.0, [], ok=False)]
    lv = metrics.level(recs, {"ttft_ms": 200, "tpot_ms": 200})
    assert lv["completed"] == 2 and lv["failed"] == 1
    assert lv["duration_s"] == pytest.approx(2.5)
    assert lv["output_tok_per_s"] == pytest.approx(6 / 2.5) and lv["request_per_s"] == pytest.approx(2 / 2.5)
    assert lv["goodput_request_per_s"] == pytest.approx(1 / 2.5)  # only the first met both SLOs
    assert lv["slo_met_share"] == pytest.approx(0.5)
    assert lv["itl_s_n"] == 4 and lv["itl_s_median"] == pytest.approx(0.55)
    assert lv["ttft_s_p99"] is None and "fewer than 100" in lv["p99_note"]


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
