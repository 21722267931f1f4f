// A charges API in Express with express-idempotency, mounted as its READMEs say, for
// the tests of `idem check` against third-party libraries (internal/check,
// thirdparty_test.go). Its packages are pinned in package.json and package-lock.json
// and installed by .ci/run with npm ci.
//
//   node server.js [--port 0] [--store memory|redis] [--redis URL] [--work MS]
//
// It prints "listening on 127.0.0.1:PORT" once it accepts connections, and "handling
// KEY" when the handler of a charge with that Idempotency-Key starts.
//
// --store memory mounts the middleware as express-idempotency's README does:
// app.post('*', idempotency.idempotency()), its in-memory data adapter. --store redis
// mounts it as express-idempotency-redis-adapter's README does:
// app.use(idempotency.idempotency({ dataAdapter: adapter })), on the Redis at --redis.
// Each route checks isHit first, as the README's route does.
//
// POST /v1/charges {"amount": N, "currency": "usd"} with Authorization: Bearer <token>
// creates a charge: 201 with Location, taking --work milliseconds (a card processor);
// a body that is not a charge is 400. GET /v1/charges lists the token's charges.
"use strict";
const crypto = require("node:crypto");
const express = require("express");
const idempotency = require("express-idempotency");

const { port, store, redis, work } = require("./flags");

async function main() {
  const app = express();
  app.use(express.json());
  if (store === "redis") {
    const RedisAdapter = require("express-idempotency-redis-adapter").default;
    const adapter = new RedisAdapter({ connectionConfig: { url: redis } });
    await adapter.connect();
    app.use(idempotency.idempotency({ dataAdapter: adapter }));
  } else {
    app.post("*", idempotency.idempotency());
  }

  const charges = new Map(); // token -> [charge]
  const principal = (req) => {
    const auth = req.get("authorization") || "";
    return auth.startsWith("Bearer ") && auth.length > 7 ? auth.slice(7) : null;
  };

  app.post("/v1/charges", async (req, res) => {
    if (idempotency.getSharedIdempotencyService().isHit(req)) {
      return;
    }
    // The middleware has claimed the key: a test that kills the server mid-request
    // waits for this line (stdout is synchronous on a pipe).
    console.log("handling " + (req.get("idempotency-key") || ""));
    const who = principal(req);
    if (!who) {
      return res.status(401).json({ error: { code: "unauthenticated" } });
    }
    const { amount, currency } = req.body || {};
    if (!Number.isInteger(amount) || amount <= 0 || typeof currency !== "string" || currency.length !== 3) {
      return res.status(400).json({ error: { code: "parameter_invalid", message: "amount and currency" } });
    }
    await new Promise((resolve) => setTimeout(resolve, work));
    const charge = { id: "ch_" + crypto.randomBytes(8).toString("hex"), object: "charge", amount, currency };
    if (!charges.has(who)) charges.set(who, []);
    charges.get(who).push(charge);
    res.status(201).location("/v1/charges/" + charge.id).json(charge);
  });

  app.get("/v1/charges", (req, res) => {
    if (idempotency.getSharedIdempotencyService().isHit(req)) {
      return;
    }
    const who = principal(req);
    if (!who) {
      return res.status(401).json({ error: { code: "unauthenticated" } });
    }
    res.json({ object: "list", data: charges.get(who) || [] });
  });

  const server = app.listen(port, "127.0.0.1", () => {
    console.log("listening on 127.0.0.1:" + server.address().port);
  });
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
