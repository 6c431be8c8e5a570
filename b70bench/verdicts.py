"""Verdicts over a commit history: which commit made a per-start figure slower or faster.

asv's step fit weights each point by the width of its own interval and is conservative about a
one-commit final segment, so on a noisy host it neither names a real 5-10% slowdown at the newest
commit nor stays quiet about no-op commits reliably. This walks the history instead: each commit's
per-start samples against the pooled samples of the commits since the last named change (the
segment it would belong to), with stats.ratio_interval (a rank interval: one start another
process took cannot hide a slowdown or invent one). A commit whose interval excludes 1 by at
least min_effect is named and starts a new segment; otherwise it joins the current one, so the
reference grows sharper with every commit that changed nothing.

Pure logic, no asv import: b70bench.asv_plugin feeds it asv's result files at `asv publish`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from b70bench import stats

# Two-sided level of each commit's interval. A walk makes one test per commit, so 95% would name
# about one no-op commit in twenty; 99% keeps six no-op commits mostly quiet.
LEVEL = 0.99
# Smallest change named even when the interval excludes 1 (asv's own default threshold is 5%).
MIN_EFFECT = 0.02


@dataclass(frozen=True)
class Point:
    """One commit's samples of one figure (lower is better), in history order (revision)."""

    revision: int
    commit: str
    samples: tuple[float, ...]


@dataclass
class Verdict:
    commit: str
    revision: int
    reference: list[str]  # the commits whose pooled samples it was compared with
    verdict: str  # stats.SLOWER / FASTER / NO_DIFFERENCE, or "too few samples"
    ratio: stats.Ratio | None = None
    before: float | None = None  # geometric means of the reference and of this commit
    after: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def named(self) -> bool:
        return self.verdict in (stats.SLOWER, stats.FASTER)


TOO_FEW = "too few samples"


def walk(points: list[Point], level: float = LEVEL, min_effect: float = MIN_EFFECT) -> list[Verdict]:
    """One verdict per commit after the first with samples; see the module docstring."""
    out: list[Verdict] = []
    segment: list[Point] = []
    for p in sorted(points, key=lambda q: q.revision):
        samples = [s for s in p.samples if s is not None and s > 0]
        if len(samples) < 2:
            out.append(Verdict(p.commit, p.revision, [q.commit for q in segment], TOO_FEW))
            continue
        if not segment:
            segment = [Point(p.revision, p.commit, tuple(samples))]
            continue
        ref = [s for q in segment for s in q.samples]
        r = stats.ratio_interval(ref, samples, level)
        v = Verdict(
            p.commit,
            p.revision,
            [q.commit for q in segment],
            r.verdict(min_effect),
            r,
            stats.geomean(ref),
            stats.geomean(samples),
        )
        out.append(v)
        point = Point(p.revision, p.commit, tuple(samples))
        segment = [point] if v.named else segment + [point]
    return out


def describe(level: float = LEVEL, min_effect: float = MIN_EFFECT) -> str:
    """The rule in one sentence, for the website and the CLI."""
    return (
        f"each commit's per-start samples against the pooled samples of the commits since the last named "
        f"change: the median of all pairwise ratios (Hodges-Lehmann) with its {level:.0%} Mann-Whitney "
        f"interval; named when the interval excludes 1 and the ratio is at least {min_effect:.0%} from 1"
    )
