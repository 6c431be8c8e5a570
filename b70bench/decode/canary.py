"""Text canaries: a prompt and a substring its greedy continuation must contain.

They complement the token hash where a tokenizer exists: the hash says "exactly the reviewed
tokens", a canary says "still says Paris" in words a person can read. A canary without an
expected substring only records the text (to review before pinning one), like an unpinned hash.
A failing canary fails the quality gate exactly as a hash mismatch does; canaries that could not
run (no tokenizer) are reported as skipped with the reason, never silently dropped.
"""

from __future__ import annotations

import json
from pathlib import Path

from b70bench.errors import UsageError

SEPARATOR = "=>"
DEFAULT_MAX_TOKENS = 32
PASS, FAIL = 0, 1
# Files that make a local model directory loadable by AutoTokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _checked(c: dict, where: str) -> dict:
    prompt, expected = c.get("prompt"), c.get("expected")
    max_tokens = c.get("max_tokens", DEFAULT_MAX_TOKENS)
    if not isinstance(prompt, str) or not prompt.strip():
        raise UsageError(f"{where}: a canary needs a non-empty prompt: write PROMPT{SEPARATOR}EXPECTED")
    if expected is not None and (not isinstance(expected, str) or not expected):
        raise UsageError(f"{where}: a canary's expected text must be a non-empty string (or left out to only record)")
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise UsageError(f"{where}: max_tokens must be a positive integer, got {max_tokens!r}")
    return {"prompt": prompt, "expected": expected, "max_tokens": max_tokens}


def parse(text: str) -> dict:
    """'PROMPT=>EXPECTED' (the last '=>' splits), or 'PROMPT' alone to record the text unchecked."""
    prompt, sep, expected = text.rpartition(SEPARATOR)
    if not sep:
        prompt, expected = text, None
    return _checked({"prompt": prompt, "expected": expected}, f"canary {text!r}")


def load(path: str | Path) -> list[dict]:
    """A JSON list of {"prompt", "expected"[, "max_tokens"]} (or {"canaries": [...]}), else PROMPT=>EXPECTED lines."""
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise UsageError(f"cannot read canaries file {path}: {err.strerror}: pass an existing file") from None
    try:
        data = json.loads(text)
    except ValueError:
        return [parse(line) for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    items = data.get("canaries") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise UsageError(f'{path}: expected a JSON list of canaries or {{"canaries": [...]}}')
    return [_checked(c if isinstance(c, dict) else {}, f"{path} item {i}") for i, c in enumerate(items)]


def normalize(canaries) -> list[dict]:
    """Canaries given to measure(): dicts, 'PROMPT=>EXPECTED' strings or (prompt, expected) pairs."""
    out = []
    for i, c in enumerate(canaries or []):
        if isinstance(c, str):
            out.append(parse(c))
        elif isinstance(c, dict):
            out.append(_checked(c, f"canary {i}"))
        else:
            prompt, expected = c
            out.append(_checked({"prompt": prompt, "expected": expected}, f"canary {i}"))
    return out


def local_without_tokenizer(path: str) -> bool:
    """A local directory that holds none of the files a tokenizer is loaded from."""
    p = Path(path)
    return p.is_dir() and not any((p / name).exists() for name in TOKENIZER_FILES)


def check(results: list[dict]) -> list[dict]:
    """Each child result with `passed`: True / False, None when it had nothing to check against."""
    return [
        {**r, "passed": None if r.get("expected") is None else r["expected"] in (r.get("text") or "")} for r in results
    ]


def verdict(checked: list[dict], skipped: str | None) -> tuple[int | None, str | None]:
    """(canary_gate, message): 1 when any canary failed, 0 when all checked ones passed, None otherwise."""
    if skipped:
        return None, f"text canaries NOT checked: {skipped}"
    failed = [c for c in checked if c["passed"] is False]
    if failed:
        c = failed[0]
        return FAIL, (
            f"QUALITY GATE FAILED: {len(failed)} of {len(checked)} text canaries failed; "
            f"{c['prompt']!r} gave {_clip(c.get('text'))!r}, which lacks {c['expected']!r}; "
            "speed figures withheld"
        )
    if any(c["passed"] for c in checked):
        unpinned = sum(c["passed"] is None for c in checked)
        return PASS, f"text canaries passed ({len(checked) - unpinned} checked" + (
            f", {unpinned} only recorded)" if unpinned else ")"
        )
    if checked:
        return None, f"text canaries only recorded ({len(checked)}): review the text, then pass PROMPT=>EXPECTED"
    return None, None


def _clip(text: str | None, n: int = 80) -> str:
    text = text or ""
    return text if len(text) <= n else text[:n] + "..."


def run_in_engine(llm, canaries: list[dict], tokenizer_path: str, trust_remote_code: bool = False) -> tuple[list, str]:
    """Greedy continuation of each canary in a running LLM (called in the child). Returns (results, skipped).

    The engine itself stays token-id only (its configuration, and so the timed figures and the
    token hash, do not depend on whether canaries were asked for); the tokenizer is loaded here.
    Each canary is its own generate call, so its text does not depend on which others were given.
    """
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer_path, trust_remote_code=trust_remote_code)
    except Exception as err:  # any reason a tokenizer cannot be had is reported, not raised
        return [], f"no tokenizer at {tokenizer_path}: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
    stop = [tok.eos_token_id] if tok.eos_token_id is not None else None
    results = []
    for c in canaries:
        ids = tok(c["prompt"])["input_ids"]
        sp = SamplingParams(temperature=0.0, max_tokens=c["max_tokens"], stop_token_ids=stop, detokenize=False)
        (out,) = llm.generate([TokensPrompt(prompt_token_ids=ids)], sp, use_tqdm=False)
        gen = list(out.outputs[0].token_ids)
        results.append(
            {**c, "prompt_token_ids": ids, "token_ids": gen, "text": tok.decode(gen, skip_special_tokens=True)}
        )
    return results, None
