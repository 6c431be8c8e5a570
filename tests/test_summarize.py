"""`b70bench summarize`: vLLM logs, decode child logs and decode JSON into rows."""

import json

import pytest

from b70bench import records, summarize
from b70bench.cli import main
from b70bench.decode.child import RESULT_PREFIX
from b70bench.errors import UsageError

AOT = "/x/torch_compile_cache/torch_aot_compile/" + "c1" * 32 + "/rank_0_0/model"
LAB_LOG = (
    "(EngineCore_DP0 pid=7) INFO 05-10 05:39:33 [kv_cache_utils.py:1087] XPU KV cache size: 9,408 tokens, "
    "Maximum concurrency for 2,048 tokens per request: 4.59x\n"
    f"(Worker_TP0 pid=8) INFO 05-10 05:39:30 [decorators.py:1] Directly load AOT compilation from path {AOT}\n"
    "export VLLM_XPU_GRAPH_NOOP_COMM_CAPTURE=1\n"
    "Throughput: 0.02 requests/s, 42.41 total tokens/s, 33.93 output tokens/s\n"
)


def test_vllm_log_row(tmp_path):
    f = tmp_path / "run.log"
    f.write_text(LAB_LOG)
    (row,) = summarize.collect([str(f)])
    assert row["output_tok_per_s"] == 33.93 and row["total_tok_per_s"] == 42.41
    assert row["kv_cache_tokens"] == 9408 and row["cache_state"] == "loaded" and row["cache_keys"] == ["c1" * 32]
    assert row["env"]["VLLM_XPU_GRAPH_NOOP_COMM_CAPTURE"] == "1"


def test_child_log_figures_from_spec_and_result(tmp_path):
    spec = {"prompt_len": 512, "output_len": 512, "batch": 1}
    result = {"ok": True, "latencies_s": [2.0, 1.6, 1.7], "token_sha256": "ab"}
    f = tmp_path / "p512n512b1-warm1.log"
    f.write_text(f"b70bench decode p512n512b1-warm1: {json.dumps(spec)}\n{RESULT_PREFIX}{json.dumps(result)}\n")
    (row,) = summarize.collect([str(tmp_path)])
    assert row["shape"] == "p512n512b1"
    assert row["output_tok_per_s"] == pytest.approx(512 / 1.6) and row["total_tok_per_s"] == pytest.approx(1024 / 1.6)


def test_decode_json_rows_and_cli_json(tmp_path, capsys):
    log = tmp_path / "a.log"
    log.write_text(LAB_LOG)
    rec = records.record(
        "decode",
        fingerprint={"backend": "cpu"},
        shape="p4n4b1",
        output_tok_per_s=10.0,
        total_tok_per_s=20.0,
        kv_cache_tokens=5,
        cache_state="compiled",
        cache_keys=["ab"],
        gate=0,
        log_path=str(log),
    )
    other = records.record("copy", bytes=4)
    records.write_json(tmp_path / "r.json", [rec, other])
    (row,) = summarize.collect([str(tmp_path / "r.json")])
    assert row["shape"] == "p4n4b1" and row["gate"] == 0 and row["env"]["VLLM_XPU_GRAPH_NOOP_COMM_CAPTURE"] == "1"
    assert main(["summarize", str(tmp_path / "r.json"), str(log), "--json", "-"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["kind"] for r in rows] == ["json", "log"]
    assert main(["summarize", str(log)]) == 0
    out = capsys.readouterr().out
    assert "33.93" in out and "c1c1c1c1c1c1" in out


def test_missing_path_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        summarize.collect([str(tmp_path / "nope.log")])
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    with pytest.raises(UsageError, match="not a b70bench JSON"):
        summarize.collect([str(bad)])
