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
//     (ServeMux patterns such as "POST /v1/charges", matched on the path's common
//     variants too); every other request, and a WebSocket upgrade, is forwarded
//     untouched, claiming nothing (an h2c upgrade offer is ignored);
//   - the scope: the hex SHA-256 of a request header (Config.ScopeHeader,
//     Authorization by default) or of one cookie (Config.ScopeCookie), so that no
//     token is stored or logged;
//   - the derived key: a protected request reaches the upstream with
//     Idempotency-Key (Config.UpstreamKeyHeader) = the record's derived key for the step
//     "upstream" (SPEC §13), the same for every forward of the request, so that
//     an upstream that deduplicates by key makes every repeat the proxy cannot rule
//     out safe;
//   - what crossed the network (exchange.go): a key is released only when the request
//     provably never reached the upstream (502), or a trusted gateway says its 5xx
//     never did (Config.NotForwardedHeader); what the upstream provably did not
//     process (an HTTP/2 stream refused, or left out by a GOAWAY) is sent again, bounded
//     (send.go, Config.UpstreamResends); a slow upstream's client gets 504
//     while the proxy waits on and stores the answer (Middleware.AnswerNow); a reply lost
//     after the request was written keeps the record (Handle.SetOutcomeUnknown);
//     responses that cannot be stored whole pass through and are never run again
//     (response_not_stored), event streams are stored when they end within the limit
//     (Middleware.TeeStream);
//   - bounds in total: the request bodies held at once (budget.go).
//
// docs/proxy.md shows the sidecar setup and the table of what each upstream answer, and
// a proxy that dies mid-forward, leads to.
package proxy
