// A charges API in NestJS 10 with @node-idempotency/nestjs 1.0.4, mounted as its
// README says (NodeIdempotencyModule.forRootAsync({ storage }) and @Idempotent() on
// the controller), for the tests of `idem check` against third-party libraries
// (internal/check, thirdparty_test.go). Plain JavaScript: the decorators are applied
// with Reflect.decorate, as TypeScript compiles them.
//
//   node nest.js [--port 0] [--store memory|redis] [--redis URL] [--work MS]
//
// It prints "listening on 127.0.0.1:PORT" once it accepts connections, and "handling
// KEY" when the handler of a charge with that Idempotency-Key starts. The API is
// server.js's: POST /v1/charges (201 with Location, 400 for a body that is not a
// charge, --work milliseconds) and GET /v1/charges, per bearer token.
"use strict";
require("reflect-metadata");
const crypto = require("node:crypto");
const { Module, Controller, Post, Get, HttpCode, Body, Req, Res, Header, HttpException } = require("@nestjs/common");
const { NestFactory } = require("@nestjs/core");
const { NodeIdempotencyModule, Idempotent } = require("@node-idempotency/nestjs");

const { port, store, redis, work } = require("./flags");

const charges = new Map();
const principal = (req) => {
  const auth = req.headers.authorization || "";
  return auth.startsWith("Bearer ") && auth.length > 7 ? auth.slice(7) : null;
};

class ChargesController {
  async create(body, req, res) {
    console.log("handling " + (req.headers["idempotency-key"] || ""));
    const who = principal(req);
    if (!who) throw new HttpException({ error: { code: "unauthenticated" } }, 401);
    const { amount, currency } = body || {};
    if (!Number.isInteger(amount) || amount <= 0 || typeof currency !== "string" || currency.length !== 3) {
      throw new HttpException({ error: { code: "parameter_invalid" } }, 400);
    }
    await new Promise((r) => setTimeout(r, work));
    const charge = { id: "ch_" + crypto.randomBytes(8).toString("hex"), object: "charge", amount, currency };
    if (!charges.has(who)) charges.set(who, []);
    charges.get(who).push(charge);
    res.location("/v1/charges/" + charge.id);
    return charge;
  }
  list(req) {
    return { object: "list", data: charges.get(principal(req)) || [] };
  }
}
// The decorators, as TypeScript would apply them.
const method = (name, decorators) =>
  Reflect.decorate(decorators, ChargesController.prototype, name, Object.getOwnPropertyDescriptor(ChargesController.prototype, name));
Body()(ChargesController.prototype, "create", 0);
Req()(ChargesController.prototype, "create", 1);
Res({ passthrough: true })(ChargesController.prototype, "create", 2);
Req()(ChargesController.prototype, "list", 0);
method("create", [Post(), HttpCode(201)]);
method("list", [Get()]);
Reflect.decorate([Controller("v1/charges"), Idempotent()], ChargesController);

class AppModule {}
const storage = store === "redis"
  ? { adapter: "redis", options: { url: redis } }
  : { adapter: "memory" };
Reflect.decorate([Module({ imports: [NodeIdempotencyModule.forRootAsync({ storage })], controllers: [ChargesController] })], AppModule);

async function main() {
  const app = await NestFactory.create(AppModule, { logger: false });
  await app.listen(port, "127.0.0.1");
  console.log("listening on 127.0.0.1:" + app.getHttpServer().address().port);
}
main().catch((err) => { console.error(err); process.exit(1); });
