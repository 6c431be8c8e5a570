"""The figures' catalogue (which figures b70bench decides, which are paired and under what names, which asv must not
list), declared once for the adapters, the website's plug-in and `revisions`; and one reading of what asv stored for
a figure, for every reader of asv results (the website, kernel-vs-model).

asv keeps a figure that was not measured in several forms: None (a skip or failure), NaN (an adapter that
returns NaN for a figure its mode does not measure, as `make bench`'s one-commit mode does for the paired
figures), or no entry at all. All of them mean "not measured" and none may be read as a number."""

from __future__ import annotations

import math


def measured(value) -> float | None:
    """The figure as a float, or None where it was not measured (None, NaN, infinite, not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def measured_samples(samples) -> tuple[float, ...] | None:
    """The measured samples of one figure (unmeasured ones dropped), or None where none was measured."""
    if not isinstance(samples, (list, tuple)):
        return None
    got = tuple(x for x in (measured(s) for s in samples) if x is not None)
    return got or None


# Per-start figures (lower is better) b70bench decides; asv's step fit still decides every other figure.
DECIDED = (
    "bench_decode.Decode.track_s_per_output_token",
    "bench_decode.Decode.track_s_per_total_token",
    "bench_serve.Serve.track_e2e_s",
    "bench_serve.Serve.track_tpot_s",
    "bench_serve.Serve.track_ttft_s",
)
# The figures a walk measures paired with the git parent, and the suite whose paired figures decide them:
# <suite>.track_ratio_to_parent (B/A, one sample per block), .track_ratio_se_to_parent (each block's standard
# error of its log ratio), .track_minutes (machine minutes) and the count of what each side timed (TIMED).
# serve's blocks stop on each level's median E2E; TPOT and TTFT are read from the same blocks, each with its own
# B/A (<suite>.track_tpot_ratio_to_parent ...): PAIRED_RATIO names each figure's ratio prefix.
PAIRED_BY = {
    "bench_decode.Decode.track_s_per_output_token": "bench_decode.Decode",
    "bench_decode.Decode.track_s_per_total_token": "bench_decode.Decode",
    "bench_serve.Serve.track_e2e_s": "bench_serve.Serve",
    "bench_serve.Serve.track_tpot_s": "bench_serve.Serve",
    "bench_serve.Serve.track_ttft_s": "bench_serve.Serve",
}
PAIRED_RATIO = {"bench_serve.Serve.track_tpot_s": "tpot_", "bench_serve.Serve.track_ttft_s": "ttft_"}
PAIRED_FIGURES = (
    "track_ratio_to_parent",
    "track_ratio_se_to_parent",
    "track_minutes",
    "track_placement",
    "track_stopped",
    "track_min_effect",
)
PAIRED_SUITES = tuple(dict.fromkeys(PAIRED_BY.values()))


def paired_figures(name: str) -> tuple[str, ...]:
    """The paired figures of a decided figure, under its suite: its own ratio and standard errors, the shared
    minutes, placement, why it stopped and the effect it decided against."""
    prefix = PAIRED_RATIO.get(name, "")
    return tuple(f.replace("track_", f"track_{prefix}", 1) if "ratio" in f else f for f in PAIRED_FIGURES)


# What a paired block times on each side, by suite (decode: calls, serve: levels); <suite>.track_<word>s counts them.
# Results written before serve's count was named track_levels carry it as track_calls, read as the same figure.
TIMED = {"bench_decode.Decode": "call", "bench_serve.Serve": "level"}
OLD_COUNT_FIGURE = "track_calls"


def count_figures(suite: str) -> tuple[str, ...]:
    """The names a suite's count of timed calls or levels is stored under, the current one first."""
    return tuple(dict.fromkeys((f"{suite}.track_{TIMED[suite]}s", f"{suite}.{OLD_COUNT_FIGURE}")))


# The compile-cache key figures against the parent (0 same, 1 moved; cachekey.change): b70bench names each commit that
# reads 1 (asv's step fit would read a one-commit rise and fall as noise), and the page shows the move beside the
# decode verdicts of the same commit and shape (KEY_BY).
KEY_FIGURES = (
    "bench_decode.Decode.track_aot_key_differs_from_parent",
    "bench_decode.Decode.track_piecewise_key_differs_from_parent",
)
KEY_BY = {name: KEY_FIGURES[0] for name in DECIDED if name.startswith("bench_decode.")}
# The exact-token gate of a decided figure's suite (0 pass, 1 fail): a commit that failed it has its speed withheld,
# and the page says so rather than counting its missing samples.
GATE_BY = {name: "bench_decode.Decode.track_gate" for name in DECIDED if name.startswith("bench_decode.")}
# Withdrawn from asv's list: the higher-is-better twins of DECIDED (asv would list a speed-up as a
# regression) and the paired measurement's figures (a ratio near 1 or a machine-minute count is no speed).
WITHDRAWN = (
    "bench_decode.Decode.track_output_tok_per_s",
    "bench_decode.Decode.track_total_tok_per_s",
    "bench_serve.Serve.track_goodput_request_per_s",
    "bench_serve.Serve.track_output_tok_per_s",
    *dict.fromkeys(f"{suite}.{figure}" for name, suite in PAIRED_BY.items() for figure in paired_figures(name)),
    *(name for suite in PAIRED_SUITES for name in count_figures(suite)),
)


def ratio_figure(suite: str) -> str:
    """The figure a suite's paired verdicts are read from (one B/A a block): what `revisions` matches --bench with."""
    return f"{suite}.{PAIRED_FIGURES[0]}"
