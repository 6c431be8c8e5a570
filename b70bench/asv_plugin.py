"""asv plugin (asv.conf.json "plugins"): b70bench's verdicts on the regressions page of `asv publish`.

asv's Regressions publisher (order 3) writes regressions.json from its step fit. This publisher
runs after it and, for the decode speed figures (one sample per fresh vLLM start, recorded with
`asv run --record-samples`; results without samples keep asv's entries), replaces asv's entries
with b70bench.verdicts' walk over the same result files: a real slowdown is named at the commit
it lands, also the newest one, and a commit inside the noise is not. Throughput figures (higher
is better, which asv cannot read) lose their entries: their verdict is the seconds figure's.
The regressions page gets a note saying which statistic decided and a table of every verdict;
b70bench-verdicts.json holds the same.

Settings (asv.conf.json, optional): "b70bench_verdicts": {"level": 0.99, "min_effect": 0.02}.
"""

from __future__ import annotations

import html
import itertools
import os

from asv import util
from asv.plugins.regressions import Regressions
from asv.publishing import OutputPublisher
from asv.results import iter_results

from b70bench import stats, verdicts

# Per-start figures (lower is better) b70bench decides; asv's step fit still decides every other figure.
DECIDED = ("bench_decode.Decode.track_s_per_output_token", "bench_decode.Decode.track_s_per_total_token")
# Higher-is-better twins of DECIDED: asv would list a speed-up as a regression.
WITHDRAWN = ("bench_decode.Decode.track_output_tok_per_s", "bench_decode.Decode.track_total_tok_per_s")
NOTE_ID = "b70bench-verdicts"


def _entry_name(benchmark: dict, param) -> str:
    return benchmark["name"] if param is None else f"{benchmark['name']}({', '.join(param)})"


def _series(results: list, benchmark: dict, graph, revisions: dict) -> list[tuple[int | None, tuple | None, list]]:
    """(param index, param values, [verdicts.Point]) for each parameter combination of one graph."""
    combos = list(enumerate(itertools.product(*benchmark["params"]))) if benchmark.get("params") else [(None, None)]
    points: dict[int | None, list[verdicts.Point]] = {j: [] for j, _ in combos}
    for res in results:
        rev = revisions.get(res.commit_hash)
        if rev is None or any(graph.params.get(k) != v for k, v in res.params.items()):
            continue
        try:
            samples = res.get_result_samples(benchmark["name"], benchmark["params"])
        except KeyError:
            continue
        for j, _ in combos:
            s = samples if j is None else samples[j]
            if s:
                points[j].append(verdicts.Point(rev, res.commit_hash, tuple(s)))
    return [(j, param, points[j]) for j, param in combos]


def _jump(v: verdicts.Verdict, revisions: dict, repo) -> tuple:
    """asv's (last good revision or None for a one-commit range, first bad revision, before, after)."""
    good = v.reference[-1]
    commits = repo.get_hashes_from_range(repo.get_range_spec(good, v.commit))
    return (None if len(commits) == 1 else revisions[good], v.revision, v.before, v.after)


class Verdicts(OutputPublisher):
    name = None  # no page of its own: it writes into the regressions page
    order = Regressions.order + 0.5

    @classmethod
    def publish(cls, conf, repo, benchmarks, graphs, revisions):
        settings = getattr(conf, "b70bench_verdicts", None) or {}
        level = float(settings.get("level", verdicts.LEVEL))
        min_effect = float(settings.get("min_effect", verdicts.MIN_EFFECT))
        path = os.path.join(conf.html_dir, "regressions.json")
        data = util.load_json(path) if os.path.exists(path) else {"regressions": []}
        bare = lambda name: name.split("(", 1)[0]  # noqa: E731
        asv_entries = data["regressions"]
        all_params = graphs.get_params()
        rows, entries, decided = [], [], set()
        results = list(iter_results(conf.results_dir))  # read once; every decided graph walks the same files
        for file_name, graph in graphs:
            benchmark = benchmarks.get(os.path.basename(file_name))
            if not benchmark or benchmark["name"] not in DECIDED or "summary" in graph.params:
                continue
            graph_params = {k: v for k, v in graph.params.items() if len(all_params[k]) > 1}
            for j, param, points in _series(results, benchmark, graph, revisions):
                name = _entry_name(benchmark, param)
                if not any(len(p.samples) >= 2 for p in points):
                    continue  # results without per-start samples (no --record-samples): asv's own fit stays
                decided.add(name)
                walked = verdicts.walk(points, level, min_effect)
                rows += [(name, graph_params, v) for v in walked]
                jumps = [_jump(v, revisions, repo) for v in walked if v.verdict == stats.SLOWER]
                if jumps:
                    newest = max(points, key=lambda p: p.revision)
                    entries.append(
                        [
                            name,
                            graph.path + ".json",
                            graph_params,
                            j,
                            stats.geomean(newest.samples),
                            min(stats.geomean(p.samples) for p in points),
                            jumps,
                        ]
                    )
        kept = [r for r in asv_entries if bare(r[0]) not in WITHDRAWN and r[0] not in decided]
        data["regressions"] = kept + entries
        util.write_json(path, data, compact=True)
        if hasattr(Regressions, "_save_feed"):  # asv 0.6's feed writer; the page works without it
            Regressions._save_feed(
                conf, benchmarks, data["regressions"], revisions, {r: h for h, r in revisions.items()}
            )
        util.write_json(
            os.path.join(conf.html_dir, "b70bench-verdicts.json"),
            {
                "rule": verdicts.describe(level, min_effect),
                "level": level,
                "min_effect": min_effect,
                "decided": list(DECIDED),
                "withdrawn": list(WITHDRAWN),
                "verdicts": [_row_json(n, p, v) for n, p, v in rows],
            },
        )
        _write_note(conf.html_dir, level, min_effect, rows, conf.hash_length)


def _row_json(name: str, params: dict, v: verdicts.Verdict) -> dict:
    r = v.ratio
    return {
        "benchmark": name,
        "graph_params": params,
        "commit": v.commit,
        "reference": v.reference,
        "verdict": v.verdict,
        "ratio": r and r.ratio,
        "lo": r and r.lo,
        "hi": r and r.hi,
        "n_reference": r and r.n_a,
        "n": r and r.n_b,
        "before": v.before,
        "after": v.after,
    }


def _write_note(html_dir: str, level: float, min_effect: float, rows, hash_length: int) -> None:
    """Put the rule and the verdict table above the regressions table of index.html."""
    body = []
    for name, _params, v in rows:
        r = v.ratio
        figures = f"{r.ratio:.3f} [{r.lo:.3f}, {r.hi:.3f}]" if r else "-"
        body.append(
            f"<tr><td>{html.escape(name)}</td><td><code>{v.commit[:hash_length]}</code></td>"
            f"<td>{len(v.reference)} commit(s)</td><td>{figures}</td><td><b>{html.escape(v.verdict)}</b>"
            f"</td></tr>"
        )
    note = (
        f'<div id="{NOTE_ID}" style="margin: 1em 2em">'
        f"<p><b>Decode speed verdicts by b70bench.</b> The figures {', '.join(n.split('.')[-1] for n in DECIDED)} "
        f"are listed below by b70bench's statistic, not asv's step fit: "
        f"{html.escape(verdicts.describe(level, min_effect))}"
        f". Each sample is one fresh vLLM start. Throughput figures are not listed (asv reads every rise as a "
        f"regression); their verdict is the seconds figure's.</p>"
        f'<table class="table table-condensed"><thead><tr><th>figure</th><th>commit</th><th>against</th>'
        f"<th>ratio [{level:.0%} interval]</th><th>verdict</th></tr></thead><tbody>{''.join(body)}"
        f"</tbody></table></div>"
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
