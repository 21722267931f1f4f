package matrix

import (
	"fmt"
	"strings"
)

// The outcomes of the proxy's cells that HTTP handlers do not have (SPEC §17): what
// crossed the network to the upstream decides them. Each keeps one effect per key.
const (
	// NotStored: one effect; the first answer is the upstream's, passed through as it
	// came (trailers included); every repeat gets 409 response_not_stored (or an
	// in-flight 409), never a replay, never a second execution.
	NotStored Outcome = 100 + iota
	// AnsweredLater: the upstream is slower than --upstream-timeout: the first answer
	// is 504 upstream_timeout with Retry-After, the repeats meanwhile an in-flight 409
	// with Retry-After, and once the upstream answered, its answer replayed; one
	// effect.
	AnsweredLater
	// Unknown: the request was written and its reply lost (a reset, a body broken
	// after the status): the first answer and every repeat are 500 outcome_unknown
	// (or an in-flight 409); one delivery to the upstream, nothing replayed.
	Unknown
	// ReForwarded: the same under --on-lapse take_over: the first answer is 502
	// upstream_reply_lost with Retry-After, and each repeat is forwarded again under
	// the same derived key (one key at the upstream, which an upstream that
	// deduplicates by it makes one effect); no answer is a success or a replay.
	ReForwarded
	// GatewayUnknown: the upstream answered 504 after acting (a gateway in front of it
	// lost the reply): the first answer is that 504, passed on; every repeat is 500
	// outcome_unknown (or an in-flight 409); one delivery.
	GatewayUnknown
	// GatewayReForwarded: the same under --on-lapse take_over: every repeat is
	// forwarded again under the same derived key (and answered the gateway's 504).
	GatewayReForwarded
	// NotForwarded: a gateway answers 502 marked "not forwarded"
	// (--not-forwarded-header) to the first request of each key, which never reached
	// the application: the first answer is that 502, the key is released, and the
	// request executes once afterwards (its retry gets the 201, the concurrent
	// duplicates one 201 and replays or in-flight 409s).
	NotForwarded
)

var proxyMarks = map[Outcome]string{
	NotStored:          "✓ once, not stored (409 response_not_stored)",
	AnsweredLater:      "✓ once: 504, then the stored answer",
	Unknown:            "✓ once: outcome_unknown",
	ReForwarded:        "✓ once per derived key: re-forwarded",
	GatewayUnknown:     "✓ once: the 504, then outcome_unknown",
	GatewayReForwarded: "✓ once per derived key: the 504, re-forwarded",
	NotForwarded:       "✓ once: the gateway's 502, released, then executed",
}

var proxyNames = map[Outcome]string{
	NotStored:          "once, not stored",
	AnsweredLater:      "once, answered later",
	Unknown:            "once, outcome unknown",
	ReForwarded:        "re-forwarded under the same derived key",
	GatewayUnknown:     "once, the gateway's answer, then outcome unknown",
	GatewayReForwarded: "the gateway's answer, re-forwarded under the same derived key",
	NotForwarded:       "the gateway's not-forwarded answer, released, then once",
}

// The proxy's axes (SPEC §17): its store, its policy for a holder whose outcome is
// unknown (--on-lapse) and what the upstream answers.
var (
	ProxyStores  = []Store{SQLite, Postgres, MySQL, "Redis"}
	ProxyOnLapse = []string{"unknown", "take_over"}
	// ProxyOptions: the proxy's defaults, every option of its own set at once
	// (--scope-cookie, --require-key and --route on the cell's path, --access-log,
	// --max-buffered-bodies and its share per client, --min-upload-rate,
	// --upstream-wait-limit, bounds per principal, the metrics' hooks, sealed
	// records: --encryption-key, --fingerprint-except, and --upstream-resends and
	// --not-forwarded-header), or forward authentication (--auth-url); none changes
	// an outcome. An https upstream's cells trust its certificate as --upstream-ca
	// does (Config.UpstreamTLS); mutual TLS (--upstream-cert, --upstream-key) is
	// tested against nginx (e2e/gateway_test.go).
	ProxyOptions = []string{ProxyDefaults, ProxyEveryOption, ProxyForwardAuth}
	ProxyAnswers = []string{ProxyStored, ProxyStream, ProxyH2C, ProxyTooLarge, ProxyTrailers, ProxySlow, ProxyLostReply, ProxyBrokenBody,
		ProxyGetLost, ProxyBodilessLost, ProxyH2Reset, ProxyGateway, ProxyH2Refused, ProxyH2GoAway, ProxyNotForwarded, ProxyH2CUpstream}
)

// The proxy's option sets.
const (
	ProxyDefaults    = "defaults"
	ProxyEveryOption = "every option"
	ProxyForwardAuth = "forward auth"
)

// The upstream's answers of the proxy cells.
const (
	ProxyStored     = "201, chunked"
	ProxyStream     = "an event stream"
	ProxyH2C        = "201 to a request offering h2c"
	ProxyTooLarge   = "a body over --max-stored-body"
	ProxyTrailers   = "a body with a trailer"
	ProxySlow       = "201, slower than --upstream-timeout"
	ProxyLostReply  = "no reply (the connection closed after the request)"
	ProxyBrokenBody = "201, its body broken half way"
	// The transport faults by which Go's HTTP clients re-send by themselves: the reply
	// of a keyed GET, or of a keyed POST without a body, lost on a kept-alive
	// connection; an HTTPS upstream speaking HTTP/2 that resets the stream
	// (RST_STREAM PROTOCOL_ERROR) after acting, every time.
	ProxyGetLost      = "a keyed GET, no reply on a reused connection"
	ProxyBodilessLost = "a keyed POST without a body, no reply on a reused connection"
	ProxyH2Reset      = "HTTP/2, the stream reset (PROTOCOL_ERROR) after acting"
	// ProxyGateway: the upstream acts, and a gateway in front of it answers 504.
	ProxyGateway = "504 from a gateway, after acting"
	// What a gateway in front of the application does that provably never reached
	// it (issue 47): an HTTP/2 stream it refused (REFUSED_STREAM, past
	// http2_max_concurrent_streams) or left out by a GOAWAY (past keepalive_requests,
	// at a reload), each to the first request of every key, re-sent by the proxy
	// (--upstream-resends); and a 502 it marks not forwarded (--not-forwarded-header:
	// it could not connect), to the first request of every key, which releases it.
	ProxyH2Refused    = "HTTP/2, the stream refused (REFUSED_STREAM) before acting"
	ProxyH2GoAway     = "HTTP/2, a GOAWAY that leaves the stream out"
	ProxyNotForwarded = "a gateway's 502 marked not forwarded, then 201"
	// ProxyH2CUpstream: an upstream that speaks HTTP/2 without TLS (h2c, prior
	// knowledge), reached with --upstream-h2c.
	ProxyH2CUpstream = "201 over h2c (--upstream-h2c)"
)

// ExpectProxy is the outcome of a proxy cell: the upstream's answer under the policy
// lapse. The store changes nothing.
func ExpectProxy(answer, lapse string) Outcome {
	switch answer {
	case ProxyTooLarge, ProxyTrailers:
		return NotStored
	case ProxySlow:
		return AnsweredLater
	case ProxyLostReply, ProxyBrokenBody, ProxyGetLost, ProxyBodilessLost, ProxyH2Reset:
		if lapse == "take_over" {
			return ReForwarded
		}
		return Unknown
	case ProxyGateway:
		if lapse == "take_over" {
			return GatewayReForwarded
		}
		return GatewayUnknown
	case ProxyNotForwarded:
		return NotForwarded
	}
	return ExactlyOnce
}

// writeProxyDocument writes the proxy's section of docs/combinations.md.
func writeProxyDocument(b *strings.Builder) {
	b.WriteString("\n## idem proxy\n\n| upstream answers | store | options | --on-lapse unknown | --on-lapse take_over |\n|---|---|---|---|---|\n")
	for _, a := range ProxyAnswers {
		for _, s := range ProxyStores {
			for _, o := range ProxyOptions {
				fmt.Fprintf(b, "| %s | %s | %s |", a, s, o)
				for _, lapse := range ProxyOnLapse {
					fmt.Fprintf(b, " %s |", ExpectProxy(a, lapse).Mark())
				}
				b.WriteString("\n")
			}
		}
	}
	b.WriteString(`
Each proxy cell sends the same requests (a retry and 16 concurrent duplicates) through
an ` + "`idem proxy`" + ` in process, with its defaults, with every option of its own set
(the principal from a cookie beside an analytics cookie that changes on every request,
` + "`--require-key`" + ` and ` + "`--route`" + ` on the cell's path, ` + "`--access-log`" + ` (a line per request, no key
in it), ` + "`--max-buffered-bodies`" + ` and its share per client, ` + "`--min-upload-rate`" + `,
` + "`--upstream-wait-limit`" + `, the bounds per principal, the metrics' hooks, and sealed records:
` + "`--encryption-key`" + ` with ` + "`--fingerprint-except`" + `, SPEC §19), or with forward
authentication (` + "`--auth-url`" + `: an auth endpoint names the principal; a revoked token's
retry then gets the endpoint's 401, never a replay), in front of a Go upstream that counts
what it receives by the derived key, and holds it to its outcome. The cell's first
request, a keyless GET, opens a kept-alive connection to the upstream, on which Go's
transport would re-send by itself a request it takes for replayable when the connection
breaks after the request was written; no cell may see the proxy's guard stop such a
re-send (it logs an error). Not knowing is not failure: a key is released only when the
request provably never reached the upstream, so every row keeps one effect per key:

- **✓ once, not stored**: the response passes through as it came (trailers included);
  the repeats get 409 ` + "`response_not_stored`" + `, never a second execution.
- **✓ once: 504, then the stored answer**: the client gets 504 ` + "`upstream_timeout`" + ` with
  ` + "`Retry-After`" + `; the proxy waits on and stores the upstream's answer, which the retry
  gets, replayed.
- **✓ once: outcome_unknown**: the request reached the upstream and its reply was lost
  (a reset, an EOF, a body broken, an HTTP/2 stream reset); every answer is 500
  ` + "`outcome_unknown`" + ` until an operator resolves the key.
- **✓ once per derived key: re-forwarded** (` + "`--on-lapse take_over`" + `): the client gets 502
  ` + "`upstream_reply_lost`" + `; its retry is forwarded again under the same derived key, for the
  upstream to deduplicate.
- **✓ once: the 504, then outcome_unknown**: a gateway's 504 after the upstream acted is
  passed on, and the record kept as for a lost reply (under ` + "`take_over`" + `, **the 504,
  re-forwarded**).
- **✓ once: the gateway's 502, released, then executed**: a 502 that the gateway marks
  as never forwarded (` + "`--not-forwarded-header`" + `) is passed on and releases the key; the
  retry executes once.

An HTTP/2 stream the upstream refused (` + "`REFUSED_STREAM`" + `) or left out with a GOAWAY never
reached the application: the proxy sends it again (` + "`--upstream-resends`" + `), under the
same derived key, and the row is **✓ once** like any answered request.

An event stream is stored when it ends within --max-stored-body and replayed; an h2c
upgrade offer is ignored and the request protected. What a proxy killed mid-forward
leaves under each --on-lapse is tested by killing real proxies (e2e/proxy_test.go,
e2e/proxy_unknown_test.go; docs/proxy.md).
`)
}
