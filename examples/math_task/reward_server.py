#!/usr/bin/env python3
"""A reward server for the math task, in OpenRLHF's remote reward protocol
(what strata's `kind: remote` rewards call). Python's standard library only.

    python3 examples/math_task/reward_server.py [--host 127.0.0.1] [--port 8000] [--log FILE]

It prints the port it listens on, alone on the first line of stdout (useful
with --port 0, which lets the kernel pick a free one), then serves until
killed. Requests are logged to stderr; with --log, every scored query is
also appended to FILE as a JSON line {"query", "prompt", "label",
"reward"}: what the trainer sent and got, to read while a job runs.

Protocol. POST (any path) a JSON object of three lists of equal length:

    {"query":   ["<prompt><response>", ...],   the prompt and the response
     "prompts": ["<prompt>", ...],
     "labels":  ["12", ...]}                   the expected answers

and get back, one entry per query, in order:

    {"rewards":    [1.2, 0.0, ...],            correct + format
     "scores":     [1.0, 0.0, ...],            correct alone
     "extra_logs": {"format": [1.0, 0.0, ...]}}

Anything else is answered 400 with {"error": "..."}. GET (any path) answers
{"status": "ok"}, for health checks.

Scoring, per query (deterministic; no state between requests):
  1. response = the query without its prompt (the query starts with the
     prompt; if it does not, the whole query is the response), then, from
     its end, whitespace and end-of-turn tokens (<|im_end|>, <|eot_id|>,
     <end_of_turn>, <|endoftext|>, </s>) are stripped, repeatedly.
  2. The final answer is N of the last "#### N" in the response (spaces
     or tabs allowed between "####" and N); without one, the last number
     anywhere in the response; without any, there is none. A number is an
     optional "-", a digit, then digits and "," separators, then optionally
     "." and digits ("1,234", "-3", "2.50").
  3. correct = 1.0 if the answer and the label are equal as numbers once
     their commas are removed ("1,000" == "1000.0"), else 0.0 (also when
     either is not a number).
  4. format = 1.0 if the response's last line is "#### N" with N a number
     (spaces allowed around N), else 0.0.
  5. reward = correct + 0.2 * format; score = correct.
So a correct answer in the trained format earns 1.2, a correct one
without it 1.0, a well-formatted wrong one 0.2, anything else 0.
"""
import argparse
import json
import re
import sys
import threading
from decimal import Decimal, InvalidOperation
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FORMAT_BONUS = 0.2
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|endoftext|>", "</s>")
NUMBER = r"-?\d[\d,]*(?:\.\d+)?"
ANSWER_LINE = re.compile(r"####[ \t]*(" + NUMBER + ")")
FORMAT_LINE = re.compile(r"(?:^|\n)####[ \t]*" + NUMBER + r"[ \t]*$")


def response_of(query, prompt):
    """The response: the query after its prompt, without a trailing end of turn."""
    response = query[len(prompt):] if query.startswith(prompt) else query
    while True:
        stripped = response.rstrip()
        for token in END_OF_TURN:
            if stripped.endswith(token):
                stripped = stripped[: -len(token)]
        if stripped == response:
            return response
        response = stripped


def final_answer(response):
    """N of the last '#### N', else the last number; None without one."""
    marked = ANSWER_LINE.findall(response)
    if marked:
        return marked[-1]
    numbers = re.findall(NUMBER, response)
    return numbers[-1] if numbers else None


def as_number(text):
    try:
        return Decimal(text.replace(",", "").strip())
    except (InvalidOperation, AttributeError):
        return None


def score(query, prompt, label):
    """(correct, format) for one query, each 0.0 or 1.0."""
    response = response_of(query, prompt)
    answer, expected = as_number(final_answer(response) or ""), as_number(label)
    correct = 1.0 if answer is not None and expected is not None and answer == expected else 0.0
    formatted = 1.0 if FORMAT_LINE.search(response) else 0.0
    return correct, formatted


def handle(request):
    """The reply to one request body (a parsed JSON value), or raises ValueError."""
    if not isinstance(request, dict):
        raise ValueError("the body must be a JSON object")
    lists = [request.get(key) for key in ("query", "prompts", "labels")]
    if not all(isinstance(x, list) and all(isinstance(s, str) for s in x) for x in lists):
        raise ValueError('"query", "prompts" and "labels" must be lists of strings')
    queries, prompts, labels = lists
    if not len(queries) == len(prompts) == len(labels):
        raise ValueError('"query", "prompts" and "labels" must have the same length')
    results = [score(q, p, l) for q, p, l in zip(queries, prompts, labels)]
    return {
        "rewards": [correct + FORMAT_BONUS * formatted for correct, formatted in results],
        "scores": [correct for correct, _ in results],
        "extra_logs": {"format": [formatted for _, formatted in results]},
    }


class Handler(BaseHTTPRequestHandler):
    log_file = None  # set by main() with --log
    log_lock = threading.Lock()
    def send_json(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.send_json(200, {"status": "ok"})

    def do_POST(self):
        try:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            request = json.loads(body)
            reply = handle(request)
        except ValueError as e:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
            return self.send_json(400, {"error": str(e)})
        if self.log_file is not None:
            rows = zip(request["query"], request["prompts"], request["labels"], reply["rewards"])
            lines = "".join(json.dumps({"query": q, "prompt": p, "label": l, "reward": r}) + "\n" for q, p, l, r in rows)
            with self.log_lock:
                self.log_file.write(lines)
                self.log_file.flush()
        self.send_json(200, reply)


def main():
    parser = argparse.ArgumentParser(description="The math task's reward server (OpenRLHF's remote protocol).")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 = any free port)")
    parser.add_argument("--log", metavar="FILE", help="append every scored query to FILE as a JSON line")
    args = parser.parse_args()
    if args.log:
        Handler.log_file = open(args.log, "a", encoding="utf-8")
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
