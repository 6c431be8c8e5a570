"""Figures of one load level from per-request records, with vLLM's definitions (`vllm bench serve`'s
`calculate_metrics`, which tests/test_serve_metrics.py calls on the same records).

A request record: `ok`, `sent_s` (when it was sent), `token_s` (the arrival time of each output token; the tokens
of one streamed chunk share its time) and `chunk_s` (the arrival time of each chunk that carried tokens), all on one
monotonic clock.

- TTFT = first chunk - sent; E2EL = last chunk - sent;
- TPOT per request = (E2EL - TTFT) / (tokens - 1), for requests of two or more tokens;
- ITL = the gap before each chunk after the first (one per chunk, not per token), pooled over requests;
- output tok/s and request/s over the benchmark's duration (the level's wall time, first send to last request
  done; the span of the records where none is given);
- goodput: completed requests per second that met every SLO given (`ttft`, `tpot`, `e2el`, in ms; a one-token
  request's TPOT counts as 0, as vLLM counts it).

Per figure: mean, std (population), median and the asked percentiles (vLLM's default: 99; linear interpolation,
as numpy's), and b70bench's p90. A p99 from fewer than 100 values is near the maximum: `p99_note` says so.
"""

from __future__ import annotations

import statistics

from b70bench.stats import quantile

P99_MIN_VALUES = 100
DEFAULT_PERCENTILES = (99.0,)
SLO_KEYS = ("ttft", "tpot", "e2el")  # vLLM's --goodput names (ms)


def percentile_word(p: float) -> str:
    """p as vLLM writes it in a metric name: 99 -> "99", 99.9 -> "99.9"."""
    return str(int(p)) if int(p) == p else str(p)


def _summary(name: str, values: list[float], percentiles=DEFAULT_PERCENTILES) -> dict:
    out = {f"{name}_n": len(values)}
    words = [f"p{percentile_word(p)}" for p in percentiles]
    if not values:
        return out | {f"{name}_{k}": None for k in ("mean", "std", "median", "p90", *words)}
    out[f"{name}_mean"] = statistics.fmean(values)
    out[f"{name}_std"] = statistics.pstdev(values)
    out[f"{name}_median"] = quantile(values, 0.5)
    out[f"{name}_p90"] = quantile(values, 0.9)
    for p, word in zip(percentiles, words, strict=True):
        out[f"{name}_{word}"] = quantile(values, p / 100)
    return out


def per_request(rec: dict) -> dict:
    """ttft_s, e2e_s, tpot_s (None below two tokens), itl_s (one gap per chunk) and tokens of one finished request."""
    times = rec.get("token_s") or []
    chunks = rec.get("chunk_s") or sorted(set(times))
    if not rec.get("ok") or not times:
        return {"ttft_s": None, "e2e_s": None, "tpot_s": None, "itl_s": [], "tokens": len(times)}
    ttft, e2e = chunks[0] - rec["sent_s"], chunks[-1] - rec["sent_s"]
    n = len(times)
    return {
        "ttft_s": ttft,
        "e2e_s": e2e,
        "tpot_s": (e2e - ttft) / (n - 1) if n > 1 else None,
        "itl_s": [b - a for a, b in zip(chunks, chunks[1:], strict=False)],
        "tokens": n,
    }


def meets(req: dict, slo: dict) -> bool:
    """Whether one request met every SLO in slo ({"ttft": ms, "tpot": ms, "e2el": ms}; absent keys are not checked).
    A request of one token has no TPOT: it counts as 0, as in vLLM."""
    if req["ttft_s"] is None:
        return False
    got = {"ttft": req["ttft_s"], "tpot": req["tpot_s"] or 0.0, "e2el": req["e2e_s"]}
    return all(got[k] * 1e3 <= slo[k] for k in SLO_KEYS if k in slo)


def level(
    records: list[dict], slo: dict | None = None, duration_s: float | None = None, percentiles=DEFAULT_PERCENTILES
) -> dict:
    """The figures of one load level from its counted request records (warm-up already trimmed); duration_s: the
    level's wall time (vLLM's benchmark duration), else the records' span."""
    slo = {k.removesuffix("_ms"): v for k, v in (slo or {}).items()}  # ttft_ms (b70bench's --slo) is ttft
    unknown = set(slo) - set(SLO_KEYS)
    if unknown:
        raise ValueError(f"unknown SLO keys {sorted(unknown)}: use {', '.join(SLO_KEYS)} (milliseconds)")
    reqs = [per_request(r) for r in records]
    done = [(r, q) for r, q in zip(records, reqs, strict=True) if q["ttft_s"] is not None]
    out = {"requests": len(records), "completed": len(done), "failed": len(records) - len(done)}
    out["retried"] = sum(1 for r in records if r.get("retried"))  # sent again on a new connection (serve.client)
    if done:
        span = duration_s or max(r["token_s"][-1] for r, _ in done) - min(r["sent_s"] for r, _ in done)
        tokens = sum(q["tokens"] for _, q in done)
        out["duration_s"] = span
        out["output_tok_per_s"] = tokens / span if span > 0 else None
        out["request_per_s"] = len(done) / span if span > 0 else None
        good = sum(meets(q, slo or {}) for _, q in done) if slo else None
        out["goodput_request_per_s"] = good / span if slo and span > 0 else None
        out["slo_met_share"] = good / len(done) if slo else None
    for name, values in (
        ("ttft_s", [q["ttft_s"] for _, q in done]),
        ("tpot_s", [q["tpot_s"] for _, q in done if q["tpot_s"] is not None]),
        ("itl_s", [x for _, q in done for x in q["itl_s"]]),
        ("e2e_s", [q["e2e_s"] for _, q in done]),
    ):
        out.update(_summary(name, values, percentiles))
    short = [n for n in ("ttft_s", "tpot_s", "e2e_s") if out.get(f"{n}_n", 0) < P99_MIN_VALUES]
    out["p99_note"] = (
        f"p99 of {', '.join(short)} from fewer than {P99_MIN_VALUES} values: near the maximum" if short else None
    )
    return out
