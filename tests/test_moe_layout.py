import pytest
import torch

from b70bench.errors import UsageError
from b70bench.moe import layout


def test_pack_unpack_round_trip_exact():
    gen = torch.Generator().manual_seed(1)
    q = torch.randint(0, 16, (3, 256, 40), generator=gen, dtype=torch.int32)
    packed = layout.pack_nibbles(q)
    assert packed.dtype == torch.int32 and packed.shape == (3, 32, 40)
    assert torch.equal(layout.unpack_nibbles(packed), q)


def test_nibble_order_is_gptq():
    # k = 8 * row + i lives in bits 4i..4i+3; a top nibble >= 8 makes the word negative.
    q = torch.zeros(8, 1, dtype=torch.int32)
    q[1, 0], q[7, 0] = 3, 9
    word = int(layout.pack_nibbles(q)[0, 0])
    assert word == (3 << 4) + (9 << 28) - 2**32


def test_quantize_dequantize_within_half_step():
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(2, 256, 24, generator=gen)
    qw, s = layout.quantize(w, scale_dtype=torch.float32)
    back = layout.dequantize(qw, s, dtype=torch.float64)
    step = s.double().repeat_interleave(layout.GROUP, dim=-2)
    assert ((back - w.double()).abs() <= step / 2 + 1e-6).all()
    # Re-quantizing dequantized weights with the same scales reproduces the nibbles.
    assert torch.equal(layout.pack_nibbles((torch.round(back / step) + 8).to(torch.int32)), qw)


def test_dequantize_matches_formula():
    gen = torch.Generator().manual_seed(3)
    q = torch.randint(0, 16, (128, 8), generator=gen, dtype=torch.int32)
    s = torch.rand(1, 8, generator=gen, dtype=torch.float64) + 0.5
    got = layout.dequantize(layout.pack_nibbles(q), s, dtype=torch.float64)
    assert torch.allclose(got, (q - 8).double() * s)


@pytest.mark.parametrize("k", [100, 192, 0])
def test_bad_k(k):
    with pytest.raises(UsageError, match="multiple"):
        layout.check_k(k)


def test_bad_dtypes():
    q = torch.zeros(2, 16, 8, dtype=torch.int32)
    with pytest.raises(UsageError, match="qweight must be int32"):
        layout.check_layout(q.to(torch.int64), torch.ones(2, 1, 8, dtype=torch.float16))
    with pytest.raises(UsageError, match="scales must be"):
        layout.check_layout(q, torch.ones(2, 1, 8, dtype=torch.int32))
    with pytest.raises(UsageError, match="does not match"):
        layout.check_layout(q, torch.ones(2, 2, 8, dtype=torch.float16))
    with pytest.raises(UsageError, match="floating point"):
        layout.quantize(torch.ones(128, 8, dtype=torch.int32))
    with pytest.raises(UsageError, match="0..15"):
        layout.pack_nibbles(torch.full((8, 2), 16, dtype=torch.int32))
