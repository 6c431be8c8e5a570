"""--pytorch-json: decode records in vLLM's benchmark-database format, checked against vLLM's own writer."""

from __future__ import annotations

import argparse
import json

import pytest

from b70bench import pytorch_json


def start(s, gate=0, shape="p128n128b1"):
    return {
        "shape": shape,
        "model": "tiny-minimax-m2",
        "dtype": "bfloat16",
        "tp": 1,
        "max_model_len": 2048,
        "prompt_len": 128,
        "output_len": 128,
        "batch": 1,
        "gate": gate,
        "cache_keys": ["ab" * 32],
        "s_per_output_token": s,
        "output_tok_per_s": None if s is None else 1 / s,
        "fingerprint": {"patch_set_hash": "c5f471f66ffaecb3", "vllm": "0.32.0"},
    }


def test_one_record_per_shape_and_figure_with_the_per_start_values():
    recs = pytorch_json.from_decode([start(0.001), start(0.002), start(0.004, shape="p512n512b1")])
    by = {(r["metric"]["extra_info"]["shape"], r["metric"]["name"]): r for r in recs}
    assert by[("p128n128b1", "s_per_output_token")]["metric"]["benchmark_values"] == [0.001, 0.002]
    assert by[("p128n128b1", "output_tok_per_s")]["metric"]["benchmark_values"] == pytest.approx([1000, 500])
    assert by[("p512n512b1", "s_per_output_token")]["metric"]["benchmark_values"] == [0.004]
    assert ("p128n128b1", "ttft_s") not in by  # no values, no record
    extra = by[("p128n128b1", "s_per_output_token")]["metric"]["extra_info"]
    assert extra["patch_set_hash"] == "c5f471f66ffaecb3" and extra["starts"] == 2 and extra["gate"] == [0, 0]


def test_the_shape_is_vllms_own(monkeypatch):
    """The same keys, nesting and value types as vllm.benchmarks' convert_to_pytorch_benchmark_format."""
    utils = pytest.importorskip("vllm.benchmarks.lib.utils", reason="needs vLLM installed")
    monkeypatch.setenv("SAVE_TO_PYTORCH_BENCHMARK_FORMAT", "1")
    theirs = utils.convert_to_pytorch_benchmark_format(
        argparse.Namespace(model="m", tensor_parallel_size=1), {"latency": [0.1, 0.2]}, {"k": 1}
    )
    ours = pytorch_json.from_decode([start(0.001)])

    def shape(obj):
        if isinstance(obj, dict):
            return {k: shape(v) for k, v in obj.items() if k not in ("args", "extra_info")} | {
                k: "dict" for k in obj if k in ("args", "extra_info")
            }
        return type(obj).__name__

    assert shape(ours[0]) == {k: v for k, v in shape(theirs[0]).items()}, (ours[0], theirs[0])
    assert set(theirs[0]["benchmark"]["extra_info"]) >= {"args", "use_compile"}
    assert set(ours[0]["benchmark"]["extra_info"]) >= {"args", "use_compile"}
    json.dumps(ours)  # serialisable as written
