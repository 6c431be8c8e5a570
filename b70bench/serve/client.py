"""The load: streamed completions with fixed token-id prompts, every token's arrival time kept.

One request = POST /v1/completions with `stream: true`, `ignore_eos: true`, greedy; each server-sent event
carries the tokens generated since the previous one (one, at decode), so its arrival time is those tokens'.
Records are what metrics.level() reads: ok, sent_s, token_s, chunk_s, error (and token_ids, for the gate). A closed
loop keeps `concurrency` requests in flight until every prompt has been sent (threads: the client's own work
is a small share of 2 cores, and a thread per request reads each stream as soon as its bytes arrive).
"""

from __future__ import annotations

import http.client
import json
import time
from concurrent.futures import ThreadPoolExecutor


def completion(port: int, model: str, prompt: list[int], max_tokens: int, timeout_s: float = 300.0) -> dict:
    body = json.dumps(
        {
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "stream": True,
            # Token ids in every chunk: the embedded model has no tokenizer (text is empty), and the gate hashes ids.
            "return_token_ids": True,
        }
    )
    rec = {"ok": False, "sent_s": time.monotonic(), "token_s": [], "chunk_s": [], "token_ids": [], "error": None}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            rec["error"] = f"HTTP {resp.status}: {resp.read().decode(errors='replace')[:300]}"
            return rec
        for raw in resp:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                rec["ok"] = True
                break
            now = time.monotonic()
            chunk = json.loads(data)
            choice = (chunk.get("choices") or [{}])[0]
            ids = choice.get("token_ids")
            # A server without token ids in its chunks: one token per chunk that carries text.
            n = len(ids) if ids is not None else int(bool(choice.get("text")))
            rec["token_s"].extend([now] * n)
            if n:
                rec["chunk_s"].append(now)  # ITL is per chunk, as vLLM's client records it
            rec["token_ids"].extend(ids or [])
        if not rec["ok"]:
            rec["error"] = "the stream ended without [DONE] (the server closed it)"
    except (OSError, http.client.HTTPException, ValueError) as err:
        rec["error"] = f"{type(err).__name__}: {err}"[:300]
    finally:
        conn.close()
    return rec


def closed_loop(port: int, model: str, prompts: list[list[int]], max_tokens: int, concurrency: int, **kw) -> list[dict]:
    """Every prompt once, `concurrency` in flight at a time; records in the order the prompts were given."""
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(lambda p: completion(port, model, p, max_tokens, **kw), prompts))
