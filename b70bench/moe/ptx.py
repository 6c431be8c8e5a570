"""PTX text for the u4 MoE down projection's decode kernels (b70bench.moe.kernels), built on the host.

The packed 16x2 path's PTX is composed from three texts that the word dot, its two-word form (-2r) and its
split for -dq (the dequantization before the wait, the products after it) share. Per word: (nibble - 8) for
all eight nibbles in four 16x2 registers (LOP3 with the 16-bit type's 2**(mantissa bits) magic, one HFMA2;
register J holds nibbles J and J+4, the halves x pair J meets), the eight products summed in four HFMA2, then
the two halves added in fp32. About 2 instructions per nibble where the fp32 path (_plane) needs 3. Products
are exact in fp16 (8-bit x times a 4-bit integer); bf16 rounds them (2**-9). fp16's 10-bit mantissa holds
nibbles at bits 0-3 and 4-7 (the second scaled by 16, undone in its HFMA2), so it shifts once per word, bf16
three times. `half` below: fp16 (True) or bf16 (False).
"""

from __future__ import annotations

CONSTS = {
    False: "mov.b32 one, 0x3F803F80; mov.b32 off, 0xC308C308;",
    True: "mov.b32 one, 0x3C003C00; mov.b32 off, 0xE408E408; mov.b32 sixt, 0x2C002C00; mov.b32 off16, 0xD480D480;",
}


def dequant(half: bool, src: str, out) -> str:
    """The word in register `src` as (nibble - 8) in the four 16x2 registers `out`."""
    o0, o1, o2, o3 = out
    if half:
        return (
            f"lop3.b32 {o0}, {src}, 0x000F000F, 0x64006400, 0xEA; "
            f"lop3.b32 {o1}, {src}, 0x00F000F0, 0x64006400, 0xEA;\n"
            f"shr.u32 t, {src}, 8;\n"
            f"lop3.b32 {o2}, t, 0x000F000F, 0x64006400, 0xEA; lop3.b32 {o3}, t, 0x00F000F0, 0x64006400, 0xEA;\n"
            f"fma.rn.f16x2 {o0}, {o0}, one, off; fma.rn.f16x2 {o1}, {o1}, sixt, off16;\n"
            f"fma.rn.f16x2 {o2}, {o2}, one, off; fma.rn.f16x2 {o3}, {o3}, sixt, off16;\n"
        )
    return (
        f"lop3.b32 {o0}, {src}, 0x000F000F, 0x43004300, 0xEA;\n"
        f"shr.u32 t, {src}, 4; lop3.b32 {o1}, t, 0x000F000F, 0x43004300, 0xEA;\n"
        f"shr.u32 t, {src}, 8; lop3.b32 {o2}, t, 0x000F000F, 0x43004300, 0xEA;\n"
        f"shr.u32 t, {src}, 12; lop3.b32 {o3}, t, 0x000F000F, 0x43004300, 0xEA;\n"
        f"fma.rn.bf16x2 {o0}, {o0}, one, off; fma.rn.bf16x2 {o1}, {o1}, one, off;\n"
        f"fma.rn.bf16x2 {o2}, {o2}, one, off; fma.rn.bf16x2 {o3}, {o3}, one, off;\n"
    )


def products(half: bool, w, x, init: str) -> str:
    """a = init + the four 16x2 products w[J] * x[J]."""
    t = "f16x2" if half else "bf16x2"
    i, j, k, m = (0, 2, 1, 3) if half else (0, 1, 2, 3)
    return (
        f"fma.rn.{t} a, {w[i]}, {x[i]}, {init}; fma.rn.{t} a, {w[j]}, {x[j]}, a;\n"
        f"fma.rn.{t} a, {w[k]}, {x[k]}, a; fma.rn.{t} a, {w[m]}, {x[m]}, a;\n"
    )


def halves(half: bool) -> str:
    """$0 = the fp32 sum of a's two halves."""
    if half:
        return "mov.b32 {lo, hi}, a; cvt.f32.f16 flo, lo; cvt.f32.f16 fhi, hi;\nadd.f32 $0, flo, fhi;\n"
    return "shl.b32 t, a, 16; and.b32 a, a, 0xFFFF0000;\nadd.f32 $0, t, a;\n"


def word_dot(half: bool, words: int) -> str:
    """$0 = sum over `words` words ($1..) of (nibble - 8) * x, the x pairs after the words, 4 per word. Two
    words (-2r: rows of one scale group) share the 16x2 accumulator and the one fp32 halves-sum."""
    regs = (
        ".reg .b32 t, w0, w1, w2, w3, a, one, off, sixt, off16, nz;\n.reg .f16 lo, hi; .reg .f32 flo, fhi;\n"
        if half
        else ".reg .b32 t, w0, w1, w2, w3, a, one, off, nz;\n"
    )
    body = ""
    for i in range(words):
        x = [f"${1 + words + 4 * i + j}" for j in range(4)]
        body += dequant(half, f"${1 + i}", ("w0", "w1", "w2", "w3"))
        body += products(half, ("w0", "w1", "w2", "w3"), x, "nz" if i == 0 else "a")
    nz = "\nmov.b32 nz, 0x80008000;\n" if half else " mov.b32 nz, 0x80008000;\n"
    return "{\n" + regs + CONSTS[half] + nz + body + halves(half) + "}"


def dequant_word(half: bool) -> str:
    """-dq, before the wait: the word $4 as four 16x2 registers of nibble - 8, $0-$3 (weights only)."""
    regs = "{\n.reg .b32 t, one, off, sixt, off16;\n" if half else "{\n.reg .b32 t, one, off;\n"
    return regs + CONSTS[half] + "\n" + dequant(half, "$4", ("$0", "$1", "$2", "$3")) + "}"


def dequantized_dot(half: bool) -> str:
    """-dq, after the wait: $0 from the dequantized registers $1-$4 and the x pairs $5-$8 (the activations)."""
    regs = (
        "{\n.reg .b32 a, nz; .reg .f16 lo, hi; .reg .f32 flo, fhi;\nmov.b32 nz, 0x80008000;\n"
        if half
        else "{\n.reg .b32 t, a, nz;\nmov.b32 nz, 0x80008000;\n"
    )
    return regs + products(half, ("$1", "$2", "$3", "$4"), ("$5", "$6", "$7", "$8"), "nz") + halves(half) + "}"


def pad(nbytes: int) -> str:
    """-oN: a static shared array of `nbytes` the program never reads; a store under a predicate no launch meets
    keeps it ($1 is the kernel's P)."""
    return (
        f"{{ .shared .align 16 .b8 b70bench_pad[{nbytes}]; .reg .pred p; setp.eq.u32 p, $1, 0x7FC00001; "
        "@p st.shared.u32 [b70bench_pad], $1; mov.u32 $0, 0; }"
    )
