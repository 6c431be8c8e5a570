"""`b70bench revisions RANGE --python PATH`: walk commits on an environment asv cannot build.

A locally built vLLM on XPU, an existing CUDA environment: asv's managed environments cannot
reproduce them, and `environment_type: existing` cannot walk a range. This does it: for each
commit (oldest first) apply that commit's patches/ series to the environment of PATH, run
`asv run -E existing:PATH --set-commit-hash SHA`, restore, go on. The environment is locked
for the whole walk. A Ctrl-C restores before exiting; after a hard kill the same command restores
what the killed walk left patched and goes on inside the commit it was in (its finished blocks are
journaled: walkfollow, paired.journal), and `b70bench revisions --restore --python PATH` only restores.
While it runs, each block reaches this process's stdout and `revisions --status` says where it is.
"""

from __future__ import annotations

import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from b70bench import (
    cachekey,
    children,
    figures,
    options,
    patches,
    side_settings,
    state,
    walkdesign,
    walkfollow,
    walklog,
)
from b70bench.decode import budget as decode_budget
from b70bench.errors import UsageError
from b70bench.history import commits_in, export_patches, git
from b70bench.paired import chain, report, stopping
from b70bench.paired import placement as placements
from b70bench.paired.blocks import SIDES
from b70bench.serve import suite as serve_suite
from b70bench.stack import description, shapes

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Walker:
    python: str
    repo: Path = ROOT
    site_dir: str | None = None  # tests: a pip --target directory instead of the env's site-packages
    prefix: Path | None = None

    def __post_init__(self):
        self.prefix = Path(self.prefix) if self.prefix else patches.env_prefix(self.python)
        self.env = patches.Env(self.prefix, (self.site_dir,) if self.site_dir else None)

    def env_vars(self) -> dict[str, str]:
        """What tells the adapters where this walk looks for distributions (patches.Env.from_environ reads it), so
        each paired side's overlay is built from the same install the walk patched (an editable one: its tree)."""
        if not self.site_dir:
            return {}
        return {patches.SITE_DIR_ENV: str(self.site_dir), patches.PREFIX_ENV: str(self.prefix)}

    def sites(self) -> list[Path]:
        """The environment's site-packages (a build must not install there)."""
        if self.site_dir:
            return [Path(self.site_dir)]
        code = "import sysconfig; print(*{sysconfig.get_paths()[k] for k in ('purelib', 'platlib')}, sep='\\n')"
        done = subprocess.run([self.python, "-c", code], capture_output=True, text=True, timeout=120)
        return [Path(p) for p in done.stdout.split()] if done.returncode == 0 else patches.trees.shared_sites()

    def patches_cmd(self, *args: str, token: str | None = None) -> subprocess.CompletedProcess:
        extra = ["--site-dir", self.site_dir, "--prefix", str(self.prefix)] if self.site_dir else []
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        if token:
            env[patches.LOCK_TOKEN_ENV] = token
        return subprocess.run(
            [self.python, "-m", "b70bench.patches", *args, *extra],
            env=env,
            capture_output=True,
            text=True,
            timeout=3600,
        )

    def restore(self, token: str | None = None) -> subprocess.CompletedProcess:
        return self.patches_cmd("restore", token=token)

    def restore_command(self) -> str:
        """The command that restores what this walk patches (its --site-dir and --prefix included)."""
        where = f" --site-dir {self.site_dir} --prefix {self.prefix}" if self.site_dir else ""
        return f"b70bench revisions --restore --python {self.python}{where}"


def asv_command(python: str, commit: str, asv_args: list[str]) -> list[str]:
    # --record-samples: the decode figures keep one sample per start for b70bench's verdicts (asv_plugin).
    return [
        sys.executable,
        "-m",
        "asv",
        "run",
        "-E",
        f"existing:{python}",
        "--set-commit-hash",
        commit,
        "--record-samples",
        *asv_args,
    ]


def shard(commits: list[str], spec: str | None) -> list[str]:
    """The commits of shard K/N (1-based): every Nth commit from the Kth, so each machine gets old and new ones.
    Each verdict needs only its commit and that commit's parent, so shards are independent."""
    if not spec:
        return commits
    k, _, n = spec.partition("/")
    if not (k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
        raise UsageError(f"--shard {spec!r}: write K/N with 1 <= K <= N, e.g. --shard 2/3 for the second of three")
    return commits[int(k) - 1 :: int(n)]


def build_trees(
    ps: patches.PatchSet,
    builds: Path | None,
    dest: Path,
    out=print,
    sites: list[Path] | None = None,
    python: str | None = None,
) -> list[str]:
    """The series' source trees built (or found built) for this commit, their Python files placed over the copies in
    dest; the import paths, first first. `sites`: the walked environment's site-packages, which a build must not
    install into; `python`: its interpreter, first on the build command's PATH."""
    return patches.overlay.built_trees(ps.patches, dest, builds, out=out, sites=sites, python=python)


@dataclass
class Record:
    """Where a walk records each finished commit (walklog) and what makes two walks of a commit the same."""

    file: Path | None = None
    inputs: dict | None = None  # asv arguments and stack; the commit and patch set are added per commit

    def finished(self, commit: str, patch_set_hash: str) -> dict | None:
        if self.file is None:
            return None
        return walklog.finished(walklog.read(self.file), self._key(commit, patch_set_hash))

    def add(self, row: dict) -> None:
        if self.file is not None:
            walklog.append(self.file, {**row, **self._key(row["commit"], row["patch_set_hash"])})

    def _key(self, commit: str, patch_set_hash: str) -> dict:
        return {**(self.inputs or {}), "commit": commit, "patch_set_hash": patch_set_hash}


# Seconds asv and its benchmark processes get to stop their engines after a SIGTERM before SIGKILL.
ASV_GRACE_S = 60.0


def _die_with_parent() -> None:
    """In asv's process before it runs: SIGKILL when the walk dies (Linux's PR_SET_PDEATHSIG). A kill -9 of the walk
    runs no `finally`; without this asv, in a session of its own, would go on measuring on an environment the next
    walk restores under it. Its benchmark processes then see asv gone and stop their engines
    (children.unwind_when_orphaned)."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the walk's Ctrl-C and SIGTERM still take asv down
        pass


def run_asv(cmd: list[str], env: dict, cwd: Path) -> int:
    """asv in a process group of its own: whichever way the walk ends (Ctrl-C, SIGTERM, an error), asv and its
    benchmark processes get SIGTERM (the adapters then stop their engines and servers), then SIGKILL."""
    from b70bench.children import kill_group

    proc = subprocess.Popen(cmd, env=env, cwd=cwd, start_new_session=True, preexec_fn=_die_with_parent)
    try:
        return proc.wait()
    finally:
        kill_group(proc.pid, grace_s=ASV_GRACE_S)
        proc.wait()


def walk(
    walker: Walker,
    commits: list[str],
    asv_args: list[str],
    run_benchmarks=None,
    out=print,
    record: Record | None = None,
    builds: Path | None = None,
    follow: walkfollow.Walk | None = None,
) -> list[dict]:
    """Build, apply, benchmark, restore per commit; returns one row per commit. Restores on any exit.

    A commit whose series patches source trees gets built copies of them (patches.trees; cached): the benchmarks
    import those (ASV_PYTHONPATH), the user's trees are only read. A failed build is recorded and the walk goes on;
    a commit the record holds as finished for the same inputs is skipped (an interrupted walk resumes).

    follow (walkfollow.Walk): the walk's state file says which commit is under way, asv's benchmark processes report
    each block there (said through `out` as it comes) and journal their blocks, so a killed walk resumes inside the
    commit it was measuring. An environment a killed walk of these commits left patched is restored first."""
    run_benchmarks = run_benchmarks or (lambda cmd, env: run_asv(cmd, env, walker.repo))
    record = record or Record()
    rows = []
    with (
        patches.env_lock(walker.env, f"b70bench revisions over {len(commits)} commits") as token,
        tempfile.TemporaryDirectory(prefix="b70bench-revisions-") as tmp,
    ):
        journal = patches.read_journal(walker.env)
        if journal is not None and journal.get("commit") in commits:
            # Inside the lock, so no walk is using it: a walk of these commits was killed while one was applied
            # (revisions applies with --commit). Restoring is what it would have done next.
            back = walker.restore(token)
            if back.returncode != 0:
                raise UsageError(
                    f"{walker.prefix} was left patched by a killed walk at {journal['commit'][:10]} and restoring it "
                    f"failed: {(back.stderr or back.stdout).strip()[-300:]}; fix that, then "
                    f"`{walker.restore_command()}`"
                )
            out(f"restored {walker.prefix}: a killed walk left {journal['commit'][:10]}'s patches applied")
            journal = None
        if journal is not None:  # inside the lock: a walk in progress is "in use", not "left patched"
            applied = ", ".join(journal.get("patches") or []) or "no patch files; a killed walk's journal"
            raise UsageError(
                f"{walker.prefix} already has patches applied or half-applied ({applied}): run "
                f"`{walker.restore_command()}` first"
            )
        sites = walker.sites()
        for i, commit in enumerate(commits, 1):
            row = {
                "commit": commit,
                "patch_set_hash": None,
                "outcome": None,
                "applied": False,
                "asv_rc": None,
                "restored": False,
                "error": None,
            }
            rows.append(row)
            pdir = export_patches(walker.repo, commit, Path(tmp) / commit / "patches")
            try:
                ps = patches.load(pdir)
            except UsageError as err:
                row["error"] = str(err)
                out(f"[{i}/{len(commits)}] {commit[:10]}: its series cannot be read (nothing changed): {err}")
                continue
            row["patch_set_hash"] = ps.hash
            done = record.finished(commit, ps.hash)
            if done is not None:
                row.update(outcome=done["outcome"], asv_rc=done.get("asv_rc"), error=done.get("error"), skipped=True)
                out(f"[{i}/{len(commits)}] {commit[:10]}: {done['outcome']} before with the same inputs: skipped")
                continue
            out(f"[{i}/{len(commits)}] {commit[:10]}: patch set {row['patch_set_hash']}")
            if follow is not None:
                follow.at(i, commit)
            try:
                paths = build_trees(
                    ps,
                    builds,
                    Path(tmp) / commit / "tree-files",
                    out=lambda line: out(f"  {line}"),
                    sites=sites,
                    python=walker.python,
                )
            except patches.trees.BuildFailed as err:
                row.update(outcome=walklog.BUILD_FAILED, error=str(err), build=err.record)
                out(f"  build failed, not measured: {err}")
                record.add(row)
                continue
            except UsageError as err:
                row["error"] = str(err)
                out(f"  cannot build (nothing changed): {err}")
                continue
            try:
                # Source-tree patches are built into copies (above), never applied to the user's tree; an editable
                # install's become an overlay (its tree is never written either).
                dist = [p for p in ps.patches if p.target.kind == "dist"]
                applied = patches.subset(ps, dist, Path(tmp) / commit / "dist")
                editable = Path(tmp) / commit / "editable"
                done = walker.patches_cmd(
                    "apply", "--dir", str(applied), "--commit", commit, "--overlay-dir", str(editable), token=token
                )
                if done.returncode != 0:
                    row["error"] = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1]
                    out(f"  apply failed (nothing changed): {row['error']}")
                    continue
                row["applied"] = True
                # asv gives an existing environment no ASV_COMMIT: the adapters pair on these (benchmarks/common.py).
                env = dict(
                    os.environ,
                    B70BENCH_COMMIT=commit,
                    B70BENCH_REPO=str(walker.repo),
                    **{patches.LOCK_TOKEN_ENV: token},
                    **walker.env_vars(),
                    **(follow.env() if follow is not None else {}),
                )
                if editable.is_dir():
                    paths = [*patches.overlay.python_path(editable), *paths]
                if paths:  # asv drops PYTHONPATH from what it runs; ASV_PYTHONPATH is how it lets one through
                    env["ASV_PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [env.get("ASV_PYTHONPATH")])])
                failures = Path(tmp) / commit / "failures.jsonl"
                env[walklog.FAILURES_ENV] = str(failures)
                cmd = asv_command(walker.python, commit, asv_args)
                out(f"  {shlex.join(cmd)}")
                if follow is None:
                    row["asv_rc"] = run_benchmarks(cmd, env)
                else:
                    started = time.time()
                    context = (f"  [{i}/{len(commits)}] {commit[:10]}", started, follow.plan_min)
                    with walkfollow.Follower(follow.progress, out, lambda c=context: c):
                        row["asv_rc"] = run_benchmarks(cmd, env)
                lost = walklog.read(failures)
                if lost or row["asv_rc"] != 0:
                    # Never "measured": the page says why, and a resumed walk measures the commit again.
                    row["outcome"] = walklog.MEASURE_FAILED
                    row["error"] = "; ".join(f"{f['what']}: {f['reason']}" for f in lost) or (
                        f"asv exited {row['asv_rc']} (a benchmark failed; its stderr is above)"
                    )
                    out(f"  measurement failed: {row['error']}")
                else:
                    row["outcome"] = walklog.MEASURED
                    # The adapters saved each shape's key against the parent's: the same line compare prints.
                    for shape, change in sorted(cachekey.saved_changes(commit).items()):
                        out(f"  {shape}: compile-cache key: {cachekey.change_line(change)}")
                record.add(row)
                if follow is not None and row["outcome"] == walklog.MEASURED:
                    follow.measured(commit)  # its blocks are in asv's results now; a later walk measures afresh
            finally:
                back = walker.restore(token)
                row["restored"] = back.returncode == 0
                if back.returncode != 0:
                    raise UsageError(
                        f"restoring {walker.prefix} after {commit[:10]} failed: "
                        f"{back.stderr.strip()}; the walk stops here"
                    )
    return rows


def check_environment(python: str, stack: description.Stack | None) -> None:
    """Refuse, in one line, to walk an environment asv's benchmark processes cannot run in: b70bench or asv's runner
    not installed there (the adapters import both in that interpreter, not in this checkout), or a stack's backend
    it lacks (a CPU build for a GPU stack). Asked from outside the checkout, so this checkout's b70bench is not what
    answers."""
    fix = f"install them there: {python} -m pip install -e {ROOT} asv_runner"
    got = subprocess.run(
        [python, "-c", "import asv_runner, b70bench"], capture_output=True, text=True, cwd=tempfile.gettempdir()
    )
    if got.returncode != 0:
        missing = (got.stderr.strip().splitlines() or ["?"])[-1]
        raise UsageError(f"the environment of {python} cannot run the benchmarks ({missing}); {fix}")
    if stack is None or not stack.backend or stack.backend == "cpu":
        return
    code = f"from b70bench import device; print(device.device_count({stack.backend!r}))"
    got = subprocess.run([python, "-c", code], capture_output=True, text=True, cwd=tempfile.gettempdir())
    count = got.stdout.strip()
    if got.returncode != 0 or not count.isdigit() or int(count) == 0:
        raise UsageError(
            f"the environment of {python} has no {stack.backend} device (a CPU build?) but stack {stack.name} names "
            f"{stack.backend}: walk with the --python of an environment built for {stack.backend}, or a CPU stack"
        )


def ensure_machine(repo: Path, machine: str) -> None:
    """asv's machine file knows machine (`asv machine --yes`), so `asv run --machine` asks nothing."""
    known = Path(os.path.expanduser("~/.asv-machine.json"))
    if known.exists() and f'"{machine}"' in known.read_text():
        return
    done = subprocess.run(
        [sys.executable, "-m", "asv", "machine", "--yes", "--machine", machine],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise UsageError(f"asv machine --machine {machine} failed: {(done.stderr or done.stdout).strip()[-300:]}")


def _commits(n: int) -> str:
    return f"{n} commit" if n == 1 else f"{n} commits"


def plan_lines(
    walker: Walker,
    commits: list[str],
    record: Record,
    builds: Path | None,
    header: str,
    asv_args: list[str],
    stack: description.Stack,
) -> list[str]:
    """What the walk will do, before it does anything: per commit its trees to build and whether it is finished."""
    lines = [header]
    counts = {"to build": 0, "cached": 0, "failed before": 0, "built by an earlier commit": 0}
    to_measure, keys = 0, set()
    with tempfile.TemporaryDirectory(prefix="b70bench-plan-") as tmp:
        for commit in commits:
            subject = git(walker.repo, "log", "-1", "--format=%s", commit)[:48]
            try:
                ps = patches.load(export_patches(walker.repo, commit, Path(tmp) / commit))
            except UsageError as err:
                lines.append(f"  {commit[:10]}  {subject:48}  series unreadable: {err}")
                continue
            done = record.finished(commit, ps.hash)
            if done is not None:
                lines.append(f"  {commit[:10]}  {subject:48}  {done['outcome']} before: skipped")
                continue
            states = []
            for tree, (command, group) in patches.trees.by_tree(ps.patches).items():
                try:
                    state = patches.trees.planned(tree, group, command, builds, keys)
                except UsageError as err:
                    state = f"unusable ({err})"
                counts[state] = counts.get(state, 0) + 1
                states.append(f"{Path(tree).name}: {state}")
            to_measure += not any(s.endswith("failed before") for s in states)
            lines.append(f"  {commit[:10]}  {subject:48}  {'; '.join(states) or 'no source trees'}")
    lines.append(
        f"builds: {counts['to build']} to build, {counts['cached']} cached, {counts['failed before']} failed before"
        + (f", {counts['built by an earlier commit']} shared" if counts["built by an earlier commit"] else "")
    )
    lines += cost_lines(asv_args, stack, to_measure)
    return lines


# asv's names of the paired suites, matched against `--bench` patterns as asv matches them (re.search).
RATIO_FIGURES = {
    "decode": figures.ratio_figure("bench_decode.Decode"),
    "serve": figures.ratio_figure("bench_serve.Serve"),
}


def selected(asv_args: list[str], name: str) -> bool:
    """Whether `asv run` with asv_args runs benchmark `name` (no --bench/-b: all)."""
    pats = [asv_args[i + 1] for i, a in enumerate(asv_args[:-1]) if a in ("--bench", "-b")]
    pats += [a.split("=", 1)[1] for a in asv_args if a.startswith("--bench=")]
    return not pats or any(re.search(p, name) for p in pats)


def commit_minutes(asv_args: list[str], stack: description.Stack) -> float:
    """The plan's minutes a commit's paired suites may spend at most (cost_lines' "~X min a commit"): what
    `revisions` and `--status` measure a commit's progress and the walk's end against."""
    return _costs(asv_args, stack)[1]


def cost_lines(asv_args: list[str], stack: description.Stack, commits: int) -> list[str]:
    """What each measured commit's paired suites may spend: the placement auto picks for the stack here, the
    measurements (decode shapes, serve levels), the starts a decided one takes at least, the budget minutes each
    may spend (a block under way when the budget runs out finishes), and the walk's total at most."""
    lines, minutes, where = _costs(asv_args, stack)
    if len(lines) == 1:
        return ["paired suites: none selected by --asv-args; each commit runs only the isolated suites"]
    first = stopping.first_look_blocks(stopping.WALK_FIRST_BLOCKS, where)
    warm = f"{len(SIDES)} fill the compile caches, then " if where == placements.ALTERNATE else ""
    lines += [
        f"starts: {stopping.least_starts(stopping.WALK_FIRST_BLOCKS, where)} at least a decided measurement "
        f"({warm}{first} blocks of {len(SIDES)})",
        f"time: at most ~{minutes:g} min a commit (+ the block under way when a budget runs out, builds, isolated "
        f"suites); ~{minutes * commits / 60:.1f} h for {_commits(commits)} to measure",
    ]
    return lines


def _costs(asv_args: list[str], stack: description.Stack) -> tuple[list[str], float, str]:
    """(the placement's and each paired suite's plan lines, minutes a commit at most, the placement)."""
    backend = stack.resolved_backend()
    where, why = placements.choose(placements.AUTO, backend, stack)
    lines, minutes = [f"placement: {where} ({why})"], 0.0
    if selected(asv_args, RATIO_FIGURES["decode"]):
        shapes_ = shapes.walk_shapes(os.environ.get("B70BENCH_DECODE_SHAPES"), stack.shapes, backend)
        walk = decode_budget.walk_budget(stack, backend)
        lines.append(
            f"decode: {' '.join(shapes_)}, {walk.budget_min:g} min each ({walk.budget_why}); {walk.rounds} timed "
            f"calls a start ({walk.rounds_why}); decides a {walk.min_effect:.1%} change ({walk.effect_why})"
        )
        lines += [f"  {x.strip()}" for x in walk.calibration_lines]
        lines += walk.forecast_lines()
        minutes += walk.budget_min * len(shapes_)
    if selected(asv_args, RATIO_FIGURES["serve"]):
        text = os.environ.get("B70BENCH_SERVE_CONCURRENCY")
        levels = text.split() if text else [str(c) for c in serve_suite.DEFAULT_CONCURRENCY]
        each = stopping.budget_min_from_env("B70BENCH_SERVE_BUDGET_MIN", stopping.DEFAULT_BUDGET_MIN)
        lines.append(f"serve: {' '.join(levels)} requests, {each:g} min a level (B70BENCH_SERVE_BUDGET_MIN)")
        minutes += each * len(levels)
    return lines, minutes, where


# What a night walks unless --asv-args names suites: the decode figures, paired with each commit's parent.
NIGHT_SUITES = "bench_decode"


def night(args, asv_args: list[str], stack: description.Stack, commits: int, inputs: dict) -> list[str]:
    """--min-effect and --night, set for asv's processes (decode.budget reads them there): the smallest change each
    measurement decides; the night's hours spread evenly over the commits' decode shapes (nothing kept back for
    builds: the plan prints them), decode alone unless asv_args select suites. Returns the asv arguments."""
    if args.min_effect is not None:
        if not 0 < args.min_effect < 1:
            raise UsageError(f"--min-effect {args.min_effect}: a fraction in (0, 1), e.g. 0.02 for 2%")
        os.environ[stopping.MIN_EFFECT_ENV] = repr(args.min_effect)
        inputs["min_effect"] = args.min_effect
    if args.night is None:
        return asv_args
    if os.environ.get(decode_budget.BUDGET_ENV):
        raise UsageError(f"--night and {decode_budget.BUDGET_ENV} both set a decode budget: drop one")
    if not args.night > 0:
        raise UsageError(f"--night {args.night}: hours, more than 0 (e.g. --night 10)")
    chosen = any(a in ("--bench", "-b") or a.startswith("--bench=") for a in asv_args)
    asv_args = asv_args if chosen else [*asv_args, "--bench", NIGHT_SUITES]
    n_shapes = len(shapes.walk_shapes(os.environ.get("B70BENCH_DECODE_SHAPES"), stack.shapes, stack.resolved_backend()))
    each = args.night * 60 / (max(commits, 1) * n_shapes)
    if each < stopping.MIN_BUDGET_MIN:
        raise UsageError(
            f"--night {args.night:g}: {each:.1f} min a decode shape over {_commits(commits)} and {n_shapes} shape(s) "
            f"decides nothing: give {stopping.MIN_BUDGET_MIN * commits * n_shapes / 60:.1f} hours or more, or a "
            f"shorter range"
        )
    os.environ[decode_budget.BUDGET_ENV] = f"{each:.2f}"
    inputs["night_h"] = args.night
    return asv_args


def say(line: str) -> None:
    """A walk's line on its stdout, flushed: a pipe (`| tee walk.log`) would otherwise hold a night's blocks back,
    and asv, writing to the same descriptor, would overtake them."""
    print(line, flush=True)


def restored(row: dict) -> str:
    """The summary's word for the environment after a commit: "-" where nothing was applied to it."""
    return ("yes" if row["restored"] else "no") if row.get("applied") else "-"


def status(repo: Path, machine: str | None) -> list[str]:
    """`revisions --status`: the walks under this project's results (one --machine, or every machine's), each
    running one as walkfollow.status_lines tells it; none running: the latest one's end (killed, or how it ended)."""
    root = walkfollow.folder(state.asv_results_dir(repo), machine or "*")
    found = sorted(
        (d for d in root.parent.glob(root.name) if (d / walkfollow.STATE).is_file()),
        key=lambda d: (d / walkfollow.STATE).stat().st_mtime,
    )
    if not found:
        return [f"no walk running (none has run under {root.parent})"]
    live = [d for d in found if walkfollow.running(walkfollow.read_state(d) or {})]
    shown = live or found[-1:]
    if len(found) == 1:
        return walkfollow.status_lines(shown[0])
    return [line for d in shown for line in (f"machine {d.name}:", *(f"  {x}" for x in walkfollow.status_lines(d)))]


def status_command(repo: Path, machine: str | None) -> str:
    """The --status command that finds this walk (its --repo and --machine where not the defaults)."""
    extra = ([] if repo == ROOT else ["--repo", str(repo)]) + (["--machine", machine] if machine else [])
    return shlex.join(["b70bench", "revisions", "--status", *extra])


def run(args) -> int:
    python = options.interpreter(args.python)
    walker = Walker(python, Path(args.repo).resolve(), args.site_dir, args.prefix)
    if args.status:
        for line in status(walker.repo, args.machine):
            print(line)
        return 0
    if args.restore:
        done = walker.restore()
        print((done.stdout + done.stderr).strip())
        return done.returncode
    if not args.range:
        raise UsageError("name a range (OLD..NEW) or a commit, or pass --restore or --status")
    children.unwind_on_sigterm()  # a SIGTERM restores the environment and reaps asv, as Ctrl-C does
    every = commits_in(walker.repo, args.range)
    commits = shard(every, args.shard)
    asv_args = shlex.split(args.asv_args or "")
    stack_hash, stack = None, description.from_env()
    if args.stack:
        stack = description.load(args.stack)  # a bad file is refused before anything is applied
    check_environment(python, stack if args.stack else None)
    if args.stack:
        os.environ[description.ENV_VAR] = stack.source  # the asv adapters read it in asv's processes
        stack_hash = stack.hash()
    settings = side_settings.from_args(args, stack)
    if args.design and any(settings.values()):
        raise UsageError("--design measures each commit against its parent; sides with settings (--b-env and the "
                         "like) measure each against itself: drop one")  # fmt: skip
    if args.design and args.shard:
        raise UsageError("--design measures the range as one; --shard splits it across machines: drop one")
    inputs = {"asv_args": asv_args, "stack": stack_hash}
    asv_args = night(args, asv_args, stack, len(commits), inputs)
    if args.design:  # its verdicts come from another design: a commit walked per pair is not finished for it
        walkdesign.check_placement(placements.choose(placements.AUTO, stack.resolved_backend(), stack)[0])
        inputs["design"] = True
    if args.numerics_intended:
        # Full hashes (a name a person typed, checked here): the adapters match the commit asv walks against them.
        named = [git(walker.repo, "rev-parse", "--verify", f"{c}^{{commit}}") for c in args.numerics_intended]
        os.environ[report.INTENDED_ENV] = ",".join(named)
        inputs["numerics_intended"] = named
    settings_text = side_settings.to_env(settings)
    if settings_text:
        os.environ[side_settings.ENV_VAR] = settings_text  # the asv adapters read it in asv's processes
        inputs["settings"] = settings_text
    machine = args.machine or platform.node()
    results = state.asv_results_dir(walker.repo)
    record = Record(walklog.path(results, machine), inputs)
    where = f"shard {args.shard} ({len(commits)} of {len(every)} commits)" if args.shard else _commits(len(commits))
    header = f"plan: {where} on machine {machine}, results in {results}"
    if "settings" in inputs:
        header += f"\nsides: each commit with {side_settings.describe(settings)} on the same commit (not its parent)"
    for line in plan_lines(walker, commits, record, None, header, asv_args, stack):
        print(line)
    if args.design:
        for line in walkdesign.plan_lines(stack, len(commits)):
            print(line)
    if args.plan:
        return 0
    ensure_machine(walker.repo, machine)
    if args.design:
        # Beside asv's results, not in them: asv publish reads every folder under its results as a machine's.
        folder = Path(results).parent / "b70bench-design" / machine
        walkdesign.measure(walker.repo, commits, stack, walker.env, python, folder)
        os.environ[chain.DESIGN_ENV] = str(folder)  # the decode adapter reads each commit's result there
    subjects = [(c, git(walker.repo, "log", "-1", "--format=%s", c)[:60]) for c in commits]
    command = shlex.join(["b70bench", "revisions", *sys.argv[2:]]) if sys.argv[1:2] == ["revisions"] else ""
    follow = walkfollow.Walk(
        walkfollow.folder(results, machine), args.range, subjects, commit_minutes(asv_args, stack), command
    )
    killed = follow.begin()
    if killed is not None:
        say(f"the last walk here ({killed.get('range')}, pid {killed.get('pid')}) was killed at commit "
            f"{killed.get('index')} of {len(killed.get('commits') or [])}: the blocks it finished are kept for the "
            f"measurements this walk repeats")  # fmt: skip
    say(f"follow: `{status_command(walker.repo, args.machine)}` from another shell; blocks appear here as they end")
    how = "interrupted"
    try:
        rows = walk(walker, commits, [*asv_args, "--machine", machine], record=record, follow=follow, out=say)
        how = "finished"
    finally:
        follow.end(how)
    print()
    print(f"{'commit':10}  {'patch set':16}  {'outcome':18}  asv  restored  error")
    for r in rows:
        print(
            f"{r['commit'][:10]:10}  {r['patch_set_hash'] or '-':16}  {r['outcome'] or '-':18}  "
            f"{'-' if r['asv_rc'] is None else r['asv_rc']:>3}  {restored(r):8}  "
            f"{r['error'] or ''}"
        )
    failed_build = any(r["outcome"] == walklog.BUILD_FAILED for r in rows)
    ok = all(r["outcome"] in (walklog.MEASURED, walklog.BUILD_FAILED) and r["asv_rc"] in (0, None) for r in rows)
    return 0 if ok and not failed_build else 1


def register(sub) -> None:
    p = sub.add_parser(
        "revisions",
        help="walk a commit range on an existing environment (apply, asv run, restore)",
        description="For each commit of RANGE: build its source-tree patches into copies, apply its patches/ "
        "series to the environment of --python, run `asv run -E existing:PATH --set-commit-hash SHA` (the paired "
        "suites measure the commit against its parent, or with --b-env and the like against itself with side A's "
        "settings), restore. --plan prints the commits, builds and what each commit may cost first.",
        epilog="Budgets per commit: B70BENCH_DECODE_BUDGET_MIN (minutes a decode shape), B70BENCH_SERVE_BUDGET_MIN "
        "(minutes a serve level), B70BENCH_DECODE_ROUNDS / B70BENCH_SERVE_ROUNDS (timed calls a start), "
        "B70BENCH_DECODE_SHAPES / B70BENCH_SERVE_CONCURRENCY (what is measured). Planning an overnight walk on a rig: "
        "docs/stacks.md#budgets; builds, shards and machines: docs/source-builds.md.",
    )
    p.add_argument("range", nargs="?", help="OLD..NEW (oldest first, OLD excluded) or one commit")
    p.add_argument(
        "--python", default=None, metavar="PATH", help="interpreter of the environment to patch (default: this one)"
    )
    p.add_argument(
        "--stack",
        metavar="FILE",
        default=None,
        help="the stack under test (docs/stacks.md), passed to the asv adapters as B70BENCH_STACK",
    )
    p.add_argument("--asv-args", default="", help='extra arguments for asv run, e.g. "--bench Decode -a repeat=3"')
    p.add_argument(
        "--restore",
        action="store_true",
        help="only restore the environment (a plain re-run of a killed walk's range restores it by itself)",
    )
    p.add_argument(
        "--status",
        action="store_true",
        help="where a running walk is (commit i of N, its last block, minutes spent, estimated end), or that none is "
        "running and whether the last was killed; finds it under the project's results (--repo, --machine narrow it)",
    )
    # Sides that differ by settings: each commit measured with B's against itself with A's (a flag swept).
    side_settings.add_flags(p)
    p.add_argument(
        "--numerics-intended",
        nargs="+",
        default=[],
        metavar="COMMIT",
        help="commits whose numerics change on purpose (checked by your own canaries): where their tokens differ from "
        "the parent's, their speed is read and marked on the page instead of withheld",
    )
    p.add_argument(
        "--shard",
        metavar="K/N",
        default=None,
        help="walk only every Nth commit from the Kth (1-based): one shard a machine; each verdict needs only its "
        "commit and its parent, so shards are independent (docs/source-builds.md)",
    )
    p.add_argument(
        "--machine",
        default=None,
        help="asv machine name the results go under (default: this host's name); one per machine of a sharded walk",
    )
    p.add_argument(
        "--design",
        action="store_true",
        help="measure the decode verdicts as one design before asv runs: each commit started once a pass, one engine "
        "at a time (refused where two engines fit), its starts serving its own verdict and its child's; its first "
        "look runs whole (--plan gives the starts beside the per-pair walk's)",
    )
    p.add_argument(
        "--night",
        type=float,
        default=None,
        metavar="HOURS",
        help="spread HOURS over the range's commits and decode shapes (the decode budget of each), and walk decode "
        "alone unless --asv-args names suites; --plan says what that budget decides",
    )
    p.add_argument(
        "--min-effect",
        type=float,
        default=None,
        metavar="FRACTION",
        help="the smallest change each measurement must decide (0.02: 2%%): undecided, never 'no change', while the "
        "interval holds it (default: the stack's min_effect, else what its calibration names in the budget, else "
        "0.05); with a calibrated stack and no --night, the budget it needs",
    )
    p.add_argument("--plan", action="store_true", help="print the plan (commits, builds, budgets) and run nothing")
    p.add_argument(
        "--repo", default=str(ROOT), help="the git repository whose commits carry patches/ (default: this checkout)"
    )
    p.add_argument("--site-dir", default=None, help="look for distributions only in DIR (a pip --target install)")
    p.add_argument("--prefix", default=None, help="where the environment's patch state lives (with --site-dir)")
    p.set_defaults(func=run)
