"""The load: streamed completions with fixed prompts (token ids or their text), on kept-alive connections (aiohttp).

One request = POST /v1/completions with `stream: true`, `ignore_eos: true`, greedy, `return_token_ids`. Each
server-sent event line (`data: {...}`, read by aiohttp's stream reader) carries the tokens generated since the last
one: its arrival time goes to `chunk_s` and, once per token it carried, to `token_s`. `sent_s` is taken just
before the request goes out (after it got its slot), so TTFT holds no client queueing, and connections are reused
across requests (one session a level), so it holds no TCP connect after the first. A request that fails on its
connection before the server answers (a kept-alive connection closed as it was reused) is sent once more on a new
one, its sent_s the second try's. All times on one monotonic clock. Records are what metrics.level() reads: ok,
sent_s, token_s, chunk_s, token_ids, error, and retried (the first try's error) where it was sent twice.

Closed loop: `concurrency` requests in flight, each finished one replaced by the next prompt. Open loop: request i
sent `arrivals[i]` seconds after the level began, whatever is in flight. One asyncio event loop for all of them,
so the client's own CPU share (measured by the suite) is one thread's.
"""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp

KEEPALIVE_S = 2.0


def _body(model: str, prompt: list[int] | str, max_tokens: int) -> dict:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        # Token ids in every chunk: the embedded model has no tokenizer (text is empty), and the gate hashes ids.
        "return_token_ids": True,
    }


async def _request(session: aiohttp.ClientSession, url: str, body: dict, timeout_s: float) -> dict:
    rec = {"ok": False, "sent_s": None, "token_s": [], "chunk_s": [], "token_ids": [], "error": None}
    # sock_read: the longest wait for the next bytes (a stalled stream fails; a long one does not).
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout_s, sock_read=timeout_s)
    for attempt in range(2):
        rec["sent_s"] = time.monotonic()
        answered = False
        try:
            async with session.post(url, json=body, timeout=timeout) as resp:
                answered = True
                if resp.status != 200:
                    rec["error"] = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                    return rec
                await _stream(resp, rec)
            if not rec["ok"]:
                rec["error"] = "the stream ended without [DONE] (the server closed it)"
        except TimeoutError:  # aiohttp's read timeout is one
            rec["error"] = f"timed out: no bytes for {timeout_s:g} s"
        except aiohttp.ClientConnectionError as err:
            if not answered and attempt == 0:
                # A kept-alive connection the server closed as it was reused ("Can not write request body"): the
                # request never reached the server, so it goes once more on a new connection; records say so.
                rec["retried"] = f"{type(err).__name__}: {err}"[:300]
                continue
            rec["error"] = f"{type(err).__name__}: {err}"[:300]
        except (aiohttp.ClientError, ValueError) as err:
            rec["error"] = f"{type(err).__name__}: {err}"[:300]
        return rec
    return rec


async def _stream(resp, rec: dict) -> None:
    """Read one streamed completion's events into rec (its token times, chunk times, ids; ok at [DONE])."""
    async for raw in resp.content:  # one line at a time
        line = raw.decode(errors="replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            rec["ok"] = True
            return
        now = time.monotonic()
        choice = (json.loads(data).get("choices") or [{}])[0]
        ids = choice.get("token_ids")
        # A server without token ids in its chunks: one token per chunk that carries text.
        n = len(ids) if ids is not None else int(bool(choice.get("text")))
        if n:
            rec["chunk_s"].append(now)
            rec["token_s"].extend([now] * n)
        rec["token_ids"].extend(ids or [])


async def _run(port, model, prompts, max_tokens, concurrency, arrivals, timeout_s) -> list[dict]:
    url = f"http://127.0.0.1:{port}/v1/completions"
    results: list[dict | None] = [None] * len(prompts)
    # No cap: the level's concurrency is the cap. Idle connections are dropped sooner than the server drops them
    # (vLLM: VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s), so a request is seldom sent on one the server is closing.
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(i: int) -> None:
            results[i] = await _request(session, url, _body(model, prompts[i], max_tokens), timeout_s)

        if arrivals is None:
            pending = iter(range(len(prompts)))

            async def worker() -> None:
                for i in pending:
                    await one(i)

            await asyncio.gather(*(worker() for _ in range(min(concurrency, len(prompts)))))
        else:
            t0 = time.monotonic()

            async def at(i: int) -> None:
                await asyncio.sleep(max(0.0, t0 + arrivals[i] - time.monotonic()))
                await one(i)

            await asyncio.gather(*(at(i) for i in range(len(prompts))))
    return results


def closed_loop(
    port: int,
    model: str,
    prompts: list[list[int]] | list[str],
    max_tokens: int,
    concurrency: int,
    timeout_s: float = 300.0,
) -> list[dict]:
    """Every prompt once, `concurrency` in flight at a time; records in the order the prompts were given."""
    return asyncio.run(_run(port, model, prompts, max_tokens, concurrency, None, timeout_s))


def open_loop(
    port: int,
    model: str,
    prompts: list[list[int]] | list[str],
    max_tokens: int,
    arrivals: list[float],
    timeout_s: float = 300.0,
) -> list[dict]:
    """Prompt i sent arrivals[i] seconds after the start (arrivals ascending); records in prompt order."""
    return asyncio.run(_run(port, model, prompts, max_tokens, None, arrivals, timeout_s))


def completion(port: int, model: str, prompt: list[int], max_tokens: int, timeout_s: float = 300.0) -> dict:
    """One request on its own (the gate's)."""
    return closed_loop(port, model, [prompt], max_tokens, 1, timeout_s)[0]
