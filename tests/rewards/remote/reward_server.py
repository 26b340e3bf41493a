#!/usr/bin/env python3
"""A reward server in OpenRLHF's remote protocol for remote_reward_test.cc,
stdlib only. Binds 127.0.0.1 (or --bind) on a kernel-picked port and prints
the port, alone on the first line of stdout, before it serves.

    python3 reward_server.py --record FILE [--bind ADDR] [--token T] [--sleep S]

Every request is appended to FILE as one JSON line when it arrives (before
any sleep, flushed before the reply): {"path", "host", "authorization",
"content_type", "in_flight" (requests being served then, this one
included), "body" (the parsed JSON body, or null)}.

POST paths (the query string is ignored, except by /redirect):
  /ok            rewards[i] = len(query[i]) + (0.5 if labels[i] occurs in
                 query[i] else 0); scores[i] = 1.0 or 0.0 (the label
                 occurs); extra_logs = {"query_len": [len(query[i])...],
                 "batch": len(query)}. Sleeps S seconds first when a
                 prompt is "sleep:S" (the longest such S).
  /auth          /ok when "Authorization: Bearer <--token>"; else 401
  /slow          sleeps --sleep seconds (default 10), then /ok
  /wrong_count   /ok with one reward too few
  /nan           rewards NaN, as Python's json.dumps writes it
  /inf           rewards 1e999 (a JSON number no double holds)
  /string        rewards as strings ("3")
  /list          a top-level list of rewards, no object
  /no_rewards    {"score": [...]}: the wrong key
  /not_json      a text body
  /status_N      HTTP N with a short text body
  /redirect?to=U 302 with Location U
anything else    404
"""
import argparse
import json
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ARGS = None
LOCK = threading.Lock()
IN_FLIGHT = 0


def ok_reply(body):
    queries, labels = body["query"], body["labels"]
    hits = [1.0 if label and label in query else 0.0 for query, label in zip(queries, labels)]
    return {
        "rewards": [len(q) + 0.5 * h for q, h in zip(queries, hits)],
        "scores": hits,
        "extra_logs": {"query_len": [len(q) for q in queries], "batch": len(queries)},
        "unknown_field": "ignored",
    }


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # stdout is the port line only; keep stderr quiet
        pass

    def reply(self, status, payload=None, text=None, headers=()):
        data = text.encode() if text is not None else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain" if text is not None else "application/json")
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def record(self, body):
        global IN_FLIGHT
        with LOCK:
            IN_FLIGHT += 1
            line = {
                "path": urllib.parse.urlsplit(self.path).path,
                "host": self.headers.get("Host"),
                "authorization": self.headers.get("Authorization"),
                "content_type": self.headers.get("Content-Type"),
                "in_flight": IN_FLIGHT,
                "body": body,
            }
            with open(ARGS.record, "a") as f:
                f.write(json.dumps(line) + "\n")

    def do_GET(self):
        self.handle_any(None)

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        self.handle_any(body)

    def handle_any(self, body):
        global IN_FLIGHT
        self.record(body)
        try:
            self.answer(body)
        finally:
            with LOCK:
                IN_FLIGHT -= 1

    def answer(self, body):
        url = urllib.parse.urlsplit(self.path)
        path = url.path
        if path.startswith("/status_"):
            return self.reply(int(path[len("/status_"):]), text="the reward model is not loaded\n" * 20)
        if path == "/redirect":
            target = urllib.parse.parse_qs(url.query).get("to", ["http://127.0.0.2/"])[0]
            return self.reply(302, text="moved\n", headers=[("Location", target)])
        if path == "/not_json":
            return self.reply(200, text="<html>not json</html>")
        if body is None or not isinstance(body, dict):
            return self.reply(400, text="expected a JSON object\n")
        if path == "/auth" and self.headers.get("Authorization") != f"Bearer {ARGS.token}":
            return self.reply(401, {"error": "unauthorized"})
        if path == "/slow":
            time.sleep(ARGS.sleep)
        naps = [float(p[len("sleep:"):]) for p in body.get("prompts", []) if p.startswith("sleep:")]
        if naps:
            time.sleep(max(naps))
        n = len(body["query"])
        if path in ("/ok", "/auth", "/slow"):
            return self.reply(200, ok_reply(body))
        if path == "/wrong_count":
            out = ok_reply(body)
            out["rewards"] = out["rewards"][:-1]
            return self.reply(200, out)
        if path == "/nan":
            return self.reply(200, {"rewards": [float("nan")] * n})
        if path == "/inf":
            return self.reply(200, text='{"rewards": [' + ", ".join(["1e999"] * n) + "]}")
        if path == "/string":
            return self.reply(200, {"rewards": ["3"] * n})
        if path == "/list":
            return self.reply(200, [1.0] * n)
        if path == "/no_rewards":
            return self.reply(200, {"score": [1.0] * n})
        return self.reply(404, text="no such path\n")


def main():
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", required=True)
    parser.add_argument("--bind", default="127.0.0.1")
    parser.add_argument("--token", default="")
    parser.add_argument("--sleep", type=float, default=10.0)
    ARGS = parser.parse_args()
    server = ThreadingHTTPServer((ARGS.bind, 0), Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
