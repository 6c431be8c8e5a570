"""`b70bench summarize`: vLLM logs, `vllm bench latency`/`serve` results, decode child logs and JSON into rows."""

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from b70bench import children, records, summarize
from b70bench.cli import main
from b70bench.decode.child import RESULT_PREFIX
from b70bench.errors import UsageError
from b70bench.serve import server
from b70bench.stack import environment, logs, tokenizer
from b70bench.stack import model as modelmod

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
    with pytest.raises(UsageError, match="not valid JSON .*truncated"):
        summarize.collect([str(bad)])


# vLLM 0.20.1's KV-cache lines as its v1/core/kv_cache_utils.py writes them (read in its source; no 0.20.1 run
# here): "GPU" on every device, the concurrency on a line of its own.
V0201_KV = (
    "(EngineCore_DP0 pid=7) INFO 05-10 05:39:33 [kv_cache_utils.py:1708] GPU KV cache size: 9,408 tokens\n"
    "(EngineCore_DP0 pid=7) INFO 05-10 05:39:33 [kv_cache_utils.py:1709] Maximum concurrency for 2,048 tokens "
    "per request: 4.59x\n"
)


def test_the_0_20_1_kv_lines_give_size_and_concurrency(tmp_path):
    f = tmp_path / "engine.log"
    f.write_text(V0201_KV)
    (row,) = summarize.collect([str(f)])
    assert row["kv_cache_tokens"] == 9408 and row["kv_cache_device"] == "GPU" and row["max_concurrency"] == 4.59


def test_a_latency_log_without_the_batch_size_has_no_shape(tmp_path):
    f = tmp_path / "lat.log"
    f.write_text("+ vllm bench latency --input-len 512 --output-len 1536\nAvg latency: 17.5 seconds\n")
    (row,) = summarize.collect([str(f)])
    assert row["latency_s"] == 17.5 and row["latency_percentiles_s"] == {}
    assert row.get("shape") is None and row["output_tok_per_s"] is None  # the default batch is not assumed
    f.write_text("+ vllm bench latency --input-len=512 --output-len 1536 --batch-size 1 --num-iters 3\n")
    (row,) = summarize.collect([str(f)])
    assert "latency_s" not in row and row.get("shape") is None  # cut before vLLM printed its result
    assert row["error"] is None


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('{"avg_latency": 0.1, "latencies": [0.1, 0.', r"not valid JSON .*line 1 column \d+; truncated"),
        ('{"date": "x", "results": []}', "neither a vLLM result .* nor a b70bench JSON result"),
        ('{"avg_latency": "fast", "latencies": [], "percentiles": {}}', "'avg_latency' is 'fast', not a number"),
        ('{"avg_latency": 1.0, "latencies": "x", "percentiles": {}}', "'latencies' is not a list of seconds"),
    ],
)
def test_bad_json_is_one_line_naming_the_problem(tmp_path, text, match):
    f = tmp_path / "r.json"
    f.write_text(text)
    with pytest.raises(UsageError, match=match) as err:
        summarize.collect([str(f)])
    assert "\n" not in str(err.value)
    if "neither" in match:
        assert summarize.collect([str(tmp_path)]) == []  # in a directory, another tool's JSON is skipped


# ---- A real `vllm bench latency` (one engine start) and a real `vllm bench serve` client, read back. ----

HAS_VLLM = importlib.util.find_spec("vllm") is not None
ROOT = Path(__file__).resolve().parents[1]
SHAPE = {"input_len": 32, "output_len": 16, "batch_size": 1}
# What a lab's run script sets (and echoes, as `set -x` does): the flags the log must give back.
FLAGS = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
SERVE_MAIN = """import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
if __name__ == "__main__":
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    main(parser.parse_args(sys.argv[1:]))
"""


class FakeServer(server.Server):
    module = "fake_openai_server"


needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed")


def _run(cmd: list[str], env: dict, log: Path, echo: str, timeout_s: float) -> float:
    """cmd in its own session, its output after an echoed command line in log; its seconds. Its group is killed."""
    t0 = time.monotonic()
    with open(log, "w") as f:
        f.write(echo + "\n")
        f.flush()
        proc = subprocess.Popen(
            cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )
        try:
            proc.wait(timeout=timeout_s)
        finally:
            children.kill_group(proc.pid)
            proc.wait()
    assert proc.returncode == 0, logs.failure_reason(log.read_text(errors="replace"))
    return time.monotonic() - t0


@pytest.fixture(scope="module")
def latency_run(tmp_path_factory):
    """`vllm bench latency` on the embedded model (vllm.benchmarks.latency's own add_cli_args and main, as the
    console script runs them: vllm-cpu's does not start), with the engine env this suite gives every CPU start and
    SAVE_TO_PYTORCH_BENCHMARK_FORMAT, so vLLM also writes its .pytorch.json with the arguments."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from decode_vs_latency import LATENCY_MAIN

    d = tmp_path_factory.mktemp("latency")
    model = modelmod.ensure_embedded()
    env = environment.engine_env("cpu", {**os.environ, **FLAGS}, None)
    env = environment.child_env(env, d / "vllm-cache", embedded=True, plugin_dir=None)
    env["SAVE_TO_PYTORCH_BENCHMARK_FORMAT"] = "1"
    args = [
        "--model", str(model), "--input-len", "32", "--output-len", "16", "--batch-size", "1",
        "--num-iters-warmup", "1", "--num-iters", "2", "--max-model-len", "256", "--dtype", "bfloat16",
        "--skip-tokenizer-init", "--disable-detokenize", "--output-json", str(d / "latency.json"),
    ]  # fmt: skip
    echo = " ".join([*(f"{k}={v}" for k, v in FLAGS.items()), "vllm bench latency", *args])
    seconds = _run([sys.executable, "-c", LATENCY_MAIN, *args], env, d / "latency.log", echo, 900)
    print(f"vllm bench latency: {seconds:.0f} s")
    return d, env["VLLM_CACHE_ROOT"]


@pytest.mark.slow
@needs_vllm
def test_a_real_latency_run_read_back(latency_run, capsys):
    d, cache_root = latency_run
    text = (d / "latency.log").read_text()
    result = json.loads((d / "latency.json").read_text())
    log_row, json_row = summarize.collect([str(d / "latency.log"), str(d / "latency.json")])
    # The printed average and percentiles are the JSON's, to float precision; so is the JSON row's.
    assert log_row["latency_s"] == pytest.approx(result["avg_latency"], rel=1e-12)
    assert log_row["latency_percentiles_s"] == pytest.approx(result["percentiles"], rel=1e-12)
    assert json_row["latency_s"] == result["avg_latency"] and json_row["latencies_s"] == result["latencies"]
    assert json_row["iterations"] == 2 and json_row["latency_s_min"] == min(result["latencies"])
    # The shape: from the echoed command (log) and from vLLM's .pytorch.json (JSON); figures per token from it.
    for row in (log_row, json_row):
        assert row["shape"] == "p32n16b1" and {k: row[k] for k in SHAPE} == SHAPE
        assert row["s_per_output_token"] == pytest.approx(result["avg_latency"] / 16)
        assert row["output_tok_per_s"] == pytest.approx(16 / result["avg_latency"])
        assert row["total_tok_per_s"] == pytest.approx(48 / result["avg_latency"])
    # The KV cache the log states: VLLM_CPU_KVCACHE_SPACE=1 GiB over the embedded model's K+V bytes a token
    # (layers x 2 x KV heads x head dim x 2 bytes of bf16).
    cfg = modelmod.embedded_config()
    per_token = cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * 2
    stated = int(re.search(r"KV cache size: ([\d,]+) tokens", text).group(1).replace(",", ""))
    assert log_row["kv_cache_tokens"] == stated == 2**30 // per_token and log_row["kv_cache_device"] == "CPU"
    # The AOT key: the directory vLLM saved under this run's cache root.
    (key,) = log_row["cache_keys"]
    assert re.fullmatch(r"[0-9a-f]{64}", key) and log_row["cache_state"] == "compiled"
    assert (Path(cache_root) / "torch_compile_cache" / "torch_aot_compile" / key).is_dir()
    assert log_row["env"] == FLAGS and log_row.get("error") is None
    # The CLI: one row each, the key's prefix and the flags in the table.
    assert main(["summarize", str(d)]) == 0
    out = capsys.readouterr().out
    assert key[:12] in out and "VLLM_CPU_KVCACHE_SPACE=1" in out and len(out.strip().splitlines()) == 3
    # The same file cut short: one line naming it.
    cut = d / "cut" / "latency.json"
    cut.parent.mkdir()
    cut.write_text((d / "latency.json").read_text()[:60])
    with pytest.raises(UsageError, match="not valid JSON .*truncated"):
        summarize.collect([str(cut)])


@pytest.mark.slow
@needs_vllm
def test_a_real_serve_result_read_back(tmp_path):
    """vLLM's own `bench serve` client (its add_cli_args and main) against the tests' stand-in server, with
    --save-result: the file's format is vLLM's; the numbers are the stand-in's, so only agreement is asserted."""
    from b70bench.serve import anchor

    model = modelmod.ensure_embedded()
    tok = tokenizer.ensure(model, modelmod.embedded_config())
    env = dict(os.environ, PYTHONPATH=str(ROOT / "tests"), HF_HUB_OFFLINE="1")
    srv = FakeServer(["--token-s", "0.002"], env, tmp_path / "server.log", python=sys.executable)
    with srv:
        args = anchor.bench_args(srv.port, str(model), str(tok), 16, 8, 2, 8)
        args += ["--save-result", "--save-detailed", "--result-dir", str(tmp_path), "--result-filename", "s.json"]
        _run([sys.executable, "-c", SERVE_MAIN, *args], env, tmp_path / "serve.log", "vllm bench serve", 300)
    result = json.loads((tmp_path / "s.json").read_text())
    (row,) = summarize.collect([str(tmp_path / "s.json")])
    assert row["kind"] == "vllm-bench-serve" and row["completed"] == 8 and row["total_output_tokens"] == 64
    assert row["output_tok_per_s"] == result["output_throughput"] > 0
    assert row["tpot_ms"] == result["median_tpot_ms"] > 0 and row["ttft_ms"] == result["median_ttft_ms"]
    assert row["p99_itl_ms"] == result["p99_itl_ms"] and row["shape"] == "p16n8c2"
