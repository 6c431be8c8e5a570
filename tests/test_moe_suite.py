import math
import sys
import types
from importlib import metadata

import pytest
import torch

from b70bench import device as devmod
from b70bench.errors import UsageError
from b70bench.moe import shapes, suite, variants

SMALL = shapes.MoeShape(hidden=64, intermediate=256, experts=8, topk=2)
CPU = devmod.Device("cpu")


def _measure(**kw):
    kw.setdefault("variants", ["reference", "torch-int4"])
    names = kw.pop("variants")
    return suite.measure(
        CPU,
        names,
        tokens=kw.pop("tokens", (1, 5)),
        tps=kw.pop("tps", (1,)),
        shape=SMALL,
        repeat=2,
        warmup=1,
        anchor_gbps=10.0,
        **kw,
    )


def test_routing_is_seeded_top_k_with_normalized_weights():
    ids, w = shapes.routing(16, shapes.MoeShape(), seed=4)
    ids2, _ = shapes.routing(16, shapes.MoeShape(), seed=4)
    assert torch.equal(ids, ids2) and ids.shape == (16, 8)
    assert all(len(set(row.tolist())) == 8 for row in ids)
    assert torch.allclose(w.sum(-1), torch.ones(16))


def test_minimax_shards_and_roofline_bytes():
    shape = shapes.MoeShape()
    assert [shape.k(tp) for tp in (1, 2, 4)] == [1536, 768, 384]
    with pytest.raises(UsageError, match="scale group 128"):  # 192 rows cannot hold whole 128-groups
        shape.k(8)
    batch = shapes.random_batch(shape, 384, 1, torch.bfloat16, torch.device("cpu"), 0)
    # 8 experts x (384/2 x 3072 packed + 3 x 3072 bf16 scales) + 8 x 384 x 2 in + 3072 x 2 out
    assert (
        shapes.roofline_bytes(shape, 384, batch, torch.bfloat16)
        == 8 * (192 * 3072 + 3 * 3072 * 2) + 8 * 384 * 2 + 3072 * 2
    )


def test_reference_matches_float64_and_check_catches_wrong_output():
    w = shapes.random_weights(SMALL, 128, torch.bfloat16, torch.device("cpu"), 1)
    ref = variants.Reference()
    good = suite.check(ref, ref, SMALL, w, 128, 5, torch.bfloat16, CPU, 9)
    assert good["ok"] and 0 < good["rel_err"] < 1e-2 and good["max_diff_ref"] == 0

    class Off(variants.Reference):
        def prepare(self, weights, batch, out):
            run = super().prepare(weights, batch, out)
            return lambda: run().mul_(1.05)

    class Unwritten(variants.Reference):
        def prepare(self, weights, batch, out):
            return lambda: out  # leaves the NaN poison in place

    assert not suite.check(Off(), ref, SMALL, w, 128, 5, torch.bfloat16, CPU, 9)["ok"]
    assert math.isnan(suite.check(Unwritten(), ref, SMALL, w, 128, 5, torch.bfloat16, CPU, 9)["max_diff"])


def test_measure_rows_reference_and_torch_int4_on_cpu():
    rows = _measure()
    assert [(r["variant"], r["tokens"]) for r in rows] == [
        ("reference", 1),
        ("torch-int4", 1),
        ("reference", 5),
        ("torch-int4", 5),
    ]
    for r in rows:
        if r["skipped"]:
            assert r["variant"] == "torch-int4"
            continue
        assert r["ok"] and r["time_us"] > 0 and r["gbps"] > 0
        assert r["frac_copy"] == pytest.approx(r["gbps"] / 10.0)
        assert r["bytes"] > 0 and r["fingerprint"]["backend"] == "cpu"


def test_triton_skipped_on_cpu_without_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    rows = _measure(variants=["triton", "triton-htile"], tokens=(1,))
    assert all(r["skipped"] and "TRITON_INTERPRET" in r["skipped"] for r in rows)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(tps=(3,)), "does not split"),
        (dict(tps=(4,)), "multiple of the scale group"),
        (dict(tokens=(0,)), "tokens"),
        (dict(variants=["nope"]), "unknown variant"),
        (dict(dtype=torch.float32), "bf16 or fp16"),
    ],
)
def test_bad_input_is_usage_error(kw, match):
    with pytest.raises(UsageError, match=match):
        _measure(**kw)


def test_bad_dtype_name():
    with pytest.raises(UsageError, match="--dtype"):
        shapes.parse_dtype("fp8")


def _fake_entry_points(monkeypatch, *eps):
    monkeypatch.setattr(variants, "_entry_points", lambda: list(eps))


def test_plugin_failing_at_import_is_skipped_and_others_run(monkeypatch):
    good = types.ModuleType("b70bench_fake_plugin")

    class Doubled(variants.Reference):
        name = "fake-ok"

    good.factory = Doubled
    monkeypatch.setitem(sys.modules, "b70bench_fake_plugin", good)
    _fake_entry_points(
        monkeypatch,
        metadata.EntryPoint("broken", "b70bench_missing_plugin_module:variant", variants.ENTRY_POINT_GROUP),
        metadata.EntryPoint("fake", "b70bench_fake_plugin:factory", variants.ENTRY_POINT_GROUP),
        metadata.EntryPoint("clash", "b70bench_fake_plugin:factory", variants.ENTRY_POINT_GROUP),
    )
    names = list(variants.registry())
    assert names[:4] == ["reference", "triton", "triton-htile", "torch-int4"]
    assert "broken" in names and "fake-ok" in names and "fake-ok@plugin" in names
    rows = _measure(variants=["reference", "broken", "fake-ok"], tokens=(1,))
    by = {r["variant"]: r for r in rows}
    assert "failed to load" in by["broken"]["skipped"] and "ModuleNotFoundError" in by["broken"]["skipped"]
    assert by["reference"]["ok"] and by["fake-ok"]["ok"] and by["fake-ok"]["skipped"] is None


def test_a_variant_failing_on_one_shape_is_a_failed_row_and_the_rest_runs(monkeypatch):
    class Fails(variants.Reference):
        name = "fails-at-5"

        def prepare(self, weights, batch, out):
            if batch.tokens == 5:
                raise ValueError("no tiling fits this shape\nsecond line")
            return super().prepare(weights, batch, out)

    monkeypatch.setattr(variants, "builtins", lambda: [variants.Reference(), Fails()])
    rows = _measure(variants=["fails-at-5", "reference"], tokens=(1, 5))
    by = {(r["variant"], r["tokens"]): r for r in rows}
    assert by[("fails-at-5", 5)]["skipped"] == "failed: ValueError: no tiling fits this shape"
    assert by[("fails-at-5", 1)]["ok"] and by[("reference", 5)]["ok"] and by[("reference", 1)]["ok"]


def test_groups_smaller_than_a_dot_block_take_two_pair_blocks():
    """auto_block_m asks for tensor-core dots at 16+ pairs per expert; a 64-wide scale group cannot hold the
    128-deep K-block a dot needs, so both Triton variants fall back to the 2-pair decode blocks (H200, 2026-12-01:
    `--group 64` had ended the whole run with 'block_m 16: ... K-block in one group')."""
    from b70bench.moe import launch as kernels

    shape = shapes.MoeShape(hidden=64, intermediate=256, experts=8, topk=2, group=64)
    batch = shapes.random_batch(shape, 256, 40, torch.bfloat16, torch.device("cpu"), 0)
    assert kernels.auto_block_m(batch.ids_cpu) >= kernels.DOT_MIN_M
    for v in (variants.TritonVariant("triton"), variants.TritonVariant("triton-htile", htile=True)):
        cfg = v.choose(256, 64, batch, 64)
        assert cfg.block_m == 2, (v.name, cfg.label())
        kernels.check_config(cfg, 256, 64)


def test_cli_json_and_exit_codes(tmp_path, capsys):
    from b70bench.cli import main

    out = tmp_path / "moe.json"
    rc = main(
        [
            "moe-down",
            "--backend",
            "cpu",
            "--variants",
            "reference",
            "--tokens",
            "2",
            "--tp",
            "1",
            "--hidden",
            "64",
            "--intermediate",
            "256",
            "--experts",
            "8",
            "--topk",
            "2",
            "--repeat",
            "2",
            "--json",
            str(out),
        ]
    )
    assert rc == 0 and out.exists() and "reference" in capsys.readouterr().out
    assert main(["moe-down", "--backend", "cpu", "--intermediate", "260", "--tp", "1"]) == 2
    assert "multiple of 8" in capsys.readouterr().err
