// A small HTTP API in Node.js (no packages) standing behind `idem proxy` in the e2e
// tests, the compose file and scripts/bench-proxy. It counts what it does and says so.
//
//   node upstream.js [--port 3000] [--host 127.0.0.1] [--dedup-header Idempotency-Key]
//                    [--delay MS]
//
// It prints "upstream listening on HOST:PORT" once it listens (port 0 picks one).
//
// Every request other than the ones below is an operation: it counts one request
// (GET /_count's "requests"), and one effect ("effects") unless --dedup-header names a
// header whose value it has seen: then it answers what the first request with that
// value answered (waiting for it when it is still running), as an upstream that
// deduplicates by key does. --delay spends MS milliseconds on each effect, waiting as
// an API waits for its database (scripts/bench-proxy). The answer is 201 (200 for GET) JSON:
//   {"effect": N, "method", "path", "body", "idempotency_key": <its Idempotency-Key or
//    null>, "server": "node"}
// chunked (Node's default for a response written in parts), unless the query says:
//   ?status=N   answer N instead
//   ?hold=NAME  wait, after counting, until POST /_release?hold=NAME
//   ?length=1   send a Content-Length
// and, for the request that makes the effect (not for a deduplicated repeat):
//   ?fail=drop  make the effect, then close the connection without answering (a reply
//               lost: the process died after its commit, the connection reset)
//   ?fail=break make the effect, send the status and half the body, then close
//   ?sse=1      answer an event stream: two events, then the end
//   ?trailer=1  answer with a declared trailer, X-Checksum: abc
//
//   GET  /_count               {"requests": N, "effects": M}
//   POST /_release?hold=NAME   releases the requests held under NAME (and later ones)
//   GET  /healthz              200
"use strict";
const http = require("node:http");

const args = process.argv.slice(2);
function arg(name, def) {
  const i = args.indexOf("--" + name);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : def;
}
const port = Number(arg("port", "3000"));
const host = arg("host", "127.0.0.1");
const dedupHeader = arg("dedup-header", "").toLowerCase();
const delay = Number(arg("delay", "0"));

let requests = 0;
let effects = 0;
const answers = new Map(); // dedup key → Promise of the first answer
const holds = new Map(); // name → {promise, release}

function hold(name) {
  let h = holds.get(name);
  if (!h) {
    let release;
    const promise = new Promise((resolve) => { release = resolve; });
    h = { promise, release };
    holds.set(name, h);
  }
  return h;
}

function readBody(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => resolve(Buffer.concat(chunks).toString("utf8")));
    req.on("error", reject);
  });
}

function json(res, status, value) {
  const body = JSON.stringify(value);
  res.writeHead(status, { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(body) });
  res.end(body);
}

// execute runs an operation once: its effect, then its answer.
async function execute(req, url, body) {
  effects++;
  const answer = {
    status: Number(url.searchParams.get("status") || (req.method === "GET" ? 200 : 201)),
    body: JSON.stringify({ effect: effects, method: req.method, path: url.pathname, body, idempotency_key: req.headers["idempotency-key"] || null, server: "node" }),
  };
  if (delay > 0) await new Promise((resolve) => setTimeout(resolve, delay));
  const name = url.searchParams.get("hold");
  if (name) await hold(name).promise;
  return answer;
}

const server = http.createServer(async (req, res) => {
  const url = new URL(req.url, "http://upstream");
  try {
    if (req.method === "GET" && url.pathname === "/_count") return json(res, 200, { requests, effects });
    if (req.method === "GET" && url.pathname === "/healthz") return json(res, 200, { status: "ok" });
    if (req.method === "POST" && url.pathname === "/_release") {
      hold(url.searchParams.get("hold")).release();
      return json(res, 200, { released: url.searchParams.get("hold") });
    }
    const body = await readBody(req);
    requests++;
    const key = dedupHeader ? req.headers[dedupHeader] : undefined;
    let answer;
    let executed = false;
    if (key && answers.has(key)) {
      answer = await answers.get(key);
    } else {
      const p = execute(req, url, body);
      if (key) answers.set(key, p);
      answer = await p;
      executed = true;
    }
    const fail = executed ? url.searchParams.get("fail") : null;
    if (fail === "drop") return req.socket.destroy();
    if (fail === "break") {
      res.writeHead(answer.status, { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(answer.body) + 100 });
      return res.write(answer.body.slice(0, 10), () => res.socket.destroy());
    }
    if (url.searchParams.get("sse")) {
      res.writeHead(200, { "Content-Type": "text/event-stream" });
      res.write(`data: ${JSON.parse(answer.body).effect}\n\n`);
      return res.end("data: done\n\n");
    }
    if (url.searchParams.get("trailer")) {
      res.writeHead(answer.status, { "Content-Type": "application/json", Trailer: "X-Checksum" });
      res.write(answer.body);
      res.addTrailers({ "X-Checksum": "abc" });
      return res.end();
    }
    res.setHeader("Content-Type", "application/json");
    res.setHeader("X-Upstream-Effect", JSON.parse(answer.body).effect);
    if (url.searchParams.get("length")) res.setHeader("Content-Length", Buffer.byteLength(answer.body));
    res.writeHead(answer.status);
    // Two writes: without a Content-Length Node sends the body chunked.
    const half = Math.floor(answer.body.length / 2);
    res.write(answer.body.slice(0, half));
    res.end(answer.body.slice(half));
  } catch (err) {
    if (!res.headersSent) json(res, 500, { error: String(err) });
  }
});

server.listen(port, host, () => {
  const a = server.address();
  console.log(`upstream listening on ${a.address}:${a.port}`);
});
process.on("SIGTERM", () => server.close(() => process.exit(0)));
