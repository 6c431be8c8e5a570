"""`b70bench bisect GOOD BAD`: which commit of a range carries a change, found by paired verdicts.

First GOOD against BAD. "No change beyond X%": the range is done in one verdict. Slower or faster: the range is
halved, the older end against the middle commit, until two neighbouring commits hold the change; then that commit's
own verdict against its parent (unless the search measured exactly that pair) and the commit against BAD, so a
second change after it is said, never guessed. A verdict that is neither the range's direction nor "no change"
(undecided, the other direction, tokens that differ) stops the search with what was decided and what was not.

Every verdict is `compare`'s (its options, its rule). Each is kept in a log (bisect.jsonl beside the asv results),
keyed by the two commits and what else the verdict depends on, so the same bisect run again, after a crash or with
a larger budget for what stayed undecided, reuses every verdict it has.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sys
import time
from pathlib import Path

from b70bench import cachekey, children, history, pairing, state, stats, walkdesign, walklog
from b70bench.decode import pair as decode_pair
from b70bench.errors import UsageError
from b70bench.paired import chain, stopping
from b70bench.paired import placement as placements
from b70bench.stack import model as decode_model

FOUND, NO_CHANGE, STOPPED = "found", "no change in the range", "stopped"
WITHHELD = "tokens differ"  # B's speed withheld: a numerics change, not a speed verdict


def word(res: dict) -> str:
    """The verdict a search step acts on: compare's word, or WITHHELD where B's tokens differ from A's."""
    if (res.get("sides") or {}).get("B", {}).get("gate") == 1:
        return WITHHELD
    return res.get("verdict") or stats.UNDECIDED


def most_verdicts(commits: int) -> int:
    """Verdicts a bisect of `commits` commits takes at most: the range, the halvings, the found one's own, the rest."""
    return 1 + math.ceil(math.log2(commits)) + 2 if commits > 1 else 2


def search(revs: list[str], measure, out=print) -> dict:
    """revs: GOOD, then the range's commits oldest first (BAD last). measure(a, b) -> compare's result for B = b
    against A = a. Returns the outcome, the found commit (or None), the steps and one line for each thing decided."""
    steps: list[dict] = []

    def verdict(i: int, j: int, why: str) -> str:
        res = measure(revs[i], revs[j])
        steps.append({"a": revs[i], "b": revs[j], "why": why, "word": word(res), **_figures(res)})
        out(f"  [{len(steps)}] {revs[j][:10]} against {revs[i][:10]} ({why}): {_text(res)}")
        _say_key(res, out)
        return steps[-1]["word"]

    first = verdict(0, len(revs) - 1, "the range")
    if first == stats.NO_CHANGE:
        return _outcome(NO_CHANGE, None, steps, [f"no change between {revs[0][:10]} and {revs[-1][:10]}"])
    if first not in (stats.SLOWER, stats.FASTER):
        return _outcome(STOPPED, None, steps, [f"the range is {first}: nothing to bisect (more budget may decide it)"])
    lo, hi, measured = 0, len(revs) - 1, {(0, len(revs) - 1)}
    while hi - lo > 1:
        mid = (lo + hi) // 2
        got = verdict(lo, mid, "halving")
        measured.add((lo, mid))
        if got == first:
            hi = mid
        elif got == stats.NO_CHANGE:
            lo = mid
        else:
            said = [
                f"{first} between {revs[0][:10]} and {revs[-1][:10]}; {revs[mid][:10]} against {revs[lo][:10]} is "
                f"{got}: the change lies between {revs[lo][:10]} and {revs[hi][:10]}, not placed further"
            ]
            return _outcome(STOPPED, None, steps, said, between=(revs[lo], revs[hi]))
    found = revs[hi]
    said = []
    own = verdict(lo, hi, "its own, against its parent") if (lo, hi) not in measured else first
    if own != first:  # the halvings say the change is here, its own verdict does not: several smaller steps
        said.append(f"{found[:10]} against its parent is {own}: the {first} range is not carried by one commit")
        return _outcome(STOPPED, None, steps, said, between=(revs[lo], revs[hi]))
    said.append(f"{found[:10]} is {first} against its parent {revs[lo][:10]}")
    if hi < len(revs) - 1:
        rest = verdict(hi, len(revs) - 1, "the rest of the range")
        if rest == stats.NO_CHANGE:
            said.append(f"no change after it up to {revs[-1][:10]}: it carries the range's change")
        elif rest == stats.UNDECIDED:  # not a second change: one that these blocks could not rule out
            said.append(
                f"after it up to {revs[-1][:10]} is undecided: whether another change lies there is not decided "
                f"(b70bench bisect {found[:10]} {revs[-1][:10]} with a larger --budget)"
            )
        else:
            said.append(
                f"after it up to {revs[-1][:10]} is {rest}: another change lies there "
                f"(b70bench bisect {found[:10]} {revs[-1][:10]})"
            )
    return _outcome(FOUND, found, steps, said, parent=revs[lo])


# Segments a design step splits its range into: each step starts ways + 1 commits a pass, and a change is placed
# in log_ways(commits) steps. Four is about where a step's extra starts stop paying for the steps they save.
WAYS = 4


def spread(lo: int, hi: int, ways: int = WAYS) -> list[int]:
    """The indices a design step over revs[lo..hi] starts: both ends and ways - 1 commits evenly between them (every
    commit where the range holds `ways` or fewer)."""
    return sorted({lo + round(k * (hi - lo) / ways) for k in range(ways + 1)})


def design_steps(commits: int, ways: int = WAYS) -> list[int]:
    """Segments of each step a design bisect of `commits` commits takes to place one change, the widest way down."""
    out, n = [], commits
    while True:
        points = spread(0, n, ways)
        out.append(len(points) - 1)
        n = max(b - a for a, b in zip(points, points[1:], strict=False))
        if n <= 1:
            return out


def search_design(revs: list[str], measure_chain, out=print, ways: int = WAYS) -> dict:
    """revs as search's. measure_chain(commits) -> {commit: its result against the commit before it in the list} for
    commits measured as one design. Each step measures a range's ends and ways - 1 commits between them; a segment
    slower or faster is searched the same way until it is one commit, one with no change is done, and anything else
    (undecided, tokens that differ, a commit left out) is said as not decided. Several changes are each found."""
    steps: list[dict] = []
    found: list[tuple[str, str, str]] = []  # (commit, parent, word)
    open_: list[str] = []  # what was not decided
    todo, costs, segments = [(0, len(revs) - 1)], [], 0
    while todo:
        lo, hi = todo.pop(0)
        points = [revs[i] for i in spread(lo, hi, ways)]
        got = measure_chain(points)
        costs.append(next((r["design"] for r in got.values() if r.get("design")), {}))
        segments = segments or len(points) - 1
        kept = [points[0], *(c for c in points[1:] if c in got)]  # a commit whose series fails is left out
        for c in points[1:]:
            if c not in got:
                out(f"  {c[:10]}: left out of the design (its patch set does not apply or build)")
        for a, b in zip(kept, kept[1:], strict=False):
            i, j = revs.index(a), revs.index(b)
            res = got[b]
            w = word(res)
            steps.append({"a": a, "b": b, "why": f"design {len(costs)}", "word": w, **_figures(res)})
            out(f"  [{len(steps)}] {b[:10]} against {a[:10]} ({j - i} commit{'' if j - i == 1 else 's'}): {_text(res)}")
            _say_key(res, out)
            if w in (stats.SLOWER, stats.FASTER):
                if j - i == 1:
                    found.append((b, a, w))
                elif (i, j) == (lo, hi):  # every commit between them left out: nothing narrows it further
                    open_.append(f"{b[:10]} is {w} against {a[:10]}; the commits between them cannot be measured")
                else:
                    todo.append((i, j))
            elif w != stats.NO_CHANGE:
                what = "B's speed withheld (tokens differ)" if w == WITHHELD else w
                open_.append(f"{b[:10]} against {a[:10]}: {what}; whether a change lies there is not decided")
    said = [f"{b[:10]} is {w} against its parent {a[:10]}" for b, a, w in found] + open_
    more = {
        "designs": len(costs),
        "found_all": [b for b, _a, _w in found],
        "starts": sum(c.get("starts") or 0 for c in costs),  # a design's starts serve several verdicts: count once
        "minutes": sum(c.get("minutes") or 0 for c in costs),
    }
    if not found and not open_:
        line = f"no change between {revs[0][:10]} and {revs[-1][:10]} in any of its {segments} segments"
        return _outcome(NO_CHANGE, None, steps, [line], **more)
    if found and not open_:
        return _outcome(FOUND, found[0][0], steps, said, parent=found[0][1], **more)
    return _outcome(STOPPED, None, steps, said, **more)


def _figures(res: dict) -> dict:
    return {k: res.get(k) for k in ("ratio", "lo", "hi", "text", "blocks", "starts", "minutes", "key_change")}


def _say_key(res: dict, out) -> None:
    """The verdict's compile-cache key line, as compare and the walk print it (decode: both sides' keys)."""
    if res.get("key_change"):
        out(f"      compile-cache key: {cachekey.change_line(res['key_change'])}")


def _text(res: dict) -> str:
    if word(res) == WITHHELD:
        return "B's speed withheld: tokens differ from A's"
    return f"{res.get('text') or word(res)}; {res.get('blocks', 0)} blocks, {res.get('starts', 0)} starts, " + (
        f"{res.get('minutes') or 0:.1f} min"
    )


def _outcome(outcome: str, found: str | None, steps: list[dict], said: list[str], **more) -> dict:
    return {
        "outcome": outcome,
        "found": found,
        "steps": steps,
        "verdicts": len(steps),
        "starts": sum(s.get("starts") or 0 for s in steps),
        "minutes": sum(s.get("minutes") or 0 for s in steps),
        "said": said,
        **more,
    }


class Log:
    """The verdicts of earlier bisects, by (A, B, what else they depend on): a rerun measures only what is new.
    A verdict that was undecided or failed is measured again."""

    def __init__(self, path: Path, inputs: dict):
        self.path, self.inputs = path, inputs
        self.key = hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def get(self, a: str, b: str) -> dict | None:
        for row in reversed(walklog.read(self.path)):
            if row.get("key") == self.key and row.get("a") == a and row.get("b") == b:
                return row["result"] if row["result"].get("verdict") != stats.UNDECIDED else None
        return None

    def add(self, a: str, b: str, res: dict) -> None:
        keep = {"verdict": res.get("verdict"), **_figures(res)}
        keep["sides"] = {"B": {"gate": (res.get("sides") or {}).get("B", {}).get("gate")}}
        walklog.append(self.path, {"key": self.key, "a": a, "b": b, "result": keep, "at": time.time()})


def plan_lines(args, pre, revs: list[str]) -> list[str]:
    """What a bisect may cost, beside a walk of every commit against its parent at the same budget, and --design's.
    Minutes at least where the stack states what a start and a call cost."""
    n = len(revs) - 1
    least = stopping.least_starts(stopping.DEFAULT_FIRST_BLOCKS, pre.where)
    most = most_verdicts(n)
    verdict_s = pairing.first_look_cost_s(args, pre.stack, pre.where, pre.dev.backend, pre.spend)
    at_least = f"~{verdict_s / 60:.0f} min at least, " if verdict_s else ""
    return [
        f"plan: b70bench bisect {revs[0][:10]} {revs[-1][:10]}: {n} commits, {pre.stack.describe()}",
        f"  placement: {pre.where} ({pre.why}); each verdict is compare's: budget {pairing.budget_text(args)}, "
        f"{least} counted starts at least",
        f"  bisect: 1 verdict at least (no change in the range), {most} at most; {least} to {least * most}+ starts, "
        f"{at_least}at most ~{most * args.budget:g} min",
        f"  a walk of each commit against its parent instead: {n} verdicts, {least * n}+ starts, at most "
        f"~{n * args.budget:g} min",
        design_plan_line(args, pre, n),
        *pairing.spend_lines(pre.spend),
    ]


def design_plan_line(args, pre, commits: int) -> str:
    """What --design costs for one change, in starts (placed as the per-pair bisect is) and minutes; where the
    per-pair bisect is placed together, why --design is not run there."""
    if pre.where == placements.TOGETHER:
        return f"  --design: not run here: {walkdesign.TOGETHER_NOT_RUN}"
    steps = design_steps(commits)
    counts = [walkdesign.starts_range(s, pre.where, stopping.DEFAULT_FIRST_BLOCKS) for s in steps]
    first = counts[0][0]
    least = sum(c[0] for c in counts)
    most = sum(c[1] for c in counts)
    start_s = None
    if args.suite == "decode" and pre.stack.start_s and pre.stack.call_s is not None:
        calls = args.rounds + decode_pair.DEFAULT_WARMUP_CALLS
        start_s = stopping.start_cost_s(pre.stack.start_s, pre.stack.call_s, calls)

    def minutes(starts: int) -> str:
        return f" (~{starts * start_s / 60:.0f} min)" if start_s else ""

    return (
        f"  --design ({WAYS + 1} commits a design, {chain.alive_text(pre.where)}): {len(steps)} designs of "
        f"{', '.join(str(s) for s in steps)} segments for one change; {first} starts{minutes(first)} at least (no "
        f"change in the range), {least}{minutes(least)} to {most} for one change, at most ~{sum(steps) * args.budget:g}"
        " min"
    )


def run(args) -> int:
    if args.suite not in ("decode", "serve"):
        raise UsageError(f"--suite {args.suite}: bisect walks commits of vLLM's series, decode or serve")
    repo = Path(args.repo).resolve()
    ends = []
    for name, rev in (("GOOD", args.good), ("BAD", args.bad)):
        try:
            ends.append(history.git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"))
        except UsageError:
            raise UsageError(f"{name} {rev!r} is not a commit of {repo}: name one (`git log --oneline`)") from None
    commits = history.commits_in(repo, f"{ends[0]}..{ends[1]}")
    revs = [ends[0], *commits]
    pre = pairing.prepare(args)
    if args.design and (args.suite != "decode" or any(pre.settings.values()) or args.max_starts is not None):
        raise UsageError("--design measures commits against each other on the decode suite, by --budget: drop "
                         "--suite serve, the side settings (--a-env, --b-env, ...) and --max-starts, or drop "
                         "--design")  # fmt: skip
    if args.plan:
        print("\n".join(plan_lines(args, pre, revs)))
        return 0
    if args.design:
        walkdesign.check_placement(pre.where)
    log = Log(
        state.asv_results_dir(repo) / "bisect.jsonl",
        {
            "suite": args.suite,
            "shape": args.shape,
            "concurrency": args.concurrency if args.suite == "serve" else None,
            "stack": pre.stack.hash(),
            "settings": {s: v.to_json() for s, v in pre.settings.items()},
            "level": args.level,
            "min_effect": args.min_effect,
            "floor": args.floor,
        },
    )
    out_dir = (
        Path(args.out_dir) if args.out_dir else decode_model.cache_root() / "bisect" / time.strftime("%Y%m%dT%H%M%S")
    )
    children.unwind_on_sigterm()  # SIGTERM stops and reaps every engine on the way out, as Ctrl-C does

    if args.design:
        rule = pairing.rule(args)
        journal_dir = log.path.parent / "bisect-design"

        def measure_chain(commits: list[str]) -> dict:
            step = dataclasses.replace(rule, budget_s=rule.budget_s * (len(commits) - 1))
            say = lambda line: print(f"    {line}", flush=True)  # noqa: E731
            return walkdesign.measure_chain(
                repo, commits, pre.stack, pre.env, pre.python, step, args.shape, journal_dir, say,
                tag=f"{log.key} rounds {args.rounds} {pre.where}", placement=pre.where,
            )  # fmt: skip

        print(
            f"b70bench bisect --design {revs[0][:10]}..{revs[-1][:10]} ({len(commits)} commits): "
            f"{pre.stack.describe()}; {WAYS + 1} commits a design, {chain.alive_text(pre.where)}; budget "
            f"{pairing.budget_text(args)} a segment; starts journalled in {journal_dir}",
            flush=True,
        )
        res = search_design(revs, measure_chain, out=lambda line: print(line, flush=True))
        return report(args, res)

    def measure(a: str, b: str) -> dict:
        known = log.get(a, b)
        if known is not None:
            print(f"  (measured before: {b[:10]} against {a[:10]})", flush=True)
            return known
        res, _labels = pairing.measure(args, pre, a, b, out_dir / f"{a[:10]}-{b[:10]}", say=False)
        if res.get("blocks"):
            log.add(a, b, res)
        return res

    print(
        f"b70bench bisect {revs[0][:10]}..{revs[-1][:10]} ({len(commits)} commits): {pre.stack.describe()}; "
        f"placement {pre.where}; budget {pairing.budget_text(args)} a verdict; verdicts logged in {log.path}",
        flush=True,
    )
    res = search(revs, measure, out=lambda line: print(line, flush=True))
    return report(args, res)


def report(args, res: dict) -> int:
    """The outcome, what each verdict decided, the cost; the found commit's page verdict command; --json."""
    print()
    print(f"{res['outcome']}: " + "; ".join(res["said"]))
    n = res["verdicts"]
    designs = f"{res['designs']} design{'' if res['designs'] == 1 else 's'}, " if "designs" in res else ""
    print(f"{designs}{n} verdict{'' if n == 1 else 's'}, {res['starts']} starts, {res['minutes']:.1f} min")
    if res["found"]:
        print(
            f"its verdict on the page: b70bench revisions {res['found'][:10]}^..{res['found'][:10]} --python "
            f"{args.python or sys.executable}" + (f" --stack {args.stack}" if args.stack else "")
        )
    if args.json:
        from b70bench import records

        records.emit_json(args.json, res)
    return 0 if res["outcome"] in (FOUND, NO_CHANGE) else 1


def register(sub) -> None:
    p = sub.add_parser(
        "bisect",
        help="which commit of GOOD..BAD carries a change: paired verdicts over a bisection of the range",
        description="GOOD against BAD first; if slower or faster, halve the range with paired verdicts (compare's) "
        "until the commit that carries the change is found, then its own verdict against its parent and the rest of "
        "the range against it (a second change is said, not guessed). Verdicts are logged and reused when the same "
        "bisect runs again. --plan prints the verdicts, starts and minutes at least and at most, beside a walk's.",
    )
    p.add_argument("good", help="the commit before the change (excluded from the range)")
    p.add_argument("bad", help="the commit with it")
    p.add_argument(
        "--design",
        action="store_true",
        help=f"decode: measure {WAYS + 1} commits of the range at a time as one design (each started once a pass, "
        "one engine at a time (refused where two fit), every start serving both neighbours' verdicts), then the "
        "segment that changed the same way, until one commit; --plan says whether it takes fewer starts than the "
        "per-pair bisect",
    )
    pairing.add_measure_options(p, ("decode", "serve"))
    p.set_defaults(func=run)
