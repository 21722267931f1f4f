"""A small HTTP API in Python (standard library only) standing behind `idem proxy` in the
e2e tests and the compose file. It counts what it does and says so.

    python3 upstream.py [--port 3000] [--host 127.0.0.1] [--dedup-header Idempotency-Key]

It prints "upstream listening on HOST:PORT" once it listens (port 0 picks one).

Every request other than the ones below is an operation: it counts one request
(GET /_count's "requests"), and one effect ("effects") unless --dedup-header names a
header whose value it has seen: then it answers what the first request with that value
answered (waiting for it when it is still running), as an upstream that deduplicates by
key does. The answer is 201 (200 for GET) JSON:
    {"effect": N, "method", "path", "body", "idempotency_key": <its Idempotency-Key or
     null>, "server": "python"}
with a Content-Length, unless the query says:
    ?status=N   answer N instead
    ?hold=NAME  wait, after counting, until POST /_release?hold=NAME
    ?chunked=1  send the body chunked
and, for the request that makes the effect (not for a deduplicated repeat):
    ?fail=drop  make the effect, then close the connection without answering (a reply
                lost: the process died after its commit, the connection reset)
    ?fail=break make the effect, send the status and half the body, then close
    ?sse=1      answer an event stream: two events, then the end
    ?trailer=1  answer with a declared trailer, X-Checksum: abc

    GET  /_count               {"requests": N, "effects": M}
    POST /_release?hold=NAME   releases the requests held under NAME (and later ones)
    GET  /healthz              200
"""
import argparse
import json
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

lock = threading.Lock()
counts = {"requests": 0, "effects": 0}
answers = {}  # dedup key -> [threading.Event, answer]
holds = {}  # name -> threading.Event


def hold(name):
    with lock:
        return holds.setdefault(name, threading.Event())


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the proxy's transport expects
    dedup_header = ""

    def log_message(self, format, *args):  # quiet: the tests read stdout
        pass

    def send_json(self, status, value):
        body = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def operation(self):
        url = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        if self.command == "GET" and url.path == "/_count":
            with lock:
                return self.send_json(200, dict(counts))
        if self.command == "GET" and url.path == "/healthz":
            return self.send_json(200, {"status": "ok"})
        if self.command == "POST" and url.path == "/_release":
            hold(query.get("hold")).set()
            return self.send_json(200, {"released": query.get("hold")})

        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        key = self.headers.get(self.dedup_header) if self.dedup_header else None
        with lock:
            counts["requests"] += 1
            first = True
            if key:
                entry = answers.get(key)
                if entry is None:
                    entry = answers[key] = [threading.Event(), None]
                else:
                    first = False
            if first:
                counts["effects"] += 1
                effect = counts["effects"]
        if first:
            status = int(query.get("status") or (200 if self.command == "GET" else 201))
            answer = (status, json.dumps({"effect": effect, "method": self.command, "path": url.path,
                                          "body": body,
                                          "idempotency_key": self.headers.get("Idempotency-Key"),
                                          "server": "python"}).encode())
            if query.get("hold"):
                hold(query["hold"]).wait()
            if key:
                entry[1] = answer
                entry[0].set()
        else:
            entry[0].wait()
            answer = entry[1]
        status, out = answer
        fail = query.get("fail") if first else None
        if fail == "drop":
            return self.drop()
        if fail == "break":
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out) + 100))
            self.end_headers()
            self.wfile.write(out[:10])
            self.wfile.flush()
            return self.drop()
        if query.get("sse"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for event in (b"data: %d\n\n" % json.loads(out)["effect"], b"data: done\n\n"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.write(b"0\r\n\r\n")
            return
        if query.get("trailer"):
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Trailer", "X-Checksum")
            self.end_headers()
            self.wfile.write(b"%x\r\n%s\r\n0\r\nX-Checksum: abc\r\n\r\n" % (len(out), out))
            return
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Upstream-Effect", str(json.loads(out)["effect"]))
        if query.get("chunked"):
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (out[: len(out) // 2], out[len(out) // 2:]):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

    def drop(self):
        """Closes the connection at once, unanswered."""
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def handle_one_request(self):
        try:
            super().handle_one_request()
        except (BrokenPipeError, ConnectionResetError):
            # The client went away (a proxy killed mid-request): the effect stands.
            self.close_connection = True

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = operation


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=3000)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--dedup-header", default="")
    a = p.parse_args()
    Handler.dedup_header = a.dedup_header
    server = ThreadingHTTPServer((a.host, a.port), Handler)
    server.daemon_threads = True
    host, port = server.server_address[:2]
    print(f"upstream listening on {host}:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
