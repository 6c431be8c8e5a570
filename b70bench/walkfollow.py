"""Following a `revisions` walk: its state file, the progress its benchmarks report, `revisions --status`, and where
its paired measurements journal their blocks.

asv captures what its benchmark processes print, so a walk's blocks would reach the terminal only when asv ends a
commit, hours later. Instead each paired measurement appends one JSON line per event (a measurement begun, a block
finished) to a file the walk names in PROGRESS_ENV, and `revisions` tails that file in a thread and prints each line
on its own stdout. A file, not the terminal device or a FIFO: it works whether revisions' stdout is a pipe, a pty or
a file (revisions prints what it reads; the benchmarks never touch a terminal), a writer never blocks or dies when
no one reads (a FIFO's would), any number of asv processes append to it, and `--status` from another shell reads
the same lines. The tail wakes twice a second; nothing spins.

Everything lives in the walk's folder beside asv's results (asv publish reads every folder under them as a machine):
  <results>/../b70bench-walk/<machine>/walk.json       the walk: pid (and when that process started, so a reused pid
                                                        is not taken for it), range, commits (sha, subject), the commit
                                                        under way and since when, the plan's minutes a commit; "ended"
                                                        once it is over. Written atomically at each commit.
  <results>/../b70bench-walk/<machine>/progress.jsonl  this run's events (a new run starts it afresh)
  <results>/../b70bench-walk/<machine>/blocks/<commit>/ each paired measurement's finished blocks (paired.journal),
                                                        BLOCKS_ENV; moved to blocks-measured/ once the commit is
                                                        recorded measured, so a later walk measures afresh.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

from b70bench import patches, records, walklog
from b70bench.paired.journal import Journal

PROGRESS_ENV = "B70BENCH_WALK_PROGRESS"
BLOCKS_ENV = "B70BENCH_WALK_BLOCKS"
STATE, PROGRESS, BLOCKS, MEASURED = "walk.json", "progress.jsonl", "blocks", "blocks-measured"
# How often the tail looks for new lines: a block takes a minute or more, so half a second is prompt enough.
POLL_S = 0.5


def folder(results_dir: Path, machine: str) -> Path:
    return Path(results_dir).parent / "b70bench-walk" / machine


# ---- in asv's benchmark processes -----------------------------------------------------------------------------------


def report(event: dict, environ: dict | None = None) -> None:
    """One event on the walk's progress channel, when a walk named one (else nothing). One write of one line on an
    O_APPEND descriptor, so lines of several processes never interleave; a failure to write never fails a
    measurement (the journal, not this, is what resumes it)."""
    target = (os.environ if environ is None else environ).get(PROGRESS_ENV)
    if not target:
        return
    line = (json.dumps({"pid": os.getpid(), **event}, default=str) + "\n").encode()
    try:
        fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
    except OSError:
        pass


def journal(commit: str, parent: str, dirs: dict, environ: dict | None = None) -> Journal | None:
    """The journal of a walked commit's paired measurement against `parent` (BLOCKS_ENV/<commit>), keyed by both
    commits, their series' hashes and this interpreter (the walked environment); None outside a walk. The target
    adds what it measures (shape, stack, settings, placement, rounds)."""
    root = (os.environ if environ is None else environ).get(BLOCKS_ENV)
    if not root:
        return None
    series = {s: patches.load(d, allow_missing=True).hash for s, d in dirs.items()}
    key = {"commit": commit, "parent": parent, "series": series, "python": sys.executable}
    return Journal(Path(root) / commit, key, report=report)


# ---- in revisions ---------------------------------------------------------------------------------------------------


def proc_start(pid: int) -> str | None:
    """When process pid started (clock ticks since boot, /proc/PID/stat field 22), None if there is none: with the
    pid, names one process for the life of the machine."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = stat[stat.rfind(")") + 2 :].split()
    return rest[19] if len(rest) > 19 and rest[0] != "Z" else None


def running(state: dict) -> bool:
    """Whether the walk the state describes is still running (its process alive, and the same process)."""
    pid = state.get("pid")
    if not pid or state.get("ended"):
        return False
    started = proc_start(pid)
    return started is not None and started == state.get("pid_start")


def read_state(where: Path) -> dict | None:
    try:
        return json.loads((Path(where) / STATE).read_text())
    except (OSError, ValueError):
        return None


def read_events(where: Path) -> list[dict]:
    """This run's events (a line cut short by a kill is skipped, as walklog.read skips it)."""
    return walklog.read(Path(where) / PROGRESS)


class Walk:
    """A running walk's folder: its state file, progress channel and block journals (module docstring)."""

    def __init__(self, where: Path, range_: str, commits: list[tuple[str, str]], plan_min: float, command: str = ""):
        self.where, self.range, self.plan_min = Path(where), range_, plan_min
        self.state = {
            "range": range_,
            "command": command,
            "commits": [{"sha": c, "subject": s} for c, s in commits],
            "plan_min_per_commit": plan_min,
            "index": 0,
        }

    @property
    def progress(self) -> Path:
        return self.where / PROGRESS

    @property
    def blocks(self) -> Path:
        return self.where / BLOCKS

    def env(self) -> dict[str, str]:
        """What tells asv's benchmark processes where to report and journal."""
        return {PROGRESS_ENV: str(self.progress), BLOCKS_ENV: str(self.blocks)}

    def begin(self) -> dict | None:
        """Take the folder for this process; returns the previous walk's state where it was killed (None else).
        Refuses, in one line, while another walk runs here."""
        from b70bench.errors import UsageError

        before = read_state(self.where)
        if before is not None and running(before) and before.get("pid") != os.getpid():
            raise UsageError(
                f"a walk of {before.get('range')} is running here (pid {before['pid']}, {self.where}): follow it with "
                f"`b70bench revisions --status`, or walk under another --machine"
            )
        self.where.mkdir(parents=True, exist_ok=True)
        self.progress.write_text("")  # this run's events; the journals, not these, keep what a killed run did
        me = os.getpid()
        self.state.update(pid=me, pid_start=proc_start(me), started=time.time(), ended=None)
        self._write()
        return before if before is not None and not before.get("ended") else None

    def at(self, index: int, commit: str) -> None:
        self.state.update(index=index, commit=commit, commit_started=time.time())
        self._write()

    def end(self, how: str) -> None:
        self.state.update(ended=time.time(), how=how)
        self._write()

    def measured(self, commit: str) -> None:
        """A commit recorded measured: its journals move aside (kept for a reader, never read back)."""
        src = self.blocks / commit
        if src.is_dir():
            dest = self.where / MEASURED / f"{commit}-{int(time.time())}"
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(src), str(dest))

    def _write(self) -> None:
        records.atomic_write_text(self.where / STATE, json.dumps(self.state, indent=1) + "\n")


def _min(x: float) -> str:
    """Minutes as people read them: seconds under a minute (a fake engine's block), else minutes."""
    return f"{x * 60:.0f} s" if x < 1 else f"{x:.1f} min"


def event_line(event: dict) -> str | None:
    """What the terminal gets of one progress event (None: nothing)."""
    what = event.get("what", "paired")
    if event.get("event") == "measure":
        parent = (event.get("parent") or "")[:10]
        text = f"{what} against {parent}: {event.get('placement')}, budget {event.get('budget_min', 0):g} min"
        if event.get("kept"):
            text += (
                f"; {event['kept']} blocks kept from an earlier run ({_min(event.get('kept_min') or 0)}), going on at "
                f"block {event['kept'] + 1}"
            )
        return text
    if event.get("event") == "block":
        got = f"B/A {event['ratio']:.3f}" if event.get("ratio") is not None else f"failed: {event.get('error')}"
        return (
            f"{what} block {event['block']}: {got} ({_min(event.get('block_min') or 0)}; "
            f"{_min(event.get('spent_min') or 0)} on this measurement)"
        )
    return None


class Follower:
    """Tails a walk's progress file in a thread and says each event through `out`, prefixed by the commit under
    way and that commit's minutes against the plan's (context() -> (prefix, commit_started, plan_min))."""

    def __init__(self, path: Path, out, context):
        self.path, self.out, self.context = Path(path), out, context
        self.offset, self.buf = 0, b""
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="b70bench-walk-follow")

    def __enter__(self):
        try:
            self.offset = self.path.stat().st_size  # only what comes from now on
        except OSError:
            self.offset = 0
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=10)
        self.drain()  # lines written just before asv ended
        return False

    def _run(self) -> None:
        while not self.stop.wait(POLL_S):
            self.drain()

    def drain(self) -> None:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
        except OSError:
            return
        self.offset += len(chunk)
        self.buf += chunk
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            try:
                text = event_line(json.loads(line))
            except ValueError:
                continue
            if text:
                prefix, started, plan_min = self.context()
                spent = (time.time() - started) / 60.0 if started else 0.0
                self.out(f"{prefix} {text}; commit {_min(spent)} of ~{plan_min:g} planned")


def _clock(t: float) -> str:
    return dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M")


def status_lines(where: Path) -> list[str]:
    """Where the walk of this folder is: commit i of N (sha, subject), its last block, minutes spent, estimated end;
    or that none is running (and whether the last was killed, and how to resume it)."""
    state = read_state(where)
    if state is None:
        return [f"no walk running (none has run in {where})"]
    commits = state.get("commits") or []
    n, i = len(commits), int(state.get("index") or 0)
    here = commits[i - 1] if 1 <= i <= n else {"sha": state.get("commit") or "?", "subject": ""}
    at = f"commit {i} of {n}: {here['sha'][:10]} {here['subject']}".rstrip()
    events = [e for e in read_events(where) if e.get("commit") == here["sha"] and e.get("event") == "block"]
    last = events[-1] if events else None
    block = (
        f"{last.get('what')} block {last['block']}"
        + (f" (B/A {last['ratio']:.3f})" if last.get("ratio") is not None else "")
        if last
        else "no block finished yet"
    )
    if state.get("ended"):
        ended = _clock(state["ended"])
        return [f"no walk running: the last walk of {state.get('range')} ended {ended} ({state.get('how')})"]
    if not running(state):
        return [
            f"no walk running: the walk of {state.get('range')} (pid {state.get('pid')}) was killed at {at}, "
            f"{block}; run the same `b70bench revisions` command again to resume (finished blocks are kept)"
        ]
    plan = float(state.get("plan_min_per_commit") or 0.0)
    spent = (time.time() - (state.get("commit_started") or time.time())) / 60.0
    left = max(plan - spent, 0.0) + plan * (n - i)
    return [
        f"walk of {state.get('range')} (pid {state['pid']}, since {_clock(state['started'])}): {at}",
        f"  {block}; {_min(spent)} on this commit of ~{plan:g} planned",
        f"  estimated end: {_clock(time.time() + left * 60)} at the latest (~{left / 60:.1f} h: the plan's "
        f"~{plan:g} min a commit, {n - i} after this one)",
    ]
