"""asv plugin (asv.conf.json "plugins"): b70bench's verdicts on the regressions page of `asv publish`.

asv's Regressions publisher (order 3) writes regressions.json from its step fit. This publisher
runs after it and, for the decode seconds figures and serve's latencies (DECIDED), replaces asv's entries
with b70bench.verdicts' verdicts over the same result files (slower, faster, "no change beyond X%" or
undecided):

- where the results carry the suite's `track_ratio_to_parent` samples (one B/A per block, each commit measured
  alternating with its git parent in one host window; decode's seconds, serve's E2E, TPOT and TTFT, each with
  its own ratio: PAIRED_BY, PAIRED_RATIO), each such commit against its parent (verdicts.paired);
- else, where they carry per-start samples (`asv run --record-samples`), the unpaired rule over the history
  (verdicts.unpaired): a real slowdown is named at the commit it lands, also the newest one, and a
  commit inside the noise is not. Results without samples keep asv's entries.

Only `slower` verdicts become regressions.json entries. Throughput figures (higher is better, which
asv cannot read) and the paired measurement's own figures (ratio to parent, minutes, calls: asv
would step-fit them) lose their entries. The regressions page gets a note saying which rule decided
and a table of every verdict; b70bench-verdicts.json holds the same, b70bench-verdicts.xml is an
Atom feed of every verdict (asv's regressions.xml keeps the slower ones).

Settings: b70bench.verdicts' LEVEL, MIN_EFFECT and FLOOR, the ones the walk measures with; asv.conf.json may
override them for the page ("b70bench_verdicts": {"level": ..., "min_effect": ..., "floor": ...}).
"""

from __future__ import annotations

import datetime
import html
import itertools
import os
import subprocess
import urllib.parse

from asv import feed, util
from asv.plugins.regressions import Regressions
from asv.publishing import OutputPublisher
from asv.results import iter_results

from b70bench import cachekey, stats, verdicts, walklog
from b70bench.figures import (
    DECIDED,
    GATE_BY,
    KEY_BY,
    KEY_FIGURES,
    PAIRED_BY,
    TIMED,
    WITHDRAWN,
    count_figures,
    measured,
    measured_samples,
    paired_figures,
)
from b70bench.paired import placement, report, stopping

NOTE_ID = "b70bench-verdicts"
FEED = "b70bench-verdicts.xml"


def _entry_name(benchmark: dict, param) -> str:
    return benchmark["name"] if param is None else f"{benchmark['name']}({', '.join(param)})"


def _matches(res, graph) -> bool:
    return not any(graph.params.get(k) != v for k, v in res.params.items())


def _figure(results: list, benchmarks, name: str, graph, revisions: dict) -> dict:
    """{param values (a tuple, () unparameterized): {commit: (samples or None, value or None)}} of one figure."""
    bench = benchmarks.get(name)
    out: dict[tuple, dict[str, tuple]] = {}
    if not bench:
        return out
    params = bench.get("params") or []
    for res in results:
        if res.commit_hash not in revisions or not _matches(res, graph):
            continue
        try:
            values = res.get_result_value(name, params)
            samples = res.get_result_samples(name, params)
        except KeyError:
            continue
        for k, combo in enumerate(itertools.product(*params)):
            value = measured(values[k]) if values and k < len(values) else None
            s = measured_samples(samples[k]) if samples and k < len(samples) else None
            if value is not None or s:
                out.setdefault(tuple(combo), {})[res.commit_hash] = (s, value)
    return out


def _single(figure: dict, combo: tuple, commit: str):
    """The value of a one-value figure (minutes, calls) at this parameter combination, else the unparameterized one."""
    for key in (combo, ()):
        got = figure.get(key, {}).get(commit)
        if got and measured(got[1]) is not None:
            return measured(got[1])
    return None


def _level(samples, value) -> float | None:
    """A commit's figure: the geometric mean of its samples, else asv's value."""
    good = [s for s in measured_samples(samples) or () if s > 0]
    return stats.geomean(good) if good else measured(value)


def _extra(minutes: dict, calls: dict, combo: tuple, commit: str) -> tuple[float | None, int | None]:
    """(machine minutes, timed calls per side) of one commit's measurement, where recorded."""
    m, c = _single(minutes, combo, commit), _single(calls, combo, commit)
    return (m, None if c is None else round(c))


def _around(v: verdicts.Verdict, seconds: dict) -> tuple[float, float]:
    """(before, after) of a paired verdict on the seconds figure, as the paired ratio reads it: the commit's
    figure and that over the ratio (the parent's figure times the ratio where the commit has none; (1, ratio)
    where neither has one: asv's feed needs numbers)."""
    r = v.ratio.ratio if v.ratio else 1.0
    parent = v.reference[0] if v.reference else None
    if v.commit in seconds and (after := _level(*seconds[v.commit])) is not None:
        return after / r, after
    if parent in seconds and (before := _level(*seconds[parent])) is not None:
        return before, before * r
    return 1.0, r


# A commit whose tokens differ from its parent's and whose walk was told so (`revisions --numerics-intended`): its
# speed is read, and its row says why it was not withheld.
INTENDED_NOTE = "numerics change declared intended: its tokens differ from the parent's, its speed is read"

# The paired measurement's stop as stored (paired.stopping.STOPS), back to its words.
STOPPED = {code: word for word, code in stopping.STOPS.items()}


class _SavedChanges:
    """The key changes a walk saved per commit and shape (cachekey.saved_changes), read once a commit."""

    def __init__(self):
        self.by_commit: dict[str, dict] = {}

    def get(self, commit: str, shape: str | None) -> dict | None:
        if commit not in self.by_commit:
            self.by_commit[commit] = cachekey.saved_changes(commit)
        return self.by_commit[commit].get(shape) if shape else None


def _shape_of(combo: tuple) -> str | None:
    """The decode shape of a parameter combination (asv keeps each value as its repr: "'p128n128'")."""
    return str(combo[0]).strip("'\"") if combo else None


def _key_change(figure: dict, combo: tuple, commit: str, changes: _SavedChanges) -> dict | None:
    """The commit's key change against its parent for the page: the figure (0/1, travels with the results), with the
    keys and the factor where the walking machine saved them (its state directory)."""
    moved = _single(figure, combo, commit)
    if moved is None:
        return None
    saved = changes.get(commit, _shape_of(combo))
    if saved and saved.get("aot_differs_from_parent") == int(moved):
        return saved
    return {"aot_differs_from_parent": int(moved), "why": [], "line": "moved" if moved else "unchanged"}


def _key_moves(benchmark: dict, graph, results: list, benchmarks, revisions: dict, git) -> list:
    """(entry name, param index, jumps) of one key figure: a jump at every commit that reads 1, from its parent."""
    figure = _figure(results, benchmarks, benchmark["name"], graph, revisions)
    combos = list(itertools.product(*benchmark["params"])) if benchmark.get("params") else [()]
    out = []
    for j, combo in enumerate(combos):
        commits = figure.get(tuple(combo), {})
        if not commits:
            continue
        jumps = []
        for c, (_s, val) in sorted(commits.items(), key=lambda kv: revisions[kv[0]]):
            if val == 1:
                parent = git.info(c)[0]
                jumps.append((revisions.get(parent), revisions[c], 0.0, 1.0))
        name = _entry_name(benchmark, combo if benchmark.get("params") else None)
        out.append((name, j if benchmark.get("params") else None, jumps))
    return out


class _Git:
    """Parent and subject of commits, from `git log` in the project's repository; failures read as unknown."""

    def __init__(self, conf, repo):
        # asv runs with the working directory at the conf's directory, so a relative conf.repo resolves here.
        local = getattr(conf, "repo", None)
        self.dir = local if local and os.path.isdir(local) else getattr(repo, "_path", None)
        self.cache: dict[str, tuple[str | None, str]] = {}

    def info(self, commit: str) -> tuple[str | None, str]:
        """(first parent or None, subject or "-")."""
        if commit not in self.cache:
            parent, subject = None, "-"
            if self.dir:
                try:
                    done = subprocess.run(
                        ["git", "-C", self.dir, "log", "-1", "--format=%P%x00%s", commit],
                        capture_output=True,
                        text=True,
                        timeout=30,
                    )
                    if done.returncode == 0 and "\x00" in done.stdout:
                        parents, subject = done.stdout.rstrip("\n").split("\x00", 1)
                        parent = parents.split()[0] if parents.split() else None
                        subject = subject or "-"
                except (OSError, subprocess.SubprocessError):
                    pass
            self.cache[commit] = (parent, subject)
        return self.cache[commit]


def _unpaired_jump(v: verdicts.Verdict, revisions: dict, repo) -> tuple:
    """asv's (last good revision or None for a one-commit range, first bad revision, before, after)."""
    good = v.reference[-1]
    commits = repo.get_hashes_from_range(repo.get_range_spec(good, v.commit))
    return (None if len(commits) == 1 else revisions[good], v.revision, v.before, v.after)


def _paired_jump(v: verdicts.Verdict, revisions: dict, measured: set) -> tuple:
    """(parent revision, commit revision, before, after). The parent's revision only where it has results of
    the figure (asv's feed reads its run time); else None, asv's mark of a one-commit range."""
    parent = v.reference[0] if v.reference else None
    good = revisions[parent] if parent in revisions and parent in measured else None
    return (good, v.revision, v.before, v.after)


class Verdicts(OutputPublisher):
    name = None  # no page of its own: it writes into the regressions page
    order = Regressions.order + 0.5

    @classmethod
    def publish(cls, conf, repo, benchmarks, graphs, revisions):
        settings = getattr(conf, "b70bench_verdicts", None) or {}
        level = float(settings.get("level", verdicts.LEVEL))
        min_effect = float(settings.get("min_effect", verdicts.MIN_EFFECT))
        floor = float(settings.get("floor", verdicts.FLOOR))
        path = os.path.join(conf.html_dir, "regressions.json")
        data = util.load_json(path) if os.path.exists(path) else {"regressions": []}
        bare = lambda name: name.split("(", 1)[0]  # noqa: E731
        asv_entries = data["regressions"]
        all_params = graphs.get_params()
        git = _Git(conf, repo)
        rows, entries, decided = [], [], set()
        results = list(iter_results(conf.results_dir))  # read once; every decided graph reads the same files
        changes = _SavedChanges()
        for file_name, graph in graphs:
            benchmark = benchmarks.get(os.path.basename(file_name))
            if not benchmark or benchmark["name"] not in DECIDED or "summary" in graph.params:
                continue
            graph_params = {k: v for k, v in graph.params.items() if len(all_params[k]) > 1}
            seconds = _figure(results, benchmarks, benchmark["name"], graph, revisions)
            suite = PAIRED_BY.get(benchmark["name"])
            ratios, ses, minutes, placed, stopped, effects = (
                _figure(results, benchmarks, f"{suite}.{figure}", graph, revisions) if suite else {}
                for figure in paired_figures(benchmark["name"])
            )
            key = (
                _figure(results, benchmarks, KEY_BY[benchmark["name"]], graph, revisions)
                if benchmark["name"] in KEY_BY
                else {}
            )
            calls = next(
                (
                    got
                    for name in (count_figures(suite) if suite else ())
                    if (got := _figure(results, benchmarks, name, graph, revisions))
                ),
                {},
            )
            gate = (
                _figure(results, benchmarks, GATE_BY[benchmark["name"]], graph, revisions)
                if benchmark["name"] in GATE_BY
                else {}
            )
            combos = list(itertools.product(*benchmark["params"])) if benchmark.get("params") else [()]
            for j, combo in enumerate(combos):
                idx = j if benchmark.get("params") else None
                name = _entry_name(benchmark, combo if benchmark.get("params") else None)
                mine = seconds.get(tuple(combo), {})
                # Figures without a paired measurement (PAIRED_BY) are decided by the unpaired rule.
                paired = ratios.get(tuple(combo)) or ratios.get((), {})
                paired_ses = (ses.get(tuple(combo)) or ses.get((), {})) if paired else {}
                failed = {c for c, (_s, v) in gate.get(tuple(combo), {}).items() if v == 1}
                intended = {c for c, (_s, v) in gate.get(tuple(combo), {}).items() if v == report.INTENDED}
                extra = {c: _extra(minutes, calls, tuple(combo), c) for c in {*paired, *mine, *failed}}
                # A paired suite's commit whose gate failed has no samples at all (its speed withheld): where no
                # commit has a figure to decide, the page still says why that one has none.
                unsampled = not any(len(s or ()) >= 2 for s, _v in mine.values())
                if any(s for s, _v in paired.values()) or (suite and failed and unsampled):
                    paired = {**{c: (None, None) for c in failed}, **paired}
                    points = [
                        verdicts.Point(
                            revisions[c],
                            c,
                            s or (),
                            *extra[c],
                            parent=git.info(c)[0],
                            ses=tuple(paired_ses.get(c, ((), None))[0] or ()),
                            gate_failed=c in failed,
                            placement=PLACED.get(_single(placed, tuple(combo), c)),
                            min_effect=_single(effects, tuple(combo), c),
                        )
                        for c, (s, _v) in paired.items()
                    ]
                    decided_here = verdicts.paired(points, level, min_effect, floor)
                    for v in decided_here:
                        v.before, v.after = _around(v, mine)
                    jumps = [_paired_jump(v, revisions, set(mine)) for v in decided_here if v.verdict == stats.SLOWER]
                else:
                    points = [verdicts.Point(revisions[c], c, s, *extra[c]) for c, (s, _v) in mine.items() if s]
                    if not any(len(p.samples) >= 2 for p in points):
                        continue  # results without per-start samples (no --record-samples): asv's own fit stays
                    withheld = [
                        verdicts.Point(revisions[c], c, (), *extra[c], gate_failed=True)
                        for c in failed - {p.commit for p in points}
                        if c in revisions
                    ]
                    decided_here = verdicts.unpaired(points + withheld, level, min_effect, floor)
                    jumps = [_unpaired_jump(v, revisions, repo) for v in decided_here if v.verdict == stats.SLOWER]
                decided.add(name)
                for v in decided_here:
                    v.subject = git.info(v.commit)[1]
                    v.machine = graph.params.get("machine")
                    v.stopped = STOPPED.get(_single(stopped, tuple(combo), v.commit))
                    v.key_change = _key_change(key, tuple(combo), v.commit, changes)
                    if v.commit in intended:
                        v.notes.append(INTENDED_NOTE)
                rows += [(name, graph_params, idx, v) for v in decided_here]
                if jumps:
                    levels = {c: x for c, (s, val) in mine.items() if (x := _level(s, val)) is not None}
                    if levels:
                        last, best = levels[max(levels, key=lambda c: revisions[c])], min(levels.values())
                    else:  # no seconds values at all: the paired ratios' own scale
                        last = best = 1.0
                    entries.append([name, graph.path + ".json", graph_params, idx, last, best, jumps])
        for file_name, graph in graphs:
            benchmark = benchmarks.get(os.path.basename(file_name))
            if benchmark and benchmark["name"] in KEY_FIGURES and "summary" not in graph.params:
                graph_params = {k: v for k, v in graph.params.items() if len(all_params[k]) > 1}
                for name, idx, jumps in _key_moves(benchmark, graph, results, benchmarks, revisions, git):
                    decided.add(name)
                    if jumps:
                        entries.append([name, graph.path + ".json", graph_params, idx, 1.0, 0.0, jumps])
        kept = [r for r in asv_entries if bare(r[0]) not in WITHDRAWN and r[0] not in decided]
        data["regressions"] = kept + entries
        util.write_json(path, data, compact=True)
        if hasattr(Regressions, "_save_feed"):  # asv 0.6's feed writer; the page works without it
            Regressions._save_feed(
                conf, benchmarks, data["regressions"], revisions, {r: h for h, r in revisions.items()}
            )
        rules = tuple(dict.fromkeys(v.rule for *_rest, v in rows)) or (verdicts.PAIRED, verdicts.UNPAIRED)
        # Commits whose source trees did not build (b70bench revisions): shown as such, never as a slowdown.
        failed = walklog.failed_commits(conf.results_dir)
        for row in failed.values():
            row["subject"] = git.info(row["commit"])[1]
        util.write_json(
            os.path.join(conf.html_dir, "b70bench-verdicts.json"),
            {
                "rule": verdicts.describe(level, min_effect, floor, rules),
                "rules": list(rules),
                "level": level,
                "min_effect": min_effect,
                "floor": floor,
                "decided": list(DECIDED),
                "withdrawn": list(WITHDRAWN),
                "verdicts": [_row_json(n, p, v) for n, p, _j, v in rows],
                "failed_builds": [_build_json(row) for row in failed.values()],
            },
        )
        _write_note(conf.html_dir, level, min_effect, floor, rows, conf.hash_length, list(failed.values()))
        _write_feed(conf, benchmarks, results, rows)


def _row_json(name: str, params: dict, v: verdicts.Verdict) -> dict:
    r, d = v.ratio, v.decision
    return {
        "benchmark": name,
        "graph_params": params,
        "commit": v.commit,
        "subject": v.subject,
        "rule": v.rule,
        "reference": v.reference,
        "verdict": v.verdict,
        "text": v.text,
        "bound": d.bound if d else None,
        "min_effect": d.min_effect if d else None,
        "ratio": r and r.ratio,
        "lo": r and r.lo,
        "hi": r and r.hi,
        "level": r and r.level,
        "n_reference": r.n_a if r and v.rule == verdicts.UNPAIRED else None,
        "n": v.n,
        "calls": v.calls,
        "minutes": v.minutes,
        "placement": v.placement,
        "machine": v.machine,
        "before": v.before,
        "after": v.after,
        "block_ratios": list(v.blocks),
        "notes": list(v.notes),
        "stopped": v.stopped,
        "key_changed": (v.key_change or {}).get("aot_differs_from_parent"),
        "key_change": (v.key_change or {}).get("line"),
        "parent_aot_key": (v.key_change or {}).get("parent_aot_key"),
        "aot_key": (v.key_change or {}).get("aot_key"),
        "key_factors": (v.key_change or {}).get("factors"),
    }


def _build_json(row: dict) -> dict:
    build = row.get("build") or {}
    return {
        "commit": row["commit"],
        "subject": row.get("subject"),
        "machine": row.get("machine"),
        "outcome": row.get("outcome"),
        "error": row.get("error"),
        "tree": build.get("tree"),
        "command": build.get("command"),
        "exit": build.get("exit"),
        "tail": build.get("tail", []),
        "headline": build.get("headline") or (build.get("tail") or [None])[-1],
    }


def _failed_build_row(row: dict, hash_length: int) -> str:
    b = _build_json(row)
    if b["outcome"] == walklog.MEASURE_FAILED:  # lost, not slower or faster: the cause, and measured again on resume
        return (
            f"<tr><td>-</td><td><code>{b['commit'][:hash_length]}</code> {html.escape(b['subject'] or '-')}</td>"
            f"<td>-</td><td>-</td><td><b>measurement failed</b>: {html.escape(b['error'] or '-')}</td>"
            f"<td>not measured (a resumed walk measures it again)</td><td>-</td><td>-</td>"
            f"<td>{html.escape(b['machine'] or '-')}</td></tr>"
        )
    last = b["headline"] or "(no output)"
    return (
        f"<tr><td>build of {html.escape(os.path.basename(b['tree'] or '-'))}</td><td><code>"
        f"{b['commit'][:hash_length]}</code> {html.escape(b['subject'] or '-')}</td><td>-</td><td>-</td>"
        f"<td><b>failed build</b>: <code>{html.escape(b['command'] or '-')}</code> exit {b['exit']}; "
        f"<code>{html.escape(last)}</code></td><td>not measured</td><td>-</td><td>-</td>"
        f"<td>{html.escape(b['machine'] or '-')}</td></tr>"
    )


def _against(v: verdicts.Verdict, hash_length: int) -> str:
    if not v.reference:
        return "-"
    if len(v.reference) == 1:
        return f"<code>{v.reference[0][:hash_length]}</code>" + (" (parent)" if v.rule == verdicts.PAIRED else "")
    return (
        f"<code>{v.reference[0][:hash_length]}</code>..<code>{v.reference[-1][:hash_length]}</code> "
        f"({len(v.reference)} commits)"
    )


# The walk's placement as stored (paired.placement.CODES), back to its word.
PLACED = {code: word for word, code in placement.CODES.items()}


def _timed_word(name: str) -> str:
    """What a paired block of this figure's suite timed on each side: call or level."""
    return TIMED.get(".".join(name.split("(", 1)[0].split(".")[:2]), "call")


def _samples(v: verdicts.Verdict, name: str) -> str:
    if v.rule == verdicts.PAIRED:
        text = f"{v.n} block{'s' if v.n != 1 else ''}" + (f" ({v.placement})" if v.placement else "")
    else:
        text = f"{v.n} start{'s' if v.n != 1 else ''}" + (f" (reference {v.ratio.n_a})" if v.ratio else "")
    return text + (f", {v.calls} {_timed_word(name)}s a side" if v.calls is not None else "")


def _why_stopped(v: verdicts.Verdict) -> str:
    """An undecided paired row's blocks and why no further one was taken: "too noisy" (blocks that disagree, budget
    spent) told from "too short" (few blocks)."""
    if v.rule != verdicts.PAIRED or v.verdict != stats.UNDECIDED:
        return ""
    blocks = " ".join(f"{x:.3f}" for x in v.blocks) or "none"
    return f"<br>blocks B/A: {blocks}" + (f"; stopped: {html.escape(v.stopped)}" if v.stopped else "")


def _key_cell(v: verdicts.Verdict, hash_length: int) -> str:
    """The commit's compile-cache key against its parent's: the line (old -> new, factor) where it moved, with the
    command that accepts the new key as the known-good one."""
    change = v.key_change
    if not change:
        return "-"
    if change.get("aot_differs_from_parent") != 1:
        return "same"
    return (
        f"<b>moved</b>: {html.escape(change.get('line') or 'moved')}<br>accept it: "
        f"<code>b70bench cache-key pin {v.commit[:hash_length]}</code>"
    )


def _write_note(
    html_dir: str, level: float, min_effect: float, floor: float, rows, hash_length: int, failed: list | None = None
) -> None:
    """Put the rule and the verdict table (and the walk's failed builds) above the regressions table of index.html."""
    body = []
    for name, _params, _j, v in rows:
        r = v.ratio
        figures = f"{r.ratio:.3f} [{r.lo:.3f}, {r.hi:.3f}]" if r else "-"
        minutes = f"{v.minutes:.1f}" if v.minutes is not None else "-"
        body.append(
            f"<tr><td>{html.escape(name)}</td><td><code>{v.commit[:hash_length]}</code> "
            f"{html.escape(v.subject or '-')}</td><td>{_against(v, hash_length)}</td><td>{figures}</td>"
            f"<td><b>{html.escape(v.text)}</b>{''.join(f'<br>{html.escape(n)}' for n in v.notes)}</td>"
            f"<td>{_samples(v, name)}{_why_stopped(v)}</td><td>{minutes}</td>"
            f"<td>{_key_cell(v, hash_length)}</td><td>{html.escape(v.machine or '-')}</td></tr>"
        )
    body += [_failed_build_row(row, hash_length) for row in failed or []]
    rules = tuple(dict.fromkeys(v.rule for *_rest, v in rows)) or (verdicts.PAIRED, verdicts.UNPAIRED)
    decided_by = " and ".join(f"the {rule} rule" for rule in rules)
    note = (
        f'<div id="{NOTE_ID}" style="margin: 1em 2em">'
        f"<p><b>Decode speed verdicts by b70bench.</b> The figures {', '.join(n.split('.')[-1] for n in DECIDED)} "
        f"are listed below by b70bench's statistic, not asv's step fit, here decided by {decided_by}. "
        f"{html.escape(verdicts.describe(level, min_effect, floor, rules))} "
        f"A paired block is one B/A from this commit and its parent measured alternating; an unpaired sample is one "
        f"fresh vLLM start. Throughput figures are not listed (asv reads every rise as a regression; their "
        f"verdict is the seconds figure's), nor the paired measurement's ratio, minutes and calls.</p>"
        f'<table class="table table-condensed"><thead><tr><th>figure</th><th>commit</th><th>against</th>'
        f"<th>ratio [{level:.0%} interval]</th><th>verdict</th><th>samples</th><th>minutes</th>"
        f"<th>compile-cache key against the parent</th><th>machine</th>"
        f"</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )
    index = os.path.join(html_dir, "index.html")
    with open(index) as f:
        text = f.read()
    start = text.find(f'<div id="{NOTE_ID}"')
    if start >= 0:  # published before: replace the old note
        end = text.index("</table></div>", start) + len("</table></div>")
        text = text[:start] + text[end:]
    anchor = '<div id="regressions-body">'
    text = text.replace(anchor, note + "\n      " + anchor, 1)
    with open(index, "w") as f:
        f.write(text)


def _write_feed(conf, benchmarks, results: list, rows) -> None:
    """b70bench-verdicts.xml: an Atom entry per verdict (every word), dated when its commit was measured."""
    when: dict[tuple[str, str], int] = {}
    for res in results:
        for key in (*DECIDED, *(f"{suite}.{paired_figures(name)[0]}" for name, suite in PAIRED_BY.items())):
            stamp = res.started_at.get(key) or res.date
            if stamp:
                when[key, res.commit_hash] = max(when.get((key, res.commit_hash), 0), stamp)
    entries = []
    for name, params, j, v in rows:
        bare = name.split("(", 1)[0]
        key = f"{PAIRED_BY[bare]}.{paired_figures(bare)[0]}" if v.rule == verdicts.PAIRED else bare
        stamp = when.get((key, v.commit)) or when.get((bare, v.commit))
        updated = (
            datetime.datetime.fromtimestamp(stamp / 1000, tz=datetime.UTC)
            if stamp
            else datetime.datetime.now(datetime.UTC)
        )
        query = dict(params, commits=v.commit)
        benchmark = benchmarks.get(bare) or {}
        if j is not None and benchmark.get("params"):
            combo = next(itertools.islice(itertools.product(*benchmark["params"]), j, j + 1))
            query.update({f"p-{k}": val for k, val in zip(benchmark.get("param_names", []), combo, strict=False)})
        link = f"index.html#{bare}?{urllib.parse.urlencode(query)}"
        short = v.commit[: conf.hash_length]
        r = v.ratio
        summary = (
            f"{html.escape(v.text)}. B/A {r.ratio:.3f} [{r.lo:.3f}, {r.hi:.3f}] at {r.level:.0%}"
            if r
            else html.escape(v.text)
        )
        against = ", ".join(c[: conf.hash_length] for c in v.reference) or "-"
        summary += (
            f"<br>Commit {short} {html.escape(v.subject or '-')} against {against} ({v.rule} rule); "
            f"{_samples(v, name)}" + (f"; {v.minutes:.1f} machine minutes" if v.minutes is not None else "") + "."
        )
        entries.append(
            feed.FeedEntry(
                f"{name} at {short} {v.subject or '-'}: {v.text}",
                updated,
                link,
                summary,
                [name, *v.reference[-1:], v.commit, v.verdict],
            )
        )
    entries.sort(key=lambda e: e.updated, reverse=True)
    feed.write_atom(
        os.path.join(conf.html_dir, FEED),
        entries,
        title=f"{conf.project} decode speed verdicts (b70bench)",
        author="b70bench",
        address=f"{conf.project}.b70bench",
    )
