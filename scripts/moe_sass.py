"""One sha256 of the SASS of every Triton kernel the moe-down variants launch on MiniMax shapes, for sm_90.

    PYTHONPATH=. python scripts/moe_sass.py > sass.txt

Needs Triton with its NVIDIA backend (ptxas and cuobjdump ship with it; the `test` extra installs Triton), no GPU.

Runs the `triton` variant and the `triton-htile` policy's prepare() as on an H200 (programmatic dependent launch
on, 132 SMs, 228 KiB of shared memory per SM) for hidden 3072, intermediate 1536, 256 experts, top-8, TP 1 and 4,
tokens 1 4 16 64 512, bf16; every kernel they would launch is compiled instead, with the specialization Triton's
launcher gives the same arguments, by the ptxas Triton ships (no GPU needed; a fresh Triton cache, so nothing is
reused). One line per launched kernel: the sha256 of its SASS (instructions and their encodings, and the shared
memory it declares; cuobjdump's line-info and file-name comments are left out), its number of instructions,
the kernel, the shape and the tiling. Two checkouts whose kernels compute the same thing print the same lines:
a check that moving host code or comments left the kernels alone. Run it in each checkout and diff the outputs.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import types
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # compile for the GPU, inline PTX included
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="moe-sass-cache-")

import torch  # noqa: E402
import triton  # noqa: E402
from triton import knobs  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

from b70bench.moe import kernels, shapes, variants  # noqa: E402

try:
    from b70bench.moe import launch
except ImportError:  # before the split of kernels.py, the host side lived there too
    launch = kernels

TARGET = GPUTarget("cuda", 90, 32)
H200 = types.SimpleNamespace(multi_processor_count=132, shared_memory_per_multiprocessor=233472)
TOOLS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
TPS, TOKENS = (1, 4), (1, 4, 16, 64, 512)
INSTRUCTION = re.compile(r"/\*[0-9a-f]{4}\*/")


def as_on_an_h200() -> None:
    """The policy and prepare() see an sm_90 device with an H200's SMs and shared memory."""
    launch.pdl_reason = lambda device: None
    for name in ("sm_count", "_sm_count"):
        if hasattr(variants, name):
            setattr(variants, name, lambda device: H200.multi_processor_count)
    torch.cuda.get_device_properties = lambda device=None: H200
    pad = launch.residency_pad
    launch.residency_pad = lambda device, per_sm, own: pad(torch.device("cuda"), per_sm, own)


BACKEND = make_backend(TARGET)
_compiled: dict = {}


def compile_sm90(fn, args, kwargs):
    """What JITFunction.run compiles for these arguments, for TARGET instead of the current device."""
    kwargs = dict(kwargs)
    kwargs["debug"] = kwargs.get("debug", fn.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    kwargs["fpsan_homomorphic_casts"] = knobs.compilation.fpsan_homomorphic_casts
    binder = create_function_from_signature(fn.signature, fn.params, BACKEND)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(BACKEND, kwargs, bound, specialization, options)
    key = repr(
        (fn.__name__, signature, sorted(constexprs.items()), sorted(attrs.items()), sorted(options.__dict__.items()))
    )
    if key not in _compiled:
        src = ASTSource(fn, signature, constexprs, attrs)
        _compiled[key] = triton.compile(src, target=TARGET, options=options.__dict__)
    return _compiled[key]


def sass_sha(compiled) -> tuple[str, int]:
    """sha256 of the kernel's SASS instructions (with their encodings) and declared shared memory, and how many
    instructions there are."""
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        sass = subprocess.run(
            [str(TOOLS / "cuobjdump"), "-sass", str(cubin)], capture_output=True, text=True, timeout=300, check=True
        ).stdout
    ops = [line.strip() for line in sass.splitlines() if INSTRUCTION.search(line)]
    kept = [line.strip() for line in sass.splitlines() if line.strip().startswith("Function :")] + ops
    kept.append(f"shared {compiled.metadata.shared}")
    return hashlib.sha256("\n".join(kept).encode()).hexdigest(), len(ops)


def main() -> int:
    if not (TOOLS / "ptxas").exists() or not (TOOLS / "cuobjdump").exists():
        print(f"no ptxas/cuobjdump shipped with Triton in {TOOLS}", file=sys.stderr)
        return 1
    as_on_an_h200()
    launched = []
    for fn in (kernels._moe_down_vec, kernels._moe_down_dot, kernels._moe_down_wide, kernels._moe_sum):

        def run(*args, grid, warmup, _fn=fn, **kwargs):
            compiled = compile_sm90(_fn, args, kwargs)
            if not warmup:
                launched.append((_fn.__name__, compiled))
            return compiled

        fn.run = run
    shape = shapes.MoeShape(hidden=3072, intermediate=1536, experts=256, topk=8)
    dtype = torch.bfloat16
    for v in (variants.TritonVariant("triton"), variants.TritonVariant("triton-htile", htile=True)):
        for tp in TPS:
            k = shape.k(tp)
            # prepare() reads only the weights' layout (one expert is as good as 256: no kernel runs)
            w = shapes.Weights(
                torch.zeros((1, k // 8, shape.hidden), dtype=torch.int32),
                torch.zeros((1, k // shape.group, shape.hidden), dtype=dtype),
                shape.group,
            )
            for tokens in TOKENS:
                batch = shapes.random_batch(shape, k, tokens, dtype, torch.device("cpu"), 1000 * tp + tokens)
                out = torch.empty((tokens, shape.hidden), dtype=dtype)
                launched.clear()
                v.prepare(w, batch, out)()
                for i, (name, compiled) in enumerate(launched):
                    sha, ops = sass_sha(compiled)
                    print(
                        f"{sha} {ops:>5} ops {name:<14} {v.name:<12} tp{tp} tokens {tokens:<3} launch {i} "
                        f"{v.label(w, batch)}",
                        flush=True,
                    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
