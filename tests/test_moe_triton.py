"""The Triton kernels on the CPU through Triton's interpreter, in a child process."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")


def test_triton_kernels_match_float64_in_interpreter():
    script = Path(__file__).with_name("moe_interp_check.py")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(proc.stdout)
    assert len(rows) == 28
    for r in rows:
        assert r["ok"], r
        assert r["rel_err"] > 0  # a different summation order than float64: never bit-equal by chance


def test_tile_weights_is_n_tile_major_made_once_and_dropped_with_its_tensor():
    import gc

    import torch

    from b70bench.moe import launch as kernels

    w = torch.arange(2 * 3 * 8, dtype=torch.int32).reshape(2, 3, 8)
    twin = w.clone()  # equal values, another tensor: its own tiled copy (never compared with ==)
    a = kernels.tile_weights(w, 4)
    assert kernels.tile_weights(w, 4) is a
    assert kernels.tile_weights(twin, 4) is not a
    assert a.shape == (2, 2, 3, 4) and torch.equal(a[1, 1], w[1, :, 4:8]) and a.is_contiguous()
    held = len(kernels._DERIVED)
    del w, a
    gc.collect()
    assert len(kernels._DERIVED) == held - 1
    with pytest.raises(ValueError, match="multiple of block_n"):
        kernels.tile_weights(twin, 3)


def test_sweep_records_a_failing_tiling_and_goes_on(monkeypatch):
    """A tiling that raises (compile or launch) is a row with the reason; the next tiling still runs."""
    from b70bench import device
    from b70bench.moe import shapes, suite, tune

    calls = []

    def fake_check(v, *a, **k):
        calls.append(v.config.label())
        if v.config.block_n == 16:
            raise RuntimeError("ptxas: too many resources\nmore")
        return {"ok": True, "rel_err": 0.0}

    monkeypatch.setattr(suite, "check", fake_check)
    monkeypatch.setattr(suite, "time_variant", lambda *a, **k: {"time_us": 1.0})
    monkeypatch.setattr(tune.varmod, "triton_reason", lambda dev: None)
    monkeypatch.setattr(tune.bandwidth, "anchor_gbps", lambda dev: 1.0)
    shape = shapes.MoeShape(hidden=64, intermediate=256, experts=8, topk=2)
    tilings = [tune.parse_tiling("m1n16k128s1w4st1fused"), tune.parse_tiling("m1n32k128s1w4st1fused")]
    rows = tune.sweep(
        device.Device("cpu"), shape, (1,), (1,), shapes.DTYPES["bf16"], graph=False, repeat=1, tilings=tilings
    )
    assert calls == ["m1n16k128s1w4st1fused", "m1n32k128s1w4st1fused"]
    bad = [r for r in rows if r["config"] == "m1n16k128s1w4st1fused"][0]
    assert bad["skipped"] == "failed: RuntimeError: ptxas: too many resources" and "time_us" not in bad
    assert [r for r in rows if r["config"] == "m1n32k128s1w4st1fused"][0]["time_us"] == 1.0


@pytest.mark.parametrize(
    "label",
    [
        "m1n32k512s1w2st1sum-packed-paired",
        "m1n64k128s1w4st1fused-packed-paired-tiled-r96",
        "m16n128k128s1w4st3fused",
        "m2n32k64s2w4st2sum-tiled",
        "m1n32k512s1w2st1sum-packed-paired-pf-pdl-early",
        "m1n32k512s1w4st1fused-packed-paired-pf-pdl-early",
        "m2n32k256s1w2st1sum-packed-paired-pdl-early+m1n64k128s1w2st1sum-packed-paired-pf-pdl-early",
    ],
)
def test_tiling_labels_round_trip(label):
    from b70bench.moe import tune

    assert tune.parse_label(label).label() == label


def test_tiling_label_errors_name_the_expected_form():
    from b70bench.errors import UsageError
    from b70bench.moe import tune

    with pytest.raises(UsageError, match="as the sweep prints it"):
        tune.parse_tiling("m1n32-packed")


def test_programmatic_dependent_launch_is_asked_for_only_where_it_exists(monkeypatch):
    """pdl/early compile griddepcontrol (sm_90+): the htile policy leaves them off elsewhere, and an
    explicit tiling asking for them on another device is refused with the reason (a sweep row)."""
    import torch

    from b70bench.moe import launch as kernels
    from b70bench.moe import shapes, variants

    assert "CUDA" in kernels.pdl_reason(torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (8, 0))
    assert "9.0" in kernels.pdl_reason(torch.device("cuda", 0))
    shape = shapes.MoeShape(hidden=64, intermediate=256, experts=8, topk=2)
    batch = shapes.random_batch(shape, 256, 1, torch.bfloat16, torch.device("cpu"), 0)
    w = shapes.random_weights(shape, 256, torch.bfloat16, torch.device("cpu"), 0)
    cfg = variants.TritonVariant("triton-htile", htile=True).choose(256, 64, batch, w.group)
    assert cfg.prefetch and cfg.packed and not (cfg.pdl or cfg.early)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    out = torch.empty((1, 64), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="pdl/early: programmatic dependent launch is CUDA's"):
        kernels.prepare(
            kernels.Config(block_m=1, block_n=32, block_k=256, packed=True, pdl=True),
            w.qweight,
            w.scales,
            w.group,
            batch,
            out,
        )


def test_mixed_blocks_pair_an_experts_pairs_and_leave_the_odd_one_single():
    import torch

    from b70bench.moe import launch as kernels

    ids = torch.tensor([[3, 5], [3, 1], [3, 5], [7, 1]])  # expert 3: pairs 0, 2, 4; 5: 1, 5; 1: 3, 7; 7: 6
    (two, two_e), (one, one_e) = kernels.mixed_blocks(ids)
    assert sorted(two.tolist() + one.tolist()) == list(range(8))
    assert two.tolist() == [3, 7, 0, 2, 1, 5] and two_e.tolist() == [1, 3, 5]
    assert one.tolist() == [4, 6] and one_e.tolist() == [3, 7]
    for b, e in enumerate(two_e.tolist()):
        assert ids.flatten()[two[2 * b : 2 * b + 2]].tolist() == [e, e]


def test_mixed_tiling_is_a_two_pair_and_a_one_pair_tiling_that_agree():
    import torch

    from b70bench.moe import launch as kernels
    from b70bench.moe import shapes

    shape = shapes.MoeShape(hidden=64, intermediate=256, experts=8, topk=2)
    w = shapes.random_weights(shape, 256, torch.bfloat16, torch.device("cpu"), 0)
    batch = shapes.random_batch(shape, 256, 3, torch.bfloat16, torch.device("cpu"), 0)
    out = torch.empty((3, 64), dtype=torch.bfloat16)
    one = kernels.Config(block_m=1, block_n=32, block_k=128)
    with pytest.raises(ValueError, match="not block_m 1 [+] 1"):
        kernels.prepare(
            kernels.Config(block_m=1, block_n=32, block_k=256, odd_pairs=one), w.qweight, w.scales, w.group, batch, out
        )
    with pytest.raises(ValueError, match="must agree on split-K"):
        kernels.prepare(
            kernels.Config(block_m=2, block_n=32, block_k=256, packed=True, odd_pairs=one),
            w.qweight,
            w.scales,
            w.group,
            batch,
            out,
        )


# (K, tokens) -> the tiling docs/moe-down.md measured fastest on an H200 (MiniMax TP1 / TP4, N 3072, bf16).
H200_TABLE = {
    (1536, 1): "m1n32k512s1w4st1sum-packed-paired-tiled-o6-pdl-early-2r",
    (1536, 4): "m1n32k512s1w4st1sum-packed-paired-pf-pdl-early-2r",
    (1536, 16): "m2n64k128s1w2st1sum-packed-paired-pdl-early-2r+m1n64k128s1w2st1sum-packed-paired-pf-pdl-early-2r",
    (384, 1): "m1n32k256s1w2st1sum-packed-paired-pf-pdl-early-dq",
    (384, 4): "m1n64k128s1w2st1sum-packed-paired-pf-pdl-early",
    (384, 16): "m2n64k128s1w2st1sum-packed-paired-pdl-early-2r+m1n64k128s1w2st1sum-packed-paired-pf-pdl-early-2r",
}


def _minimax_batch(k, tokens, dtype=None):
    import torch

    from b70bench.moe import shapes

    shape = shapes.MoeShape(hidden=3072, intermediate=k, experts=256, topk=8)
    return shapes.random_batch(shape, k, tokens, dtype or torch.bfloat16, torch.device("cpu"), 0)


def test_htile_takes_the_shipped_h200_table_on_an_h200_only(monkeypatch):
    """On a device named NVIDIA H200 with 16-bit activations `triton-htile` takes the table's tiling per
    (K, N, tokens), read by the `--tuned` loader; fp32 activations, a shape the table lacks (TP2's K 768) and
    another GPU get the untuned default."""
    import torch

    from b70bench.moe import configs, launch, policies, variants

    path = policies.table_path("NVIDIA H200")
    assert path.name == "device_name=NVIDIA_H200.json"
    assert {(k, t): cfg.label() for (k, n, t), cfg in configs.load_tuned(path).items() if n == 3072} == H200_TABLE
    monkeypatch.setattr(policies, "device_name", lambda device: "NVIDIA H200")
    htile = variants.TritonVariant("triton-htile", htile=True)
    for (k, tokens), label in H200_TABLE.items():
        for dtype in (torch.bfloat16, torch.float16):
            cfg = htile.choose(k, 3072, _minimax_batch(k, tokens, dtype), 128)
            assert cfg.label() == label
            launch.check_config(cfg, k, 128)
    batch = _minimax_batch(1536, 1, torch.float32)
    assert htile.choose(1536, 3072, batch, 128) == variants.default_tiling(1536, 3072, batch, 128, True)
    batch = _minimax_batch(768, 1)
    assert htile.choose(768, 3072, batch, 128) == variants.default_tiling(768, 3072, batch, 128, True)
    monkeypatch.setattr(policies, "device_name", lambda device: "NVIDIA A100-SXM4-80GB")
    batch = _minimax_batch(1536, 1)
    assert htile.choose(1536, 3072, batch, 128).label() == "m1n32k512s1w4st1sum-packed-paired-pf"
    # A sweep's file (--tuned) comes before the table.
    monkeypatch.setattr(policies, "device_name", lambda device: "NVIDIA H200")
    mine = launch.Config(block_m=1, block_n=16, block_k=512, num_warps=2, num_stages=1, packed=True)
    assert (
        variants.TritonVariant("triton-htile", htile=True, tuned={(1536, 3072, 1): mine}).choose(1536, 3072, batch, 128)
        is mine
    )


@pytest.mark.parametrize(
    "k,tokens,label",
    [
        (1536, 1, "m1n32k512s1w4st1sum-packed-paired-pf"),  # 32-wide, K-blocks up to 512
        (256, 1, "m1n32k256s1w4st1sum-packed-paired-pf"),
        (384, 4, "m1n32k512s1w4st1sum-packed-paired-pf"),  # one masked K-block
        # shared experts (16 tokens: 128 pairs on 74 experts): 2-pair blocks of an expert's pairs of pairs
        (1536, 16, "m2n64k128s1w2st1sum-packed-paired+m1n64k128s1w2st1sum-packed-paired-pf"),
    ],
)
def test_htile_default_tiling_where_no_table_applies(k, tokens, label):
    """A CPU batch (no table, no PDL): packed and paired 16-bit decode blocks, the next block prefetched."""
    from b70bench.moe import variants

    cfg = variants.TritonVariant("triton-htile", htile=True).choose(k, 3072, _minimax_batch(k, tokens), 128)
    assert cfg.label() == label


def test_htile_default_asks_for_programmatic_dependent_launch_where_the_device_has_it(monkeypatch):
    from b70bench.moe import launch, variants

    monkeypatch.setattr(launch, "pdl_reason", lambda device: None)
    cfg = variants.TritonVariant("triton-htile", htile=True).choose(1536, 3072, _minimax_batch(1536, 1), 128)
    assert cfg.label() == "m1n32k512s1w4st1sum-packed-paired-pf-pdl-early"


def test_dequantizing_before_the_wait_needs_paired_packed_words():
    import torch

    from b70bench.moe import launch as kernels
    from b70bench.moe import shapes

    shape = shapes.MoeShape(hidden=64, intermediate=256, experts=8, topk=2)
    w = shapes.random_weights(shape, 256, torch.bfloat16, torch.device("cpu"), 0)
    batch = shapes.random_batch(shape, 256, 1, torch.bfloat16, torch.device("cpu"), 0)
    out = torch.empty((1, 64), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="-dq dequantizes paired packed words"):
        kernels.prepare(
            kernels.Config(block_m=1, block_n=32, block_k=256, packed=True, dequant_early=True),
            w.qweight,
            w.scales,
            w.group,
            batch,
            out,
        )


def test_residency_pad_fits_n_programs_per_sm_and_not_one_more(monkeypatch):
    import types

    import torch

    from b70bench.moe import launch as kernels

    sm = 233472  # an H200's shared memory per SM
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(shared_memory_per_multiprocessor=sm)
    )
    cuda = torch.device("cuda")
    for per_sm, own in ((6, 512), (12, 256), (12, 128), (20, 0)):
        pad = kernels.residency_pad(cuda, per_sm, own)
        per_program = pad + own + kernels.RESERVED_SMEM  # the pad, Triton's own shared memory, the reserve
        assert per_sm * per_program <= sm < (per_sm + 1) * per_program, (per_sm, own)
    with pytest.raises(ValueError, match="more than the 49152 bytes of static shared memory"):
        kernels.residency_pad(cuda, 3, 512)
    with pytest.raises(ValueError, match="already holds"):
        kernels.residency_pad(cuda, 200, 4096)
    with pytest.raises(ValueError, match="this is cpu"):
        kernels.residency_pad(torch.device("cpu"), 6, 0)


def test_row_pairs_need_paired_words_in_whole_groups():
    import torch

    from b70bench.moe import launch as kernels
    from b70bench.moe import shapes

    shape = shapes.MoeShape(hidden=64, intermediate=256, experts=8, topk=2)
    w = shapes.random_weights(shape, 256, torch.bfloat16, torch.device("cpu"), 0)
    batch = shapes.random_batch(shape, 256, 1, torch.bfloat16, torch.device("cpu"), 0)
    out = torch.empty(1, 64, dtype=torch.bfloat16)
    for cfg in (
        kernels.Config(block_m=1, block_n=32, block_k=256, packed=True, two_rows=True),
        kernels.Config(block_m=1, block_n=32, block_k=64, packed=True, paired=True, two_rows=True),
        kernels.Config(block_m=1, block_n=32, block_k=256, packed=True, paired=True, dequant_early=True, two_rows=True),
    ):
        with pytest.raises(ValueError, match="-2r pairs the word rows of one scale group"):
            kernels.prepare(cfg, w.qweight, w.scales, w.group, batch, out)


def test_dq_keeps_the_first_blocks_dequantization_before_the_wait_in_sass():
    """-dq pays only if the dequantization runs before griddepcontrol.wait (SASS ACQBULK); ptxas sinks it
    past the wait unless the kernel's branch on the dequantized tile holds it (docs/moe-down.md,
    session 6). Compiled here for sm_90 with the ptxas and cuobjdump Triton ships; no GPU needed."""
    import re
    import subprocess
    import tempfile
    from pathlib import Path

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from b70bench.moe import kernels, tune

    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    if not (tools / "ptxas").exists() or not (tools / "cuobjdump").exists():
        pytest.skip(f"no ptxas/cuobjdump shipped with Triton in {tools}")
    c = tune.parse_label("m1n32k256s1w2st1sum-packed-paired-pf-pdl-early-dq")
    fn = kernels._moe_down_vec
    ptrs = {
        "x_ptr": "*bf16",
        "qw_ptr": "*i32",
        "sc_ptr": "*bf16",
        "pair_ptr": "*i32",
        "blk_expert_ptr": "*i32",
        "rw_ptr": "*fp32",
        "part_ptr": "*fp32",
        "out_ptr": "*bf16",
        "cnt_ptr": "*i32",
    }
    consts = dict(
        TOPK=8,
        GROUP=128,
        BLOCK_M=1,
        BLOCK_N=c.block_n,
        BLOCK_K=c.block_k,
        SPLIT_K=1,
        FUSED_REDUCE=False,
        ASM=True,
        STAGES=1,
        PACKED=True,
        HALF=False,
        TILED=False,
        PAIRED=True,
        PREFETCH=True,
        PDL=True,
        EARLY=True,
        LAUNCH=0,
        DQ=True,
        TWO_ROWS=False,
        PAD=0,
        PAD_ASM="",
    )
    names = fn.arg_names
    sig = {n: ptrs.get(n, "constexpr" if n in consts else "i32") for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n in ptrs or n in ("N", "K")}
    src = ASTSource(fn, sig, constexprs={(names.index(k),): v for k, v in consts.items()}, attrs=attrs)
    compiled = triton.compile(
        src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=c.num_warps, num_stages=1, launch_pdl=True)
    )
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        sass = subprocess.run(
            [str(tools / "cuobjdump"), "-sass", str(cubin)], capture_output=True, text=True, timeout=120
        ).stdout
    ops = [line for line in sass.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", line)]
    wait = [i for i, op in enumerate(ops) if "ACQBULK" in op]
    assert len(wait) >= 1, "no griddepcontrol.wait (ACQBULK) in the SASS"
    # The 16x2 magic LOP3 (0xf000f mask) of each word: 32x256 tiles on 2 warps hold 16 words per thread per block.
    dequant = [i for i, op in enumerate(ops) if re.search(r"LOP3\.LUT .*0xf000f", op)]
    assert sum(i < wait[0] for i in dequant) >= 4 * 16, (len(dequant), wait)
