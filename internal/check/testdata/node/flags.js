// The command line of server.js and nest.js: [--port 0] [--store memory|redis]
// [--redis URL] [--work MS].
"use strict";
const args = process.argv.slice(2);
function arg(name, def) {
  const i = args.indexOf("--" + name);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : def;
}
module.exports = {
  port: Number(arg("port", "0")),
  store: arg("store", "memory"),
  redis: arg("redis", "redis://127.0.0.1:6379"),
  work: Number(arg("work", "100")),
};
