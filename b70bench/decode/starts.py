"""Several fresh vLLM starts of one shape as one figure per start: what asv and `compare` take as samples.

Separate starts of the same code differ by several times the spread of the calls inside one start
(the host's speed is drawn per process and drifts), so a figure's real uncertainty is the spread
between starts. Each start contributes its fastest timed call: of the per-start statistics
measured (fastest call, median, fastest-half mean, 25th percentile), it agreed best across starts
of the same code (docs: the decode suite's noise table).
"""

from __future__ import annotations

import statistics

# Starts per commit and shape in asv (B70BENCH_DECODE_STARTS overrides) and per side in `compare`.
DEFAULT_STARTS = 8
# Timed generate calls per start: the fastest of 20 agreed better across starts than that of 10.
DEFAULT_ITERATIONS = 20
# The record field each start contributes: s_per_output_token is its fastest call.
PER_START_FIGURE = "s_per_output_token"


def per_start(starts: list[dict], key: str = PER_START_FIGURE) -> list[float]:
    """One value per start that passed; empty when any start failed the gate (speed is withheld)."""
    if any(r.get("gate") == 1 for r in starts):
        return []
    return [r[key] for r in starts if r.get("ok") and r.get(key) is not None]


def gate_of(starts: list[dict]) -> int | None:
    """1 when any start failed (gate or run), 0 when every gated start passed, None while unpinned."""
    gates = [r.get("gate") for r in starts]
    if 1 in gates:
        return 1
    return 0 if gates and all(g == 0 for g in gates) else None


def summary(starts: list[dict]) -> dict:
    """The figures asv tracks for one shape, from that shape's start records (in start order)."""
    first = starts[0]
    out_s = per_start(starts)
    ratio = first["output_len"] / (first["prompt_len"] + first["output_len"])
    rates = [r["output_tok_per_s"] for r in starts if r.get("output_tok_per_s") and out_s]
    return {
        "shape": first["shape"],
        "starts": len(starts),
        "starts_ok": sum(bool(r.get("ok")) for r in starts),
        "starts_s_per_output_token": out_s,
        "starts_s_per_total_token": [s * ratio for s in out_s],
        "output_tok_per_s": statistics.median(rates) if rates else None,
        "kv_cache_tokens": first.get("kv_cache_tokens"),
        "gate": gate_of(starts),
        "gate_message": next((r["gate_message"] for r in starts if r.get("gate_message")), None),
    }
