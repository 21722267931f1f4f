// Package proxy is `idem proxy` (SPEC §17): a reverse proxy that gives an upstream HTTP
// API, written in any language, the idempotency keys of SPEC §2–§9. It works at the
// level of HTTP exchanges: net/http/httputil.ReverseProxy forwards them, and idem's
// middleware ([idem.Middleware.Route]) sits in front of it, so the proxy is one more
// user of the core: the claim, the lease and its heartbeat, fencing, the fingerprint,
// the store policy of §6, the replay and the §9 errors are the middleware's, unchanged.
// What this package adds is the HTTP plumbing around them:
//
//   - which requests are protected: by default POST and PATCH that carry a key
//     (Config.Methods); a key is mandatory on the routes of Config.RequireKey
//     (ServeMux patterns such as "POST /v1/charges"); every other request, and every
//     protocol upgrade (WebSocket), is forwarded untouched, claiming nothing;
//   - the scope: the hex SHA-256 of a request header (Config.ScopeHeader,
//     Authorization by default), so that no token is stored or logged;
//   - the derived key: a protected request reaches the upstream with
//     Idempotency-Key (Config.UpstreamKeyHeader) = hex SHA-256(record id ‖ "upstream"),
//     the foreign key of SPEC §13, the same for every holder of the record, so that an
//     upstream that deduplicates by key makes a takeover after a crash safe;
//   - responses that cannot be stored whole (an event stream, a body over
//     Config.MaxStoredBody, trailers) pass through as they come and release the key
//     (logged at warn level): they are never half stored;
//   - the upstream's failures: 502 upstream_unavailable and 504 upstream_timeout, which
//     release the key like every 5xx.
//
// docs/proxy.md shows the sidecar setup and the table of what each upstream answer, and
// a proxy that dies mid-forward, leads to.
package proxy
