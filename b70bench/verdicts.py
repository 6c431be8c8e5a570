"""Verdicts over a commit history: which commit made a figure slower or faster, and which did not.

Each commit gets one of four verdicts (stats.Ratio.decide): slower, faster, "no change beyond X%" (the
interval rules out any change larger than X, X at most min_effect) or undecided (the interval still holds a
change of min_effect: more samples needed). They come from one of two rules:

- paired (preferred): the commit's own B/A ratios to its git parent, one per block, B and A measured
  alternating in the same host window (asv figure `bench_decode.Decode.track_ratio_to_parent`), with
  stats.blocks_interval where each block's standard error was recorded (`track_ratio_se_to_parent`), else
  stats.paired_interval. Host drift between blocks cancels inside each ratio.
- unpaired (results without paired ratios): asv's step fit weights each point by the width of its own interval
  and is conservative about a one-commit final segment, so on a noisy host it neither names a real 5-10%
  slowdown at the newest commit nor stays quiet about no-op commits reliably. This walks the history instead:
  each commit's per-start samples against the pooled samples of the commits since the last named change (the
  segment it would belong to), with stats.ratio_interval (a rank interval: one start another process took
  cannot hide a slowdown or invent one). A named commit starts a new segment; otherwise it joins the current
  one, so the reference grows sharper with every commit that changed nothing.

Pure logic, no asv import: b70bench.asv_plugin feeds it asv's result files at `asv publish`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from b70bench import stats

# Two-sided level of each commit's interval. A walk makes one test per commit, so 95% would name
# about one no-op commit in twenty; 99% keeps six no-op commits mostly quiet.
LEVEL = 0.99
# The smallest change that matters: an interval that still holds it leaves the commit undecided.
MIN_EFFECT = stats.DEFAULT_MIN_EFFECT
# Smallest change named slower / faster even when the interval excludes 1.
FLOOR = stats.DEFAULT_FLOOR

PAIRED, UNPAIRED = "paired", "unpaired"  # which rule decided a verdict


@dataclass(frozen=True)
class Point:
    """One commit's samples of one figure, in history order (revision).

    For unpaired: per-start samples of a lower-is-better figure. For paired: B/A ratios to the parent,
    one per block. minutes: machine minutes the measurement took; calls: timed calls per side; parent: the
    commit's git parent (what paired ratios were measured against), where known."""

    revision: int
    commit: str
    samples: tuple[float, ...]
    minutes: float | None = None
    calls: int | None = None
    parent: str | None = None
    ses: tuple[float, ...] = ()  # paired: each block's standard error of its log ratio, as samples are ordered
    gate_failed: bool = False  # the exact-token gate failed: the commit's speed was withheld, not measured
    placement: str | None = None  # paired: together or alternate (paired.placement)
    # paired: the smallest change its measurement had to decide, as its stopping rule did; None: the page's setting.
    min_effect: float | None = None


@dataclass
class Verdict:
    commit: str
    revision: int
    reference: list[str]  # what it was compared with: the parent (paired), the segment's commits (unpaired)
    decision: stats.Decision | None  # None: too few samples for any interval
    text: str  # the printed verdict: "slower", "no change beyond 3.1%", "undecided: ..."
    ratio: stats.Ratio | None = None
    before: float | None = None  # unpaired: geometric means of the reference and of this commit
    after: float | None = None
    n: int = 0  # samples (paired: blocks) behind this commit's side
    minutes: float | None = None
    calls: int | None = None
    subject: str | None = None  # the commit's subject line (filled by the asv plugin)
    rule: str = UNPAIRED
    notes: list[str] = field(default_factory=list)
    placement: str | None = None
    machine: str | None = None  # the asv machine whose results decided it (filled by the asv plugin)
    blocks: tuple[float, ...] = ()  # paired: the B/A of each block, in order
    stopped: str | None = None  # paired: why no further block was taken (paired.stopping.STOPS; the asv plugin)
    key_change: dict | None = None  # the commit's compile-cache keys against its parent's (cachekey.change; plugin)

    @property
    def verdict(self) -> str:
        """The word: stats.SLOWER / FASTER / NO_CHANGE / UNDECIDED."""
        return self.decision.word if self.decision else stats.UNDECIDED

    @property
    def named(self) -> bool:
        return self.verdict in (stats.SLOWER, stats.FASTER)


# The text of a commit whose gate failed: its speed is withheld, so there is nothing to decide on.
WITHHELD = "speed withheld: the gate failed (its tokens differ from its parent's or from the pinned hash)"


def _too_few(p: Point, reference: list[str], n: int, rule: str, what: str) -> Verdict:
    return Verdict(
        p.commit,
        p.revision,
        reference,
        None,
        f"{stats.UNDECIDED}: {WITHHELD}"
        if p.gate_failed and not n
        else f"{stats.UNDECIDED}: {n} {what}, an interval needs two",
        n=n,
        minutes=p.minutes,
        placement=p.placement,
        calls=p.calls,
        rule=rule,
    )


def paired(
    points: list[Point], level: float = LEVEL, min_effect: float = MIN_EFFECT, floor: float = FLOOR
) -> list[Verdict]:
    """One verdict per commit with paired ratios, each against its own parent (not against a segment), at the
    smallest change its own measurement had to decide where it says (Point.min_effect), else min_effect."""
    out = []
    for p in sorted(points, key=lambda q: q.revision):
        reference = [p.parent] if p.parent else []
        effect = p.min_effect if p.min_effect is not None else min_effect
        r, d = stats.decide_blocks(list(p.samples), list(p.ses), level, effect, floor)
        n = sum(1 for x in p.samples if x is not None and x > 0)
        if r is None:
            out.append(_too_few(p, reference, n, PAIRED, "paired block(s)"))
            continue
        out.append(
            Verdict(
                p.commit,
                p.revision,
                reference,
                d,
                d.text,
                r,
                n=n,
                minutes=p.minutes,
                placement=p.placement,
                calls=p.calls,
                rule=PAIRED,
                blocks=tuple(x for x in p.samples if x is not None and x > 0),
            )
        )
    return out


def unpaired(
    points: list[Point], level: float = LEVEL, min_effect: float = MIN_EFFECT, floor: float = FLOOR
) -> list[Verdict]:
    """One verdict per commit after the first with samples; see the module docstring."""
    out: list[Verdict] = []
    segment: list[Point] = []
    for p in sorted(points, key=lambda q: q.revision):
        samples = [s for s in p.samples if s is not None and s > 0]
        if len(samples) < 2:
            out.append(_too_few(p, [q.commit for q in segment], len(samples), UNPAIRED, "sample(s)"))
            continue
        if not segment:
            segment = [Point(p.revision, p.commit, tuple(samples))]
            continue
        ref = [s for q in segment for s in q.samples]
        r = stats.ratio_interval(ref, samples, level)
        d = r.decide(min_effect, floor)
        v = Verdict(
            p.commit,
            p.revision,
            [q.commit for q in segment],
            d,
            d.text,
            r,
            stats.geomean(ref),
            stats.geomean(samples),
            n=len(samples),
            minutes=p.minutes,
            placement=p.placement,
            calls=p.calls,
            rule=UNPAIRED,
        )
        out.append(v)
        point = Point(p.revision, p.commit, tuple(samples))
        segment = [point] if v.named else segment + [point]
    return out


def describe(
    level: float = LEVEL, min_effect: float = MIN_EFFECT, floor: float = FLOOR, rules=(PAIRED, UNPAIRED)
) -> str:
    """The rules (one sentence each, those in `rules`) and the four words, for the website and the CLI."""
    sentences = []
    if PAIRED in rules:
        sentences.append(
            f"Paired: each commit against its git parent, from B/A ratios measured alternating in one host "
            f"window, one per block: where every block carries its own standard error, their "
            f"random-effects mean (DerSimonian-Laird, the spread between blocks taken at least "
            f"{stats._pct(stats.BLOCK_OFFSET_SD)}, {stats._pct(stats.TWO_BLOCKS_OFFSET_SD)} with two blocks) with a "
            f"{level:.0%} normal interval; else (alternate blocks) their geometric mean with a {level:.0%} Student-t "
            f"interval of the logs."
        )
    if UNPAIRED in rules:
        sentences.append(
            f"Unpaired: each commit's per-start samples against the pooled samples of the commits since the last "
            f"named change: the median of all pairwise ratios (Hodges-Lehmann) with its {level:.0%} "
            f"Mann-Whitney interval."
        )
    sentences.append(
        f"Slower / faster when the interval excludes 1 and the ratio is at least {stats._pct(floor)} from 1; "
        f'"no change beyond X%" when the interval lies within X% of 1 and X is at most {stats._pct(min_effect)}; '
        f"undecided when the interval still holds a {stats._pct(min_effect)} change."
    )
    return " ".join(sentences)
