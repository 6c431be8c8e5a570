"""A walk as one design: each commit started once a pass, every start serving the verdicts of both its neighbours.

The per-pair design measures each commit of a walk c0 < c1 < ... < cN against its parent on its own: two sides, an
uncounted warm start each, and every counted start serves one verdict. Here the sides are the walk's N + 1 commits,
placed alternate (one process alive at a time; together is below). A pass starts a run of them once each, forward
on even passes and backward on odd ones, so each adjacent pair (c_i, c_i+1) has a start of each side next to each
other in time, once in each order over two passes: the A B | B A of alternate blocks, with N + 1 starts a pass
where the per-pair design takes 2N. Each pass gives every pair it covers one block (blocks.Block: A the parent's
start, B the child's), and each pair is decided by the per-pair rule (blocks.decide at each look's level). Each
commit gets one uncounted warm start in all (the per-pair design: two, one as a child and one as a parent).

After the first look (first_passes passes over every commit, run whole: the fewest a pair is read from), only
undecided pairs get more passes, over the shortest run of commits that covers them, doubling their blocks a look
while the budget lasts. A pair whose counted
start fails is lost with its cause (as a per-pair measurement is) and gets no more passes. Every start is handed to
`record` as it ends, and `done` (what an earlier run recorded) is replayed instead of started again, so a run killed
in the middle of a pass resumes at the next start.

Placed together (where two engines fit at once: the CPU default), a pass keeps two engines alive: each commit is
started once, called in turns with the commit before it in the pass (rounds of two calls seconds apart, the order
alternating, as a together block's), and then the one before it is stopped, so its start serves its pair with the
commit after it too. No warm starts (a together block has none: the calls come after the start's compile), and a
pass replays from the journal only when all its starts are there, since a start's calls with both neighbours are
recorded when it stops; a pass cut short is run again whole.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from b70bench import stats
from b70bench.paired import placement as placements
from b70bench.paired.blocks import Block, decide
from b70bench.paired.stopping import ALTERNATE_FIRST_BLOCKS, BUDGET, DECIDED, FAILED, LOOKS, MAX_LOOKS, Paired

WARM = -1  # pass_index of a commit's uncounted warm start
# Where `revisions --design` tells the decode adapter the design's results are (result_path under it).
DESIGN_ENV = "B70BENCH_DESIGN_DIR"


@dataclass
class Start:
    """One start of one commit: its ready facts (gate hash, log, pid) and its timed calls, or the error it ended on."""

    side: str
    pass_index: int
    position: int  # its place in the pass
    facts: dict = field(default_factory=dict)
    calls: list[dict] = field(default_factory=list)  # together: each names the neighbour it was paired with
    error: str | None = None
    wall_s: float = 0.0  # together: from the end of the previous start's calls to the end of its own
    placement: str = placements.ALTERNATE

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Start:
        return cls(**data)


def read_journal(path: Path | None) -> list[Start]:
    """The starts an earlier run of the same design recorded (one JSON line each), those that failed left out so
    that they are started again; a line cut short by a kill is ignored."""
    if path is None or not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            start = Start.from_json(json.loads(line))
        except (ValueError, TypeError):
            continue
        if start.error is None:
            out.append(start)
    return out


def journal_writer(path: Path | None):
    """record() for measure(): each start appended as it ends, flushed, so a kill loses at most the one under way."""
    if path is None:
        return lambda _start: None
    path.parent.mkdir(parents=True, exist_ok=True)

    def record(start: Start) -> None:
        with open(path, "a") as f:
            f.write(json.dumps(start.to_json(), default=str) + "\n")

    return record


def result_path(design_dir: Path, commit: str, shape: str) -> Path:
    """Where a walk's design leaves one commit's decode result for one shape (revisions writes, the adapter reads)."""
    return Path(design_dir) / commit / f"decode-{shape}.json"


def pass_order(sides: list[str], pass_index: int) -> list[str]:
    """The order of one pass over `sides` (in walk order): forward on even passes, backward on odd ones."""
    return list(sides) if pass_index % 2 == 0 else list(reversed(sides))


def covering(keys: list[str], pairs: list[int]) -> list[str]:
    """The commits a pass starts for the pairs (index i: keys[i] against keys[i + 1]): the shortest runs covering
    them, so each pair's two commits are started one after the other."""
    need = sorted({i for p in pairs for i in (p, p + 1)})
    return [keys[i] for i in need]


def run_start(target, side: str, pass_index: int, position: int, rounds: int, warmup_calls: int) -> Start:
    """Start `side`, answer its ready, warm calls and `rounds` timed calls (none for a warm start), stop it; every
    process of it reaped whichever way it ends."""
    start = Start(side, pass_index, position)
    label = f"warm-{side}" if pass_index == WARM else f"pass{pass_index:02d}-{side}"
    t0 = time.monotonic()
    handle = None
    try:
        handle = target.start(side, label)
        start.facts = handle.ready()
        for _ in range(1 if pass_index == WARM else warmup_calls):
            handle.warm()
        tb = time.monotonic()
        for r in range(0 if pass_index == WARM else rounds):
            got = handle.call()
            start.calls.append({**got, "round": r, "t_s": round(time.monotonic() - tb, 4)})
    except target.errors as err:
        start.error = str(err)
    finally:
        if handle is not None:
            left = handle.stop()
            if left:
                start.error = (start.error or "") + f"; pids {left} left alive"
        start.wall_s = time.monotonic() - t0
    return start


def run_pass_together(
    target, sides: list[str], pass_index: int, rounds: int, warmup_calls: int, adjacent, record
) -> list[Start]:
    """One together pass over `sides` (pass order): each started once; where it and the side before it are an
    adjacent pair (adjacent(a, b)), both warmed and then `rounds` rounds of one call each, the order alternating (as
    a together block's: placement.turn); then the side before it is stopped and handed to `record`. Every process is
    reaped whichever way the pass ends."""
    out = [Start(side, pass_index, i, placement=placements.TOGETHER) for i, side in enumerate(sides)]
    handles: dict[int, object] = {}

    def stop(i: int, keep: bool = True) -> None:
        left = handles.pop(i).stop()
        if left:
            out[i].error = (out[i].error or "") + f"; pids {left} left alive"
        if keep:
            record(out[i])

    def segment(a: int, b: int) -> None:
        # The earlier engine sat idle through the later one's start, so both are warmed again, in turns, before
        # the timed rounds, as a together block warms its two.
        who = (a, b)
        tb = time.monotonic()
        for r in range(-warmup_calls, rounds):
            for j in placements.turn(who, r):
                try:
                    if r < 0:
                        handles[j].warm()
                        continue
                    got = handles[j].call()
                except target.errors as err:
                    out[j].error = str(err)
                    return
                t_s = round(time.monotonic() - tb, 4)
                out[j].calls.append({**got, "with": sides[b if j == a else a], "round": r, "t_s": t_s})

    seg = time.monotonic()
    prev: int | None = None
    try:
        for i, side in enumerate(sides):
            try:
                handles[i] = target.start(side, f"pass{pass_index:02d}-{side}")
                out[i].facts = handles[i].ready()
            except target.errors as err:
                out[i].error = str(err)
                if i not in handles:
                    record(out[i])
            if prev is not None and out[i].error is None and adjacent(sides[prev], side):
                segment(prev, i)
            now = time.monotonic()
            out[i].wall_s, seg = now - seg, now
            if prev is not None:
                stop(prev)
            prev = i if i in handles and out[i].error is None else None
            if prev is None and i in handles:
                stop(i)
        if prev is not None:
            stop(prev)
    finally:
        for i in list(handles):  # a kill or an error not the target's: reaped, not recorded (the pass runs again)
            stop(i, keep=False)
    return out


def pair_blocks(starts: list[Start], parent: str, child: str) -> list[Block]:
    """The blocks of one pair: one per pass that started both commits (A the parent's start, B the child's)."""
    by_pass: dict[int, dict[str, Start]] = {}
    for s in starts:
        if s.pass_index != WARM:
            by_pass.setdefault(s.pass_index, {})[s.side] = s
    blocks = []
    for p in sorted(by_pass):
        got = by_pass[p]
        if parent not in got or child not in got:
            continue
        a, b = got[parent], got[child]
        if a.placement == placements.TOGETHER:
            # The pair's calls are the later start's segment: its start and the rounds with the earlier one.
            later = a if a.position > b.position else b
            block = Block(len(blocks), placement=placements.TOGETHER, wall_s=later.wall_s, started_apart=True)
            a_calls = [c for c in a.calls if c.get("with") == child]
            b_calls = [c for c in b.calls if c.get("with") == parent]
        else:
            block = Block(len(blocks), placement=placements.ALTERNATE, wall_s=a.wall_s + b.wall_s)
            a_calls, b_calls = a.calls, b.calls
        block.starts = {"A": a.facts, "B": b.facts}
        block.calls = [{**c, "side": "A"} for c in a_calls] + [{**c, "side": "B"} for c in b_calls]
        errors = [f"{name} ({s.side}) in pass {p + 1}: {s.error}" for name, s in (("A", a), ("B", b)) if s.error]
        block.error = "; ".join(errors) or None
        blocks.append(block)
    return blocks


@dataclass
class Design:
    """What one design run measured: each pair's measurement (child key -> Paired, its parent the key before it) and
    what it cost."""

    keys: list[str]
    pairs: dict[str, Paired]
    starts: list[Start]
    passes: int
    wall_s: float

    @property
    def counted_starts(self) -> int:
        return sum(1 for s in self.starts if s.pass_index != WARM)

    @property
    def all_starts(self) -> int:
        return len(self.starts)


def measure(
    target,
    keys: list[str],
    *,
    rounds: int,
    warmup_calls: int,
    budget_s: float,
    level: float,
    min_effect: float,
    floor: float,
    first_passes: int = ALTERNATE_FIRST_BLOCKS,
    max_looks: int = MAX_LOOKS,
    placement: str = placements.ALTERNATE,
    done: list[Start] | None = None,
    record=lambda _start: None,
    out=print,
    clock=time.monotonic,
) -> Design:
    """Measure every commit of `keys` (walk order, the first the base) against the one before it, as one design.
    `level` is each look's (stopping.per_look_level gives it for an overall level); target as paired.placement's;
    placement alternate (one engine alive at a time) or together (two, see the module docstring).
    The budget counts the replayed starts' seconds too, so a resumed run stops where the first would have."""
    if len(keys) < 2:
        raise ValueError("a design needs two commits at least (the base and one walked commit)")
    t0 = clock()
    replay = {(s.pass_index, s.position): s for s in done or ()}
    starts: list[Start] = []
    replayed = [0.0]

    def spent() -> float:
        return clock() - t0 + replayed[0]

    def one(side: str, pass_index: int, position: int) -> Start:
        got = replay.get((pass_index, position))
        if got is not None and got.side == side and got.placement == placement:
            replayed[0] += got.wall_s
        else:
            got = run_start(target, side, pass_index, position, rounds, warmup_calls)
            record(got)
        starts.append(got)
        return got

    together = placement == placements.TOGETHER
    index = {k: i for i, k in enumerate(keys)}

    def adjacent(a: str, b: str) -> bool:
        return abs(index[a] - index[b]) == 1

    def one_pass(order: list[str], pass_index: int) -> list[Start]:
        if not together:
            return [one(side, pass_index, pos) for pos, side in enumerate(order)]
        got = [replay.get((pass_index, pos)) for pos in range(len(order))]
        if all(
            g is not None and (g.side, g.placement) == (side, placement) for g, side in zip(got, order, strict=True)
        ):
            replayed[0] += sum(g.wall_s for g in got)
        else:  # not all there: a start's calls with both neighbours are recorded when it stops
            got = run_pass_together(target, order, pass_index, rounds, warmup_calls, adjacent, record)
        starts.extend(got)
        return got

    for i, side in enumerate([] if together else keys):
        got = one(side, WARM, i)
        out(f"warm start {side[:12]}: " + (f"failed: {got.error}" if got.error else f"{got.wall_s:.0f} s"))
    pairs = list(range(len(keys) - 1))
    state: dict[int, Paired] = {}
    lost: dict[int, str] = {}
    open_pairs, passes, looks, reason = pairs, 0, 0, None
    want = first_passes
    while True:
        active = list(open_pairs)
        while open_pairs and len(pair_blocks(starts, keys[open_pairs[0]], keys[open_pairs[0] + 1])) < want:
            sides = covering(keys, open_pairs)
            # The first look's passes are the fewest a design reads a pair from, and they run whole, over the budget
            # where they must (the plan says so before anything runs): a pair's two blocks here are processes
            # started at different times and ages, whose offsets the two-block floor (stats.TWO_BLOCKS_OFFSET_SD,
            # from pairs started at once) does not bound. Later passes start only where the next still fits.
            if looks > 0 and spent() + _pass_cost(starts, len(sides)) > budget_s:
                reason = f"the budget ({budget_s / 60:.1f} min) allows no further pass"
                break
            for got in one_pass(pass_order(sides, passes), passes):
                for p in open_pairs:
                    if got.error and got.side in (keys[p], keys[p + 1]):
                        lost.setdefault(p, f"pass {passes + 1}: {got.side}'s start failed: {got.error}")
            passes += 1
            out(f"pass {passes} over {len(sides)} commits ({spent() / 60:.1f} of {budget_s / 60:.1f} min)")
            open_pairs = [p for p in open_pairs if p not in lost]
        looks += 1
        for p in active:
            blocks = pair_blocks(starts, keys[p], keys[p + 1])
            ratio, decision = decide(blocks, level, min_effect, floor)
            undecided = decision is None or decision.word == stats.UNDECIDED
            why = lost.get(p) or (reason if undecided else None)
            wall = sum(b.wall_s for b in blocks)
            stopped = FAILED if p in lost else BUDGET if undecided else DECIDED
            state[p] = Paired(blocks, ratio, decision, level, looks, wall, why, lost=p in lost, stopped=stopped)
        open_pairs = [p for p in active if not state[p].lost and _undecided(state[p])]
        if not open_pairs or reason or looks >= max_looks:
            break
        want = 2 * len(pair_blocks(starts, keys[open_pairs[0]], keys[open_pairs[0] + 1]))
    for p in open_pairs:
        state[p].reason = state[p].reason or reason or f"{looks} looks taken, the most allowed"
        state[p].stopped = BUDGET if reason else LOOKS
    return Design(keys, {keys[p + 1]: state[p] for p in pairs}, starts, passes, spent())


def _undecided(paired: Paired) -> bool:
    return paired.decision is None or paired.decision.word == stats.UNDECIDED


def _pass_cost(starts: list[Start], n: int) -> float:
    """Seconds the next pass of n starts will take, at the mean start of the latest pass (the first pass of a
    together design compiles every commit's graph cold, so the mean of all passes over-predicts the later ones)."""
    counted = [s for s in starts if s.pass_index != WARM]
    if not counted:
        return 0.0
    last = [s.wall_s for s in counted if s.pass_index == counted[-1].pass_index]
    return n * sum(last) / len(last)


def alive_text(where: str) -> str:
    """How many engines a design of this placement keeps alive, for plans and results."""
    if where == placements.TOGETHER:
        return "two engines alive, each commit called with the one before it and then the one after"
    return "one engine at a time"


def least_starts(commits: int, first_passes: int = ALTERNATE_FIRST_BLOCKS, warm: bool = True) -> int:
    """Starts a design over `commits` walked commits (plus its base) takes at least: a warm start (alternate) and
    first_passes counted ones each."""
    return (commits + 1) * (int(warm) + first_passes)


def most_starts(
    commits: int, first_passes: int = ALTERNATE_FIRST_BLOCKS, max_looks: int = MAX_LOOKS, warm: bool = True
) -> int:
    """Starts it takes at most: every pair undecided at every look, the passes doubling over all commits."""
    return (commits + 1) * (int(warm) + first_passes * 2 ** (max_looks - 1))


__all__ = [
    "Design",
    "alive_text",
    "Start",
    "covering",
    "journal_writer",
    "least_starts",
    "measure",
    "most_starts",
    "pass_order",
    "read_journal",
    "result_path",
    "run_pass_together",
]
