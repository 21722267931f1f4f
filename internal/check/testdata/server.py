#!/usr/bin/env python3
"""A small charges API with hand-written Idempotency-Key support, as a team without idem
writes it, for the tests of `idem check` (internal/check). Standard library only.

    python3 server.py [--port 0] [--bug NAME] [--work 0.5] [--state FILE] [--lease S]

It prints "listening on 127.0.0.1:PORT" once it accepts connections, and "handling KEY"
when the charge of a request with that key starts.

With --state FILE the records are kept in FILE, so that they outlive the process (a
restart); an in-flight record is then taken over by a retry once it is --lease seconds
old (a dead holder's lease), as idem does.

POST /v1/charges {"amount": N, "currency": "usd"} with Authorization: Bearer <token>
(each token a principal) and an Idempotency-Key creates a charge (201), taking --work
seconds, as a call to a card processor would. GET /v1/charges lists the principal's
charges. Without --bug it is correct: keys are claimed atomically, scoped per principal,
in-flight duplicates get 409 request_in_progress with Retry-After, replays are the
stored bytes, a changed body is 409 key_reused, a rejected body frees its key.

--bug puts in one of the usual defects:
  race                   check-then-insert: the key is looked up, the charge made, and
                         only then the record inserted, so duplicates at once all run
  replay-differs         a replay is rendered again, with a fresh request_id
  changed-body-replayed  the body is not compared: a changed body gets the first answer
  stores-errors          a 400 is stored under its key, which stays bound to that body
  global-keys            keys are not scoped per principal
  accepts-bad-keys       any key header is taken as it is: empty, too long, a list
  keys-on-get            GET /v1/charges requires a key too
  optional-keys          (not a defect) a POST without a key is run without one
  no-retry-after         an in-flight duplicate's 409 has no Retry-After
  key-not-bound          a key is looked up before the request is routed, as a
                         middleware mounted on every route does: a used key sent to
                         another path or query (or method) gets the stored answer
  caches-get             a GET with a key is stored under it and replayed, as a
                         middleware mounted on every method does: stale after a write
"""

import argparse
import hashlib
import json
import os
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BUGS = ["none", "race", "replay-differs", "changed-body-replayed", "stores-errors", "global-keys",
        "accepts-bad-keys", "keys-on-get", "optional-keys", "no-retry-after", "key-not-bound", "caches-get",
        "keyless-shared", "empty-key-shared", "no-replay"]

# Visible ASCII without '"', ',' and '\\', as idem's SPEC §3 allows in a key.
KEY_CHARS = set(chr(c) for c in range(0x21, 0x7F)) - set('",\\')

LOCK = threading.Lock()
RECORDS = {}  # record key -> {"fp", "state", "status", "body"}
GETS = {}  # caches-get: (principal, key) -> the first answer of a keyed GET
CHARGES = {}  # principal -> [charge]
ARGS = None


def save():
    """Writes RECORDS to --state, when given (called with LOCK held)."""
    if not ARGS.state:
        return
    recs = [{"rk": list(rk) if isinstance(rk, tuple) else rk, **{k: (v.decode() if isinstance(v, bytes) else v) for k, v in rec.items()}}
            for rk, rec in RECORDS.items()]
    with open(ARGS.state + ".tmp", "w") as f:
        json.dump(recs, f)
    os.replace(ARGS.state + ".tmp", ARGS.state)


def load():
    """Reads RECORDS from --state, when it exists."""
    if not ARGS.state or not os.path.exists(ARGS.state):
        return
    with open(ARGS.state) as f:
        for rec in json.load(f):
            rk = rec.pop("rk")
            if "body" in rec:
                rec["body"] = rec["body"].encode()
            RECORDS[tuple(rk) if isinstance(rk, list) else rk] = rec


def encode(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def params_of(body):
    """The charge's parameters, or None when the body is not a valid charge."""
    try:
        p = json.loads(body)
    except ValueError:
        return None
    if not isinstance(p, dict) or set(p) != {"amount", "currency"}:
        return None
    amount, currency = p["amount"], p["currency"]
    if not isinstance(amount, int) or isinstance(amount, bool) or not 0 < amount <= 99999999:
        return None
    if not isinstance(currency, str) or len(currency) != 3:
        return None
    return p


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send(self, status, body, headers=None):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def error(self, status, code, headers=None):
        self.send(status, encode({"error": {"type": "idempotency_error", "code": code, "message": code}}), headers)

    def principal(self):
        auth = self.headers.get("Authorization", "")
        if not auth.startswith("Bearer ") or len(auth) == len("Bearer "):
            return None
        return hashlib.sha256(auth[len("Bearer "):].encode()).hexdigest()

    def do_GET(self):
        if self.path != "/v1/charges":
            return self.error(404, "not_found")
        scope = self.principal()
        if scope is None:
            return self.error(401, "unauthenticated")
        key = self.headers.get("Idempotency-Key")
        if ARGS.bug == "keys-on-get" and not key:
            return self.error(400, "key_required")
        with LOCK:
            data = list(CHARGES.get(scope, []))
            answer = encode({"object": "list", "data": data})
            if ARGS.bug == "caches-get" and key:
                answer = GETS.setdefault((scope, key), answer)
        self.send(200, answer)

    def do_DELETE(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if ARGS.bug == "key-not-bound" and self.stored_answer(b""):
            return
        self.error(405, "method_not_allowed")

    def stored_answer(self, body):
        """key-not-bound: answers from the record of the request's key, whatever its
        method, path and query; False when there is none."""
        scope = self.principal()
        key = self.headers.get("Idempotency-Key")
        with LOCK:
            rec = RECORDS.get((scope, key)) if scope and key else None
        if rec is None:
            return False
        self.answer_existing(rec, hashlib.sha256(body).hexdigest())
        return True

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if ARGS.bug == "key-not-bound" and self.path != "/v1/charges" and self.stored_answer(body):
            return
        if self.path != "/v1/charges":
            return self.error(404, "not_found")
        scope = self.principal()
        if scope is None:
            return self.error(401, "unauthenticated")
        keys = self.headers.get_all("Idempotency-Key") or []
        fp = hashlib.sha256(body).hexdigest()
        if not keys and ARGS.bug == "keyless-shared":
            return self.claim((scope, None), fp, scope, body)
        if keys == [""] and ARGS.bug == "empty-key-shared":
            return self.claim("", fp, scope, body, compare=False)
        if not keys and ARGS.bug in ("optional-keys", "empty-key-shared"):
            return self.create(scope, body, None)
        if not keys:
            return self.error(400, "key_required")
        key = keys[0]
        bad = len(keys) > 1 or not 1 <= len(key) <= 255 or any(c not in KEY_CHARS for c in key)
        if bad and ARGS.bug != "accepts-bad-keys":
            return self.error(400, "key_invalid")
        rk = key if ARGS.bug == "global-keys" else (scope, key)
        self.claim(rk, fp, scope, body)

    def claim(self, rk, fp, scope, body, compare=True):
        """Claims record key rk and runs the charge, or answers from its record."""
        with LOCK:
            rec = RECORDS.get(rk)
            if rec is not None and rec["state"] == "in_flight" and ARGS.state and time.time() - rec["claimed"] > ARGS.lease:
                rec = None  # the holder's lease ran out: take the key over
            if rec is None and ARGS.bug != "race":
                RECORDS[rk] = {"fp": fp, "state": "in_flight", "claimed": time.time()}  # the atomic claim
                save()
        if rec is not None:
            return self.answer_existing(rec, fp if compare else rec["fp"])
        self.create(scope, body, rk)

    def create(self, scope, body, rk):
        """Runs the charge of a claimed record key rk (None: a request without a key)."""
        fp = hashlib.sha256(body).hexdigest()
        params = params_of(body)
        if params is None:
            answer = encode({"error": {"type": "invalid_request_error", "code": "parameter_invalid", "message": "amount and currency"}})
            with LOCK:
                if rk is None:
                    pass
                elif ARGS.bug == "stores-errors":
                    RECORDS[rk] = {"fp": fp, "state": "completed", "status": 400, "body": answer}
                else:
                    RECORDS.pop(rk, None)  # a 400 frees the key
                save()
            return self.send(400, answer)

        if rk is not None:
            print("handling %s" % (self.headers.get("Idempotency-Key") or ""), flush=True)
        time.sleep(ARGS.work)  # the card processor
        charge = {"id": "ch_" + secrets.token_hex(8), "object": "charge", "amount": params["amount"],
                  "currency": params["currency"], "created": int(time.time())}
        answer = encode(charge)
        with LOCK:
            CHARGES.setdefault(scope, []).append(charge)
            if rk is not None:
                RECORDS[rk] = {"fp": fp, "state": "completed", "status": 201, "body": answer}
                save()
        self.send(201, answer)

    def answer_existing(self, rec, fp):
        if rec["fp"] != fp and ARGS.bug != "changed-body-replayed":
            return self.error(409, "key_reused")
        if rec["state"] == "in_flight":
            return self.error(409, "request_in_progress", {} if ARGS.bug == "no-retry-after" else {"Retry-After": "1"})
        if ARGS.bug == "no-replay":
            return self.error(422, "payload_mismatch")
        body = rec["body"]
        if ARGS.bug == "replay-differs":
            obj = json.loads(body)
            obj["request_id"] = "req_" + secrets.token_hex(6)
            body = encode(obj)
        self.send(rec["status"], body, {"Idempotent-Replayed": "true"})


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--bug", choices=BUGS, default="none")
    p.add_argument("--work", type=float, default=0.5)
    p.add_argument("--state", default="")
    p.add_argument("--lease", type=float, default=30)
    ARGS = p.parse_args()
    load()
    ThreadingHTTPServer.request_queue_size = 64  # the duplicates connect at once
    srv = ThreadingHTTPServer(("127.0.0.1", ARGS.port), Handler)
    print("listening on 127.0.0.1:%d" % srv.server_address[1], flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
