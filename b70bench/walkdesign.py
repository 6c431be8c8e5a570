"""`revisions --design`: a walk's decode verdicts measured as one design (paired.chain) before asv runs.

The commits of the range and the parent of its first (the base) are started once a pass, one engine at a time (where
`auto` places a pair together, check_placement refuses the design: TOGETHER_NOT_RUN), and each commit's result
against the commit before it is written where the decode adapter reads it (chain.result_path under DESIGN_DIR), so
asv records the same figures, and the page the same verdicts, as a per-pair walk would. What a design saves is
starts: N + 1 a pass instead of 2N (chain.least_starts beside stopping.least_starts).
"""

from __future__ import annotations

import hashlib
import math
import os
import tempfile
from pathlib import Path

from b70bench import patches, records, sides
from b70bench.decode import budget as decode_budget
from b70bench.decode import pair as decode_pair
from b70bench.errors import UsageError
from b70bench.history import export_patches, git
from b70bench.paired import chain, stopping
from b70bench.paired import placement as placements
from b70bench.paired.blocks import SIDES
from b70bench.stack import description, shapes


def base_of(repo: Path, first: str) -> str:
    """The commit the design's first walked commit is measured against: its first parent."""
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", f"{first}^")
    except UsageError:
        raise UsageError(
            f"{first[:12]} has no parent in {repo}: a design measures each commit against the one before it; start "
            f"the range one commit later"
        ) from None


def settings_for(stack: description.Stack, commits: int) -> dict:
    """The design's shapes, rounds a start, per-look level, effect and budget: the walk's own (decode.budget, the same
    overall level), the budget being the per-pair walk's for all its commits together."""
    backend = stack.resolved_backend()
    walk = decode_budget.walk_budget(stack, backend)
    each = walk.budget_min
    return {
        "backend": backend,
        "shapes": shapes.walk_shapes(os.environ.get("B70BENCH_DECODE_SHAPES"), stack.shapes, backend),
        "rounds": walk.rounds,
        "level": stopping.per_look_level(stopping.WALK_LEVEL),
        "min_effect": walk.min_effect,
        "budget_min": each * commits,
        "budget_source": f"{each:g} min a commit ({walk.budget_why}) x {commits}",
    }


# Why a design is not run where two engines of the stack fit at once (placement together), for plans and refusals.
TOGETHER_NOT_RUN = (
    "two engines of this stack fit at once, where the per-pair walk placed together is the measured choice: a "
    "design placed together named no-op commits faster or slower from passes that agreed (its engines of one pair "
    "started a start apart; the 2-core VM, docs/patch-sets-and-asv.md), where the per-pair walk named none"
)


def check_placement(where: str) -> None:
    """Refuse a design where `where` (the placement auto gives the stack) is together: TOGETHER_NOT_RUN."""
    if where == placements.TOGETHER:
        raise UsageError(f"--design: {TOGETHER_NOT_RUN}; drop --design")


def starts_range(commits: int, where: str, first_blocks: int = stopping.WALK_FIRST_BLOCKS) -> tuple[int, int]:
    """Starts a design over `commits` walked commits takes at least and at most, placed `where` (together: no warm
    starts, the per-pair first look's blocks as passes; alternate: a warm start each and its longer first look)."""
    first = stopping.first_look_blocks(first_blocks, where)
    warm = where == placements.ALTERNATE
    return chain.least_starts(commits, first, warm), chain.most_starts(commits, first, warm=warm)


def plan_lines(stack: description.Stack, commits: int) -> list[str]:
    """Starts (and minutes, where the stack states what a start and a call cost) of the design beside the per-pair
    walk's, at least (every pair decided at the first look) and at most (every look taken)."""
    s = settings_for(stack, commits)
    where, _why = placements.choose(placements.AUTO, s["backend"], stack)
    first = stopping.first_look_blocks(stopping.WALK_FIRST_BLOCKS, where)
    per_pair_least = commits * stopping.least_starts(stopping.WALK_FIRST_BLOCKS, where)
    warm = len(SIDES) if where == placements.ALTERNATE else 0
    per_pair_most = commits * (warm + len(SIDES) * first * 2 ** (stopping.MAX_LOOKS - 1))
    least, most = starts_range(commits, where)
    lines = [
        f"design: {commits + 1} commits (the base and {commits} walked), {chain.alive_text(where)}, each started once "
        f"a pass, forward then back; {s['rounds']} timed calls a start and neighbour; a first look of {first} "
        f"passes, run whole; budget {s['budget_min']:g} min a shape ({s['budget_source']}) for the passes after it; "
        f"shapes {' '.join(s['shapes'])}",
        f"  starts a shape: at least {least}, at most {most}; per pair ({where} here): at least {per_pair_least}, "
        f"at most {per_pair_most} ({least / per_pair_least:.0%} at least)",
    ]
    if stack.start_s and stack.call_s is not None:
        calls = s["rounds"] + decode_pair.DEFAULT_WARMUP_CALLS
        per_start = stopping.start_cost_s(stack.start_s, stack.call_s, calls)
        first_min = least * per_start / 60
        each = math.ceil(first_min / commits)
        over = f" (the first look runs past the budget: set {decode_budget.BUDGET_ENV}={each} a commit or more)"
        lines.append(
            f"  minutes a shape at the stack's start {stack.start_s:g} s and call {stack.call_s:g} s: at least "
            f"{first_min:.0f} (per pair {per_pair_least * per_start / 60:.0f}), at most the budget"
            + (over if first_min > s["budget_min"] else "")
        )
    return lines


def usable(dirs: dict[str, Path], env: patches.Env, out=print) -> dict[str, Path]:
    """The commits whose series apply and whose trees build (built trees are cached, so the design's sides reuse
    them): a commit that does not is left out, its child measured against the commit before it, as a per-pair walk
    skips a broken parent; the walk records the build failed. A base that does not is refused in one line."""
    kept = {}
    for i, (key, series) in enumerate(dirs.items()):
        try:
            sides.check_usable(series, env)
        except UsageError as err:
            if i == 0:
                why = f"the design's base {key[:12]} cannot be used ({err})"
                raise UsageError(f"{why}: start the range after it") from None
            out(f"  {key[:10]}: left out of the design ({err})")
            continue
        kept[key] = series
    if len(kept) < 2:
        raise UsageError("no commit of the range builds: nothing to measure as a design")
    return kept


def measure_chain(
    repo: Path,
    keys: list[str],
    stack: description.Stack,
    env: patches.Env,
    python: str,
    rule: stopping.Rule,
    shape: str,
    journal_dir: Path,
    out=print,
    tag: str = "",
    **series_kw,
) -> dict[str, dict]:
    """`keys` (commits in order, the first the base) measured as one design at one shape: {commit: its result
    against the commit before it that builds}. Starts are journalled under journal_dir, keyed by the commits kept,
    the shape and `tag` (what else the verdicts depend on): the same call after a kill replays them and goes on from
    the next start. series_kw: more of decode.pair.design_series' options (tests: engine_cls, spec)."""
    with tempfile.TemporaryDirectory(prefix="b70bench-design-") as tmp:
        dirs = {k: export_patches(repo, k, Path(tmp) / k / "patches") for k in keys}
        with patches.env_lock(env, f"b70bench design over {len(keys)} commits (overlays)"):
            dirs = usable(dirs, env, out)
            kept = hashlib.sha256(" ".join([*dirs, tag] if tag else dirs).encode()).hexdigest()[:10]
            return decode_pair.design_series(
                dirs,
                env,
                Path(tmp) / "work" / shape,
                rule,
                shape=shape,
                python=python,
                backend=stack.resolved_backend(),
                stack=stack,
                cache_dir=sides.paired_cache_dir(),
                journal=Path(journal_dir) / f"journal-{shape}-{kept}.jsonl",
                out=out,
                **series_kw,
            )


def measure(
    repo: Path, commits: list[str], stack: description.Stack, env: patches.Env, python: str, folder: Path, out=print
) -> None:
    """Measure the range as one design, each shape in turn, and write each commit's result to folder (result_path),
    where the decode adapter reads it."""
    s = settings_for(stack, len(commits))
    keys = [base_of(repo, commits[0]), *commits]
    rule = stopping.Rule.walk(s["budget_min"] * 60, s["rounds"], s["min_effect"])
    for shape in s["shapes"]:
        out(f"design {shape}: {keys[0][:10]} (base) and {len(commits)} commits")
        results = measure_chain(repo, keys, stack, env, python, rule, shape, folder, lambda line: out(f"  {line}"))
        for commit, res in results.items():
            path = chain.result_path(folder, commit, shape)
            path.parent.mkdir(parents=True, exist_ok=True)
            records.emit_json(path, res)
            out(f"  {commit[:10]}: {res['text']} ({res['blocks']} blocks)")
