#!/usr/bin/env python3
"""A small charges API with hand-written Idempotency-Key support, as a team without idem
writes it, for the tests of `idem check` (internal/check). Standard library only.

    python3 server.py [--port 0] [--bug NAME[,NAME]...] [--work 0.5] [--state FILE] [--lease S]
                      [--announce start|stored|answered] [--late S] [--gap S]

It prints "listening on 127.0.0.1:PORT" once it accepts connections, and "handling KEY"
when the charge of a request with that key starts (--announce start), once its record
is completed (stored: the answer then waits --late seconds more), or once it is
answered (answered): the tests' --between commands kill the server then.

With --state FILE the records are kept in FILE, so that they outlive the process (a
restart); an in-flight record is then taken over by a retry once it is --lease seconds
old (a dead holder's lease), as idem does.

POST /v1/charges {"amount": N, "currency": "usd"} with Authorization: Bearer <token>
(each token a principal) and an Idempotency-Key creates a charge (201), taking --work
seconds, as a call to a card processor would. GET /v1/charges lists the principal's
charges; PATCH /v1/charges/ID {"amount": N} (key required) changes a charge and counts
its versions. A charge's 201 carries its Location. Without --bug it is correct: keys are
claimed atomically, scoped per principal, in-flight duplicates get 409
request_in_progress with Retry-After, replays are the stored bytes, a changed body is 409
key_reused, a rejected body frees its key, and so does a failure (500).

--bug puts in one or more (comma-separated) of the usual defects:
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
  keyless-shared         a missing key is one key per principal
  empty-key-shared       the empty key is one key for everyone, its body not compared
  no-replay              a completed key answers every retry 422
  replay-409             (django-idempotency-key's way) a completed key's retry gets 409
                         with the first answer's body and Location, byte for byte
  query-not-bound        the record key holds the method and path, not the query
  empty-key-kept         the empty key is a real key, with the principal and the body
                         hashed into it, kept for ever (keys are optional)
  close-after-500        a key over 255 characters raises: 500, and the connection is
                         closed 50 ms after the answer, which does not say so (uvicorn
                         after an exception)
  global-lock            one lock for every key: a request that finds it held gets 423
                         (the lock is released before the answer is written, as a
                         middleware's lock is when the view returns)
  queue                  one lock for every key: requests wait for it, one at a time
  patch-unkeyed          PATCH ignores the key: each retry changes the charge again
  crash-holds-key        a body without an amount raises after the claim: 500, and the
                         key stays in flight for ever
  crash-frees-key        (not a key defect) such a body raises: 500, the key released
  two-writes             a completed record is written in two steps, its body and then,
                         --gap seconds later, its status: a duplicate between the two
                         raises (TypeError) and gets 500
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
        "keyless-shared", "empty-key-shared", "no-replay", "replay-409", "query-not-bound", "empty-key-kept",
        "close-after-500", "global-lock", "queue", "patch-unkeyed", "crash-holds-key", "crash-frees-key",
        "two-writes"]

# Visible ASCII without '"', ',' and '\\', as idem's SPEC §3 allows in a key.
KEY_CHARS = set(chr(c) for c in range(0x21, 0x7F)) - set('",\\')

LOCK = threading.Lock()
GLOBAL = threading.Lock()  # global-lock, queue: one lock for every key
RECORDS = {}  # record key -> {"fp", "state", "status", "body"}
GETS = {}  # caches-get: (principal, key) -> the first answer of a keyed GET
CHARGES = {}  # principal -> [charge]
BY_ID = {}  # charge id -> (principal, charge)
ARGS = None


def bug(name):
    """Whether --bug names the defect name."""
    return name in ARGS.bug


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

    def send(self, status, body, headers=None, content_type="application/json"):
        if getattr(self, "held", None) is not None:  # written once the lock is released
            self.held.append((status, body, headers, content_type))
            return
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def error(self, status, code, headers=None):
        self.send(status, encode({"error": {"type": "idempotency_error", "code": code, "message": code}}), headers)

    def crash(self, close=False):
        """Answers 500 as a framework does for an exception; with close, closes the
        connection 50 ms later without having said so (uvicorn behind Starlette's
        ServerErrorMiddleware)."""
        self.send(500, b"Internal Server Error", content_type="text/plain; charset=utf-8")
        if close:
            self.wfile.flush()
            time.sleep(0.05)
            self.close_connection = True

    def principal(self):
        auth = self.headers.get("Authorization", "")
        if not auth.startswith("Bearer ") or len(auth) == len("Bearer "):
            return None
        return hashlib.sha256(auth[len("Bearer "):].encode()).hexdigest()

    def route(self):
        """The request's path, without the query under query-not-bound."""
        return self.path.split("?")[0] if bug("query-not-bound") else self.path

    def do_GET(self):
        if self.path != "/v1/charges":
            return self.error(404, "not_found")
        scope = self.principal()
        if scope is None:
            return self.error(401, "unauthenticated")
        key = self.headers.get("Idempotency-Key")
        if bug("keys-on-get") and not key:
            return self.error(400, "key_required")
        with LOCK:
            data = list(CHARGES.get(scope, []))
            answer = encode({"object": "list", "data": data})
            if bug("caches-get") and key:
                answer = GETS.setdefault((scope, key), answer)
        self.send(200, answer)

    def do_DELETE(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if bug("key-not-bound") and self.stored_answer(b""):
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

    def do_PATCH(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        prefix = "/v1/charges/"
        scope = self.principal()
        if scope is None:
            return self.error(401, "unauthenticated")
        with LOCK:
            found = BY_ID.get(self.path[len(prefix):]) if self.path.startswith(prefix) else None
        if found is None or found[0] != scope:
            return self.error(404, "not_found")
        key = self.headers.get("Idempotency-Key")
        if not key:
            return self.error(400, "key_required")
        fp = hashlib.sha256(b"PATCH " + self.path.encode() + b" " + body).hexdigest()
        if bug("patch-unkeyed"):
            return self.patch(found[1], body, None)
        with LOCK:
            rec = RECORDS.get((scope, key))
            if rec is None:
                RECORDS[(scope, key)] = {"fp": fp, "state": "in_flight", "claimed": time.time()}
        if rec is not None:
            return self.answer_existing(rec, fp)
        self.patch(found[1], body, (scope, key), fp)

    def patch(self, charge, body, rk, fp=None):
        """Changes charge as body says, a new version, and answers it (storing the
        answer under record key rk, unless None)."""
        try:
            p = json.loads(body)
            amount = p.get("amount", charge["amount"])
            assert isinstance(amount, int) and 0 < amount <= 99999999
        except (ValueError, AttributeError, AssertionError):
            with LOCK:
                RECORDS.pop(rk, None)
            return self.error(400, "parameter_invalid")
        with LOCK:
            charge["amount"] = amount
            charge["version"] += 1
            answer = encode(charge)
            if rk is not None:
                RECORDS[rk] = {"fp": fp, "state": "completed", "status": 200, "body": answer, "headers": {}}
        self.send(200, answer)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if bug("key-not-bound") and self.path != "/v1/charges" and self.stored_answer(body):
            return
        if self.route() != "/v1/charges":
            return self.error(404, "not_found")
        scope = self.principal()
        if scope is None:
            return self.error(401, "unauthenticated")
        keys = self.headers.get_all("Idempotency-Key") or []
        fp = hashlib.sha256(body).hexdigest()
        if not keys and bug("keyless-shared"):
            return self.claim((scope, None), fp, scope, body)
        if keys == [""] and bug("empty-key-shared"):
            return self.claim("", fp, scope, body, compare=False)
        if keys == [""] and bug("empty-key-kept"):
            return self.claim(("", scope, fp), fp, scope, body)
        if not keys and (bug("optional-keys") or bug("empty-key-shared") or bug("empty-key-kept")):
            return self.create(scope, body, None)
        if not keys:
            return self.error(400, "key_required")
        key = keys[0]
        if bug("close-after-500") and len(key) > 255:
            return self.crash(close=True)  # a cache key too long for the store
        bad = len(keys) > 1 or not 1 <= len(key) <= 255 or any(c not in KEY_CHARS for c in key)
        if bad and not bug("accepts-bad-keys"):
            return self.error(400, "key_invalid")
        rk = key if bug("global-keys") else (scope, key)
        if bug("global-lock") or bug("queue"):
            # The lock is held while the view runs and released when it returns, before
            # the server writes its answer (a middleware's lock): a client that has
            # the answer never finds the lock still held by its own request.
            if not GLOBAL.acquire(blocking=bug("queue")):
                return self.send(423, encode({"detail": "Resource is locked"}))
            self.held = []
            try:
                self.claim(rk, fp, scope, body)
            finally:
                GLOBAL.release()
                held, self.held = self.held, None
                for answer in held:
                    self.send(*answer)
            return
        self.claim(rk, fp, scope, body)

    def claim(self, rk, fp, scope, body, compare=True):
        """Claims record key rk and runs the charge, or answers from its record."""
        with LOCK:
            rec = RECORDS.get(rk)
            if rec is not None and rec["state"] == "in_flight" and ARGS.state and time.time() - rec["claimed"] > ARGS.lease:
                rec = None  # the holder's lease ran out: take the key over
            if rec is None and not bug("race"):
                RECORDS[rk] = {"fp": fp, "state": "in_flight", "claimed": time.time()}  # the atomic claim
                save()
        if rec is not None:
            return self.answer_existing(rec, fp if compare else rec["fp"])
        self.create(scope, body, rk)

    def announce(self, when):
        if ARGS.announce == when:
            print("handling %s" % (self.headers.get("Idempotency-Key") or ""), flush=True)

    def create(self, scope, body, rk):
        """Runs the charge of a claimed record key rk (None: a request without a key)."""
        fp = hashlib.sha256(body).hexdigest()
        params = params_of(body)
        if params is None and (bug("crash-holds-key") or bug("crash-frees-key")):
            try:
                p = json.loads(body)
            except ValueError:
                p = None
            if isinstance(p, dict) and "amount" not in p:  # the handler reads p["amount"]: a KeyError
                if bug("crash-frees-key"):
                    with LOCK:
                        RECORDS.pop(rk, None)
                        save()
                return self.crash()
        if params is None:
            answer = encode({"error": {"type": "invalid_request_error", "code": "parameter_invalid", "message": "amount and currency"}})
            with LOCK:
                if rk is None:
                    pass
                elif bug("stores-errors"):
                    RECORDS[rk] = {"fp": fp, "state": "completed", "status": 400, "body": answer, "headers": {}}
                else:
                    RECORDS.pop(rk, None)  # a 400 frees the key
                save()
            return self.send(400, answer)

        if rk is not None:
            self.announce("start")
        time.sleep(ARGS.work)  # the card processor
        charge = {"id": "ch_" + secrets.token_hex(8), "object": "charge", "amount": params["amount"],
                  "currency": params["currency"], "created": int(time.time()), "version": 1}
        answer = encode(charge)
        headers = {"Location": "/v1/charges/" + charge["id"]}
        with LOCK:
            CHARGES.setdefault(scope, []).append(charge)
            BY_ID[charge["id"]] = (scope, charge)
            if rk is not None and bug("two-writes"):
                # The body first, then the status: a reader between the two finds a
                # completed record without its status.
                RECORDS[rk] = {"fp": fp, "state": "completed", "status": None, "body": answer, "headers": headers}
        if rk is not None and bug("two-writes"):
            time.sleep(ARGS.gap)
        with LOCK:
            if rk is not None:
                RECORDS[rk] = {"fp": fp, "state": "completed", "status": 201, "body": answer, "headers": headers}
                save()
        if rk is not None:
            self.announce("stored")
            if ARGS.late:
                time.sleep(ARGS.late)
        self.send(201, answer, headers)
        if rk is not None:
            self.wfile.flush()
            self.announce("answered")

    def answer_existing(self, rec, fp):
        if rec["fp"] != fp and not bug("changed-body-replayed"):
            return self.error(409, "key_reused")
        if rec["state"] == "in_flight":
            return self.error(409, "request_in_progress", {} if bug("no-retry-after") else {"Retry-After": "1"})
        if bug("no-replay"):
            return self.error(422, "payload_mismatch")
        if rec["status"] is None:  # two-writes: between the body and the status
            return self.crash()  # TypeError: '<' not supported between 'NoneType' and 'int'
        body = rec["body"]
        if bug("replay-differs"):
            obj = json.loads(body)
            obj["request_id"] = "req_" + secrets.token_hex(6)
            body = encode(obj)
        if bug("replay-409"):
            return self.send(409, body, rec.get("headers"))
        self.send(rec["status"], body, {**rec.get("headers", {}), "Idempotent-Replayed": "true"})


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--bug", default="none")
    p.add_argument("--work", type=float, default=0.5)
    p.add_argument("--state", default="")
    p.add_argument("--lease", type=float, default=30)
    p.add_argument("--announce", choices=["start", "stored", "answered"], default="start")
    p.add_argument("--late", type=float, default=0)
    p.add_argument("--gap", type=float, default=0.05)
    ARGS = p.parse_args()
    ARGS.bug = ARGS.bug.split(",")
    for b in ARGS.bug:
        if b not in BUGS:
            p.error("unknown --bug %s: want %s" % (b, ", ".join(BUGS)))
    load()
    ThreadingHTTPServer.request_queue_size = 64  # the duplicates connect at once
    srv = ThreadingHTTPServer(("127.0.0.1", ARGS.port), Handler)
    print("listening on 127.0.0.1:%d" % srv.server_address[1], flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
