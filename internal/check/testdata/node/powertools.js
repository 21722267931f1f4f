// A charges API as an AWS Lambda function behind API Gateway, made idempotent with
// Powertools for AWS Lambda (TypeScript)'s idempotency utility on Redis, for the
// tests of `idem check` against third-party libraries (internal/check,
// thirdparty_test.go). Its packages are pinned in package.json and
// package-lock.json and installed by .ci/run with npm ci.
//
//   node powertools.js [--port 0] [--redis URL] [--config header|scoped|validated]
//                      [--function NAME] [--work MS] [--lambda-timeout MS]
//
// It prints "listening on 127.0.0.1:PORT" once it accepts connections, and "handling
// KEY" when the handler of a charge with that Idempotency-Key starts.
//
// The HTTP server stands in for API Gateway's HTTP API and the Lambda runtime, as
// `sam local` does: each request becomes a payload 2.0 event (headers lowercased, the
// body a string) and a context whose getRemainingTimeInMillis counts down from
// --lambda-timeout (3 s, Lambda's default); the handler's { statusCode, headers, body }
// becomes the response, and an error thrown out of the function the 500
// {"message":"Internal Server Error"} that API Gateway sends. Routes: POST
// /v1/charges (the idempotent function) and GET /v1/charges (another function,
// without the utility); anything else is API Gateway's 404 {"message":"Not Found"}.
//
// The function is wrapped with makeIdempotent on a CachePersistenceLayer over
// @redis/client, as the utility's documentation shows, with the key taken from the
// Idempotency-Key header (the README's eventKeyJmesPath, 'headers.idempotency-key',
// is not valid JMESPath for a name with a hyphen; quoted, it is):
//   --config header     eventKeyJmesPath 'headers."idempotency-key"'
//   --config scoped     eventKeyJmesPath '[headers.authorization, headers."idempotency-key"]',
//                       the key scoped per principal
//   --config validated  scoped, and payloadValidationJmesPath 'body'
// and, as a careful team would write, the utility's errors answered as HTTP:
// IdempotencyAlreadyInProgressError 409, IdempotencyValidationError 422,
// IdempotencyKeyError 400. --function names the function: the records' key prefix,
// which two processes of one deployment share.
"use strict";
const crypto = require("node:crypto");
const http = require("node:http");
const { createClient } = require("@redis/client");

const args = process.argv.slice(2);
function arg(name, def) {
  const i = args.indexOf("--" + name);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : def;
}
const port = Number(arg("port", "0"));
const redisURL = arg("redis", "redis://127.0.0.1:6379");
const config = arg("config", "header");
const work = Number(arg("work", "100"));
const lambdaTimeout = Number(arg("lambda-timeout", "3000"));
process.env.AWS_LAMBDA_FUNCTION_NAME = arg("function", "charges");

const {
  makeIdempotent,
  IdempotencyConfig,
  IdempotencyAlreadyInProgressError,
  IdempotencyValidationError,
  IdempotencyKeyError,
} = require("@aws-lambda-powertools/idempotency");
const { CachePersistenceLayer } = require("@aws-lambda-powertools/idempotency/cache");

const configs = {
  header: { eventKeyJmesPath: 'headers."idempotency-key"' },
  scoped: { eventKeyJmesPath: '[headers.authorization, headers."idempotency-key"]' },
  validated: { eventKeyJmesPath: '[headers.authorization, headers."idempotency-key"]', payloadValidationJmesPath: "body" },
};
if (!configs[config]) {
  console.error("--config: want header, scoped or validated");
  process.exit(2);
}

const json = (statusCode, obj, headers = {}) => ({
  statusCode,
  headers: { "content-type": "application/json", ...headers },
  body: JSON.stringify(obj),
});
const principal = (event) => {
  const auth = event.headers.authorization || "";
  return auth.startsWith("Bearer ") && auth.length > 7 ? auth.slice(7) : null;
};

// The charges function's state: a real function would keep it in a database.
const charges = new Map();

async function createCharge(event) {
  console.log("handling " + (event.headers["idempotency-key"] || ""));
  const who = principal(event);
  if (!who) return json(401, { message: "Unauthorized" });
  let p;
  try {
    p = JSON.parse(event.body || "");
  } catch {
    p = null;
  }
  const { amount, currency } = p || {};
  if (!Number.isInteger(amount) || amount <= 0 || typeof currency !== "string" || currency.length !== 3) {
    return json(400, { error: { code: "parameter_invalid", message: "amount and currency" } });
  }
  await new Promise((r) => setTimeout(r, work));
  const charge = { id: "ch_" + crypto.randomBytes(8).toString("hex"), object: "charge", amount, currency };
  if (!charges.has(who)) charges.set(who, []);
  charges.get(who).push(charge);
  return json(201, charge, { location: "/v1/charges/" + charge.id });
}

function listCharges(event) {
  const who = principal(event);
  if (!who) return json(401, { message: "Unauthorized" });
  return json(200, { object: "list", data: charges.get(who) || [] });
}

async function main() {
  const client = await createClient({ url: redisURL }).connect();
  const persistenceStore = new CachePersistenceLayer({ client });
  const idempotent = makeIdempotent(createCharge, {
    persistenceStore,
    config: new IdempotencyConfig(configs[config]),
  });
  // The function's handler, as deployed: the utility's errors answered as HTTP.
  const handler = async (event, context) => {
    try {
      return await idempotent(event, context);
    } catch (err) {
      if (err instanceof IdempotencyAlreadyInProgressError) return json(409, { message: err.message });
      if (err instanceof IdempotencyValidationError) return json(422, { message: err.message });
      if (err instanceof IdempotencyKeyError) return json(400, { message: err.message });
      throw err;
    }
  };

  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", async () => {
      const url = new URL(req.url, "http://localhost");
      const headers = {};
      for (let i = 0; i < req.rawHeaders.length; i += 2) {
        const name = req.rawHeaders[i].toLowerCase();
        // Payload 2.0 joins repeated headers with commas.
        headers[name] = name in headers ? headers[name] + "," + req.rawHeaders[i + 1] : req.rawHeaders[i + 1];
      }
      const event = {
        version: "2.0",
        routeKey: req.method + " " + url.pathname,
        rawPath: url.pathname,
        rawQueryString: url.search.slice(1),
        headers,
        requestContext: { http: { method: req.method, path: url.pathname }, requestId: crypto.randomUUID() },
        body: Buffer.concat(chunks).toString("utf8"),
        isBase64Encoded: false,
      };
      const deadline = Date.now() + lambdaTimeout;
      const context = {
        functionName: process.env.AWS_LAMBDA_FUNCTION_NAME,
        awsRequestId: event.requestContext.requestId,
        getRemainingTimeInMillis: () => Math.max(0, deadline - Date.now()),
      };
      let result;
      try {
        if (url.pathname !== "/v1/charges" || (req.method !== "POST" && req.method !== "GET")) {
          result = json(404, { message: "Not Found" });
        } else if (req.method === "POST") {
          result = await handler(event, context);
        } else {
          result = listCharges(event);
        }
      } catch (err) {
        console.error(err);
        result = json(500, { message: "Internal Server Error" });
      }
      res.writeHead(result.statusCode, result.headers || {});
      res.end(result.body || "");
    });
  });
  server.listen(port, "127.0.0.1", () => {
    console.log("listening on 127.0.0.1:" + server.address().port);
  });
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
