"""Figures of one load level from per-request records, with vLLM's definitions (`vllm bench serve`).

A request record: `ok`, `sent_s` (when it was sent), `token_s` (the arrival time of each output token, as the
stream delivered it; several tokens in one chunk share a time), all on one monotonic clock.

- TTFT = first token - sent; E2E = last token - sent;
- TPOT per request = (E2E - TTFT) / (tokens - 1), for requests of two or more tokens;
- ITL = every gap between consecutive tokens of a request, pooled over requests;
- output tok/s and request/s over the level's span (first send to last token of the counted requests);
- goodput: counted requests per second that met every SLO given (TTFT and/or TPOT, in ms).

Percentiles: median and p90 always; p99 only from 100 values on (below that a p99 is the maximum, and says
nothing more), otherwise None with the reason in `p99_note`.
"""

from __future__ import annotations

from b70bench.stats import quantile

P99_MIN_VALUES = 100


def _summary(name: str, values: list[float]) -> dict:
    out = {f"{name}_n": len(values)}
    if not values:
        return out | {f"{name}_median": None, f"{name}_p90": None, f"{name}_p99": None}
    out[f"{name}_median"] = quantile(values, 0.5)
    out[f"{name}_p90"] = quantile(values, 0.9)
    out[f"{name}_p99"] = quantile(values, 0.99) if len(values) >= P99_MIN_VALUES else None
    return out


def per_request(rec: dict) -> dict:
    """ttft_s, e2e_s, tpot_s (None below two tokens), itl_s (list) and tokens of one finished request."""
    times = rec.get("token_s") or []
    if not rec.get("ok") or not times:
        return {"ttft_s": None, "e2e_s": None, "tpot_s": None, "itl_s": [], "tokens": len(times)}
    ttft, e2e = times[0] - rec["sent_s"], times[-1] - rec["sent_s"]
    n = len(times)
    return {
        "ttft_s": ttft,
        "e2e_s": e2e,
        "tpot_s": (e2e - ttft) / (n - 1) if n > 1 else None,
        "itl_s": [b - a for a, b in zip(times, times[1:], strict=False)],
        "tokens": n,
    }


def meets(req: dict, slo: dict) -> bool:
    """Whether one request met every SLO in slo ({"ttft_ms": .., "tpot_ms": ..}; absent keys are not checked)."""
    if req["ttft_s"] is None:
        return False
    if "ttft_ms" in slo and req["ttft_s"] * 1e3 > slo["ttft_ms"]:
        return False
    if "tpot_ms" in slo and (req["tpot_s"] is None or req["tpot_s"] * 1e3 > slo["tpot_ms"]):
        return False
    return True


def level(records: list[dict], slo: dict | None = None) -> dict:
    """The figures of one load level from its counted request records (warm-up already trimmed)."""
    reqs = [per_request(r) for r in records]
    done = [(r, q) for r, q in zip(records, reqs, strict=True) if q["ttft_s"] is not None]
    out = {"requests": len(records), "completed": len(done), "failed": len(records) - len(done)}
    if done:
        span = max(r["token_s"][-1] for r, _ in done) - min(r["sent_s"] for r, _ in done)
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
        out.update(_summary(name, values))
    short = [n for n in ("ttft_s", "tpot_s", "e2e_s") if out.get(f"{n}_n", 0) < P99_MIN_VALUES]
    out["p99_note"] = f"no p99 for {', '.join(short)}: fewer than {P99_MIN_VALUES} values" if short else None
    return out
