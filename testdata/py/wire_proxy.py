"""A faulty network between idem and an S3-compatible server, for the tests.

Forwards every HTTP request to UPSTREAM and, for a seeded share RATE of them, fails it
the way a real network and a real store do:

  reset      the connection closes before the request reaches the store
  lost       the store did the request, the connection closes before its answer
  truncated  the answer's headers promise a body the connection never finishes
  slowdown   503 SlowDown for this request and the next few (a burst)
  stall      the answer waits STALL seconds (a slow store; not past the client's
             timeout, which would make a test minutes long)
  duplicate  the request reaches the store twice (a retry the client never saw);
             the client gets the second answer

With `down`, every request gets 503 SlowDown: the store stays down.

    python wire_proxy.py PORT UPSTREAM SEED RATE STATS [down]

STATS is a file the proxy rewrites after each fault: a JSON object counting the
requests and each kind of fault.
"""

import http.client
import http.server
import json
import os
import random
import sys
import threading
import time
import urllib.parse

KINDS = ["reset", "lost", "truncated", "slowdown", "stall", "duplicate"]
STALL = 1.5
SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


class State:
    def __init__(self, seed, rate, stats, down):
        self.rng = random.Random(seed)
        self.rate = rate
        self.stats_path = stats
        self.down = down
        self.lock = threading.Lock()
        self.burst = 0
        self.counts = {"requests": 0, **{k: 0 for k in KINDS}}

    def choose(self):
        """The fault for the next request, or None."""
        with self.lock:
            self.counts["requests"] += 1
            if self.down:
                kind = "slowdown"
            elif self.burst > 0:
                self.burst -= 1
                kind = "slowdown"
            elif self.rng.random() < self.rate:
                kind = self.rng.choice(KINDS)
                if kind == "slowdown":
                    self.burst = self.rng.randint(1, 4)
            else:
                return None
            self.counts[kind] += 1
            with open(self.stats_path + ".tmp", "w") as f:
                json.dump(self.counts, f)
            # Atomic for the reader.
            os.replace(self.stats_path + ".tmp", self.stats_path)
            return kind


def handler(upstream, state):
    up = urllib.parse.urlsplit(upstream)

    class Proxy(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def forward(self, body):
            conn = http.client.HTTPConnection(up.hostname, up.port, timeout=60)
            headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
            headers["Host"] = up.netloc
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            conn.close()
            return resp.status, resp.getheaders(), data

        def answer(self, status, headers, data, cut=False):
            self.send_response_only(status)
            # A HEAD's length is the object's, and it has no body.
            skip = ("transfer-encoding", "connection")
            if self.command != "HEAD":
                skip += ("content-length",)
            for k, v in headers:
                if k.lower() not in skip:
                    self.send_header(k, v)
            if self.command != "HEAD":
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if cut:
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)
            else:
                self.wfile.write(data)

        def body(self):
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0], 16)
                    if size == 0:
                        self.rfile.readline()
                        break
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
                del self.headers["Transfer-Encoding"]
                data = b"".join(chunks)
                self.headers["Content-Length"] = str(len(data))
                return data
            n = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(n) if n else None

        def handle_any(self):
            body = self.body()
            kind = state.choose()
            if kind == "reset":
                self.close_connection = True
                self.connection.shutdown(2)
                return
            if kind == "slowdown":
                self.answer(503, [("Content-Type", "application/xml")], SLOWDOWN)
                return
            if kind == "stall":
                time.sleep(STALL)
            if kind == "duplicate":
                self.forward(body)
            status, headers, data = self.forward(body)
            if kind == "lost":
                self.close_connection = True
                self.connection.shutdown(2)
                return
            # A truncated answer needs a body to cut.
            self.answer(status, headers, data, cut=kind == "truncated" and len(data) > 1)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = handle_any

    return Proxy


def main():
    port, upstream, seed, rate, stats = sys.argv[1:6]
    down = len(sys.argv) > 6 and sys.argv[6] == "down"
    state = State(int(seed), float(rate), stats, down)
    with open(stats, "w") as f:
        json.dump(state.counts, f)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", int(port)), handler(upstream, state))
    server.daemon_threads = True
    print(f"wire proxy on http://127.0.0.1:{port} to {upstream}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
