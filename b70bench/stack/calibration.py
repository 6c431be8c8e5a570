"""A stack's calibration: what a start and a call of it cost here and how they spread, read off a short A/A in the
stack's own placement (`b70bench calibrate`), and the file beside the stack that keeps it.

Every spread is of logs, so it reads as a fraction (0.012: 1.2%), and the variance components are computed from
means of logs, whatever the blocks' own figure is:

call_sd    a timed call's log latency about its start's mean, pooled over the starts.
start_sd   a start's mean log call time between starts of identical code, beyond what its m calls explain:
           sqrt(max(0, var(start means) - call_sd^2 / m)). What no number of calls a start removes.
round_sd   one round's log B/A about its block's mean, pooled over the blocks.
block_sd   a block's log B/A between blocks, beyond what its m rounds explain: sqrt(max(0, var(block log B/A) -
           round_sd^2 / m)). The block's B/A is Block.ratio(): the trimmed mean of its rounds' log ratios together,
           B's median call over A's alternate (a ratio of medians), so the subtraction is an approximation there.

A budget's allocation treats block_sd^2 + round_sd^2 / m as the variance of one block of m rounds: block_sd is
what only more blocks (fresh starts) remove, round_sd what more rounds a block remove too.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from b70bench import records, state
from b70bench.errors import UsageError
from b70bench.paired.blocks import SIDES, Block
from b70bench.stack.description import Stack

SUFFIX = ".calibration.json"
AGAIN = "run b70bench calibrate again"


@dataclass(frozen=True)
class Calibration:
    stack_hash: str
    placement: str  # together | alternate
    backend: str
    shape: str
    starts_per_side: int  # counted starts a side (one a block)
    calls_per_start: int  # timed calls a start
    start_cold_s: float | None  # the first start on an empty compile cache; None: not measured
    start_warm_s: float | None  # median wall_to_ready_s of the counted starts
    call_s: float  # median timed call latency
    start_sd: float
    call_sd: float
    block_sd: float
    round_sd: float
    blocks: int
    date: str  # UTC, ISO 8601
    machine: str
    commit: str  # the b70bench checkout's, or "unknown"
    vllm: str | None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _pooled_sd(groups: list[list[float]]) -> float:
    """The within-group sd of several groups together: squares about each group's mean over their degrees of
    freedom."""
    ss = sum(sum((x - statistics.fmean(g)) ** 2 for x in g) for g in groups)
    return math.sqrt(ss / sum(len(g) - 1 for g in groups))


def _beyond(values: list[float], within_sd: float, counts: list[int]) -> float:
    """The sd between values (each a mean of counts[i] draws spreading within_sd) beyond what their draws explain."""
    explained = within_sd**2 * statistics.fmean(1.0 / n for n in counts)
    return math.sqrt(max(0.0, statistics.variance(values) - explained))


def from_blocks(
    blocks: list[Block],
    *,
    placement: str,
    backend: str,
    shape: str,
    stack_hash: str,
    cold_s: float | None = None,
    date: str | None = None,
    machine: str | None = None,
    commit: str | None = None,
    vllm: str | None = None,
) -> Calibration:
    """The calibration of an A/A's blocks (those that failed skipped). Each (block, side) is one start. A ValueError
    where fewer than two blocks completed or a start has fewer than two timed calls."""
    good = [b for b in blocks if b.error is None]
    if len(good) < 2:
        failed = [b for b in blocks if b.error is not None]
        cause = f"; block {failed[-1].index + 1} failed: {failed[-1].error}" if failed else ""
        raise ValueError(f"{len(good)} of {len(blocks)} blocks completed: a calibration needs 2 or more{cause}")
    starts, ready, rounds, block_logs = [], [], [], []
    for b in good:
        for s in SIDES:
            logs = [math.log(c["latency_s"]) for c in b.calls if c["side"] == s and c.get("latency_s")]
            if len(logs) < 2:
                raise ValueError(
                    f"block {b.index + 1}, side {s}: {len(logs)} timed call(s); a calibration needs 2 or more a start"
                )
            starts.append(logs)
            if b.starts.get(s, {}).get("wall_to_ready_s") is not None:
                ready.append(float(b.starts[s]["wall_to_ready_s"]))
        rounds.append([math.log(r) for r in b.ratios()])
        block_logs.append(math.log(b.ratio()))
    call_sd = _pooled_sd(starts)
    round_sd = _pooled_sd(rounds)
    counts = [len(x) for x in starts]
    return Calibration(
        stack_hash=stack_hash,
        placement=placement,
        backend=backend,
        shape=shape,
        starts_per_side=len(good),
        calls_per_start=statistics.median_low(counts),
        start_cold_s=cold_s,
        start_warm_s=statistics.median(ready) if ready else None,
        call_s=statistics.median(math.exp(x) for s in starts for x in s),
        start_sd=_beyond([statistics.fmean(x) for x in starts], call_sd, counts),
        call_sd=call_sd,
        block_sd=_beyond(block_logs, round_sd, [len(r) for r in rounds]),
        round_sd=round_sd,
        blocks=len(good),
        date=date or _now(),
        machine=machine if machine is not None else _node(),
        commit=commit or "unknown",
        vllm=vllm,
    )


def _now() -> str:
    from datetime import UTC, datetime

    return datetime.now(UTC).isoformat(timespec="seconds")


def _node() -> str:
    import platform

    return platform.node() or "unknown"


def path_for(stack: Stack) -> Path:
    """Beside the stack file (rig.toml: rig.calibration.json); the embedded default's in the state directory, under
    its hash (runtime state never goes into the package)."""
    if stack.source is None:
        return state.home() / "calibration" / f"{stack.hash()}.json"
    src = Path(stack.source)
    return src.with_name(src.stem + SUFFIX)


def save(cal: Calibration, path: Path) -> None:
    records.atomic_write_text(path, json.dumps(cal.to_json(), sort_keys=True, indent=2) + "\n")


def load(path: Path) -> Calibration | None:
    """The calibration in path; None where there is none. A file that is not one is a UsageError naming it."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise UsageError(f"calibration {path} is unreadable ({str(err).splitlines()[0]}): {AGAIN}") from None
    names = {f.name for f in dataclasses.fields(Calibration)}
    if not isinstance(data, dict) or set(data) != names:
        got = sorted(set(data) ^ names) if isinstance(data, dict) else [type(data).__name__]
        raise UsageError(f"calibration {path} is not one (keys {', '.join(got)} differ): {AGAIN}")
    bad = [k for k in ("call_s", "start_sd", "call_sd", "block_sd", "round_sd") if not _number(data[k])]
    bad += [k for k in ("start_cold_s", "start_warm_s") if data[k] is not None and not _number(data[k])]
    if bad:
        raise UsageError(f"calibration {path}: {bad[0]} = {data[bad[0]]!r} is not a number: {AGAIN}")
    return Calibration(**data)


def _number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def command(stack: Stack) -> str:
    return "b70bench calibrate" + (f" --stack {stack.source}" if stack.source else "")


def staleness(stack: Stack, cal: Calibration, path: Path) -> str | None:
    """Why cal no longer describes the stack (measured for another one, or the stack file edited since), or None."""
    if cal.stack_hash != stack.hash():
        return f"measured for another stack: hash {cal.stack_hash}, the stack's is now {stack.hash()}"
    if stack.source is not None:
        try:
            if Path(stack.source).stat().st_mtime_ns > Path(path).stat().st_mtime_ns:
                return f"older than the stack file {stack.source}"
        except OSError:
            pass  # a file gone since it was read: the hash above is what was compared
    return None


def for_stack(stack: Stack) -> tuple[Calibration | None, str | None]:
    """(the stack's calibration or None, why it is missing or stale, or None where it is current)."""
    path = path_for(stack)
    cal = load(path)
    if cal is None:
        return None, f"not calibrated: run `{command(stack)}`"
    why = staleness(stack, cal, path)
    return cal, (f"stale, {why}: run `{command(stack)}`" if why else None)


def describe_lines(cal: Calibration | None, why: str | None) -> list[str]:
    """What `stack show` and a plan print: the figures, then why they are missing or stale."""
    if cal is None:
        return [f"calibration: {why}"]
    cold = f"{cal.start_cold_s:.1f} s cold" if cal.start_cold_s is not None else "cold not measured"
    warm = f"{cal.start_warm_s:.1f} s warm" if cal.start_warm_s is not None else "warm not measured"
    lines = [
        f"calibrated {cal.date[:10]} on {cal.machine} at commit {cal.commit} ({cal.placement}, {cal.shape}, "
        f"{cal.blocks} blocks of {cal.calls_per_start} calls a start): start {warm}, {cold}; call {cal.call_s:.3g} s",
        f"  single starts spread {cal.start_sd:.1%}, calls within a start {cal.call_sd:.1%}; a block's B/A "
        f"{cal.block_sd:.1%} + {cal.round_sd:.1%}/sqrt(calls) (in quadrature)",
    ]
    if why:
        lines.append(f"  {why}")
    return lines
