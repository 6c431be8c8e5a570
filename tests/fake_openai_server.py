"""Stands in for vLLM's OpenAI-compatible server in tests: /health, streamed /v1/completions, /metrics.

`python -m fake_openai_server --port N [--host H] [--token-s S] [--fail-start MSG] [--never-healthy]
[--stall FIRST-LAST] [--drop FIRST-LAST] [--slow-if-patched]`: each request streams max_tokens events, one token
each, S seconds apart (default 0.01), then a usage chunk if the request asks for one (stream_options), then [DONE];
requests FIRST..LAST (counted from 1 in arrival order) wait 5 s before each token instead (--stall), or have their
connection closed without an answer (--drop: a kept-alive connection the server closes as the client reuses it).
--slow-if-patched: 1.1 x S when the fake vLLM this server imports (tests/fakedist) carries the test patch.
"""

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--token-s", type=float, default=0.01)
    p.add_argument("--fail-start", default=None)
    p.add_argument("--never-healthy", action="store_true")
    p.add_argument("--stall", default="0-0")
    p.add_argument("--drop", default="0-0")
    p.add_argument("--slow-if-patched", action="store_true")
    args, _ = p.parse_known_args(argv)
    if args.slow_if_patched:
        import fakevllm.models.minimax_m2 as model

        with open(model.__file__) as f:
            args.token_s *= 1.1 if "k + q" in f.read() else 1.0
    stall_first, stall_last = (int(x) for x in args.stall.split("-"))
    drop_first, drop_last = (int(x) for x in args.drop.split("-"))
    count, lock = [0], threading.Lock()
    if args.fail_start:
        print(f"ValueError: {args.fail_start}", flush=True)
        return 1

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            if self.path == "/health" and not args.never_healthy:
                self.send_response(200)
                self.end_headers()
            elif self.path == "/metrics":
                body = b"vllm:num_requests_waiting 0\nvllm:num_preemptions_total 0\n"
                self.send_response(200)
                self.end_headers()
                self.wfile.write(body)
            else:
                self.send_response(503)
                self.end_headers()

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path != "/v1/completions":  # e.g. vllm bench serve's /tokenize probe: not served here
                self.send_response(404)
                self.end_headers()
                return
            with lock:
                count[0] += 1
                gap = 5.0 if stall_first <= count[0] <= stall_last else args.token_s
                drop = drop_first <= count[0] <= drop_last
            if drop:
                self.close_connection = True
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for i in range(req["max_tokens"]):
                time.sleep(gap)
                event = {"choices": [{"index": 0, "text": "", "token_ids": [i]}]}
                self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                self.wfile.flush()
            if (req.get("stream_options") or {}).get("include_usage"):
                # As vLLM's server does when asked: a last chunk with no choices, the token counts (vllm bench
                # serve counts output tokens from it).
                prompt = req.get("prompt")
                usage = {"prompt_tokens": len(prompt) if isinstance(prompt, list) else None}
                usage["completion_tokens"] = req["max_tokens"]
                self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")

    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
