package storetest

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/idem-go/idem/idemstore"
)

func init() {
	register(
		testCase{"SameKeyInTwoScopesIsTwoIndependentRecords", testSameKeyInTwoScopes},
		testCase{"ScopeAndKeyAreNotConcatenated", testScopeAndKeyNotConcatenated},
		testCase{"ScopesWithArbitraryBytesRoundTrip", testArbitraryScopes},
		testCase{"Key255CharsWithEveryAllowedCharacterRoundTrips", testLongKeyAllCharacters},
		testCase{"OneMiBResponseRoundTripsByteForByte", testOneMiBResponse},
		testCase{"NotStoredResponseRoundTripsAsNotStored", testNotStoredResponse},
		testCase{"HeadersWithMultipleValuesAndOddBytesRoundTrip", testOddHeaders},
		testCase{"StoredResponseSharesNoMemoryWithCallers", testStoredResponseIsCopied},
	)
}

// MaxResponseBytes is the middleware's default limit on a stored body (SPEC §6): every
// store must keep a body of this size.
const MaxResponseBytes = 1 << 20

func testSameKeyInTwoScopes(t *testing.T, h Harness) {
	b := setup(t, h)
	a, c := *b, *b
	c.scope = b.scope + "-other"

	pa := a.acquire(b.t0)
	pc := c.acquire(b.t0) // same key, other scope: its own record
	if pa.RecordID == pc.RecordID {
		t.Fatal("test bug: same record id")
	}
	a.complete(pa.Token, sampleResponse(), b.at(ms(1)))

	// No replay across scopes: the other scope's record is still in flight.
	res := c.claimWant(c.claimParams(b.at(ms(2))), idemstore.ClaimInFlight)
	c.wantRecord("other scope's record", res.Record, inFlightRecord(pc))
	// Nor can a token reach across scopes.
	if err := a.s.RecordRelease(b.ctx, a.releaseParams(pc.Token)); !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Errorf("release in scope A with scope B's token = %v, want ErrLeaseLost", err)
	}
	// Releasing one leaves the other.
	if err := c.s.RecordRelease(b.ctx, c.releaseParams(pc.Token)); err != nil {
		t.Fatalf("release in the other scope: %v", err)
	}
	c.wantAbsent("released record", b.at(ms(3)))
	a.wantRecord("first scope's record after the other's release", a.mustGet(b.at(ms(3))),
		completedRecord(inFlightRecord(pa), sampleResponse(), ttl))
	// A request with another fingerprint in a third scope is no mismatch there.
	d := *b
	d.scope, d.fp = b.scope+"-third", newFingerprint()
	d.wantFreshClaim("claim in a third scope with another fingerprint", b.at(ms(4)))
}

// testScopeAndKeyNotConcatenated catches stores that build one storage key from scope
// and key with a separator that may occur in either (keys may contain any visible
// ASCII but `"`, `,` and `\`).
func testScopeAndKeyNotConcatenated(t *testing.T, h Harness) {
	b := setup(t, h)
	for _, sep := range []string{":", "/", "|", "-", "_", ".", "{", "}", " ", "\x00"} {
		suffix := rand.Text()
		one, two := *b, *b
		one.scope, one.key = b.scope+sep+"x", "k"+suffix
		two.scope, two.key = b.scope, "x"+sep+"k"+suffix
		if sep == " " || sep == "\x00" { // not key characters; vary the scope only
			one.scope, two.scope = b.scope+sep, b.scope
			one.key, two.key = "k"+suffix, "k"+suffix
		}
		p1 := one.acquire(b.t0)
		p2 := two.acquire(b.t0)
		one.complete(p1.Token, sampleResponse(), b.at(ms(1)))
		two.claimWant(two.claimParams(b.at(ms(2))), idemstore.ClaimInFlight)
		one.wantRecord("separator "+hex.EncodeToString([]byte(sep)), one.mustGet(b.at(ms(2))),
			completedRecord(inFlightRecord(p1), sampleResponse(), ttl))
		two.wantRecord("separator "+hex.EncodeToString([]byte(sep)), two.mustGet(b.at(ms(2))), inFlightRecord(p2))
	}
}

// oddScopes are scopes a Scope function may return: the payments API's hex SHA-256 and
// arbitrary principals.
func oddScopes() map[string]string {
	sum := sha256.Sum256([]byte("Bearer sk_test_123"))
	return map[string]string{
		"hex sha256":     hex.EncodeToString(sum[:]),
		"unicode":        "tenant/Zoë/用户/😀",
		"spaces":         " leading and trailing ",
		"quotes":         `"'` + "`;--",
		"percent":        "%00%ff%",
		"control bytes":  "a\tb\nc\rd\x7f",
		"invalid utf-8":  "\xff\xfe\xc3\x28",
		"nul byte":       "before\x00after",
		"single byte":    "x",
		"512 bytes":      strings.Repeat("s", 512),
		"case A":         "Tenant",
		"case a":         "tenant",
		"trailing space": "tenant ",
	}
}

func testArbitraryScopes(t *testing.T, h Harness) {
	b := setup(t, h)
	claims := map[string]*idemstore.ClaimParams{}
	for name, scope := range oddScopes() {
		s := *b
		s.scope = scope
		claims[name] = s.acquire(b.t0)
	}
	// Every scope kept its own record (no two scopes collapsed into one), and reads back
	// with its exact bytes.
	for name, scope := range oddScopes() {
		s := *b
		s.scope = scope
		s.wantRecord("scope "+name, s.mustGet(b.at(ms(1))), inFlightRecord(claims[name]))
		s.complete(claims[name].Token, sampleResponse(), b.at(ms(2)))
		res := s.claimWant(s.claimParams(b.at(ms(3))), idemstore.ClaimCompleted)
		if res.Record.Scope != scope {
			t.Errorf("scope %s: replayed record Scope = %q, want %q", name, res.Record.Scope, scope)
		}
	}
}

// allowedKeyChars is every character a key may hold (SPEC §3): visible ASCII without
// `"`, `,` and `\`.
func allowedKeyChars() string {
	var sb strings.Builder
	for c := byte(0x21); c <= 0x7e; c++ {
		if c != '"' && c != ',' && c != '\\' {
			sb.WriteByte(c)
		}
	}
	return sb.String()
}

func testLongKeyAllCharacters(t *testing.T, h Harness) {
	b := setup(t, h)
	chars := allowedKeyChars()
	for i, key := range []string{
		(chars + chars + chars)[:255],
		(chars + chars + chars)[len(chars)*3-255:],
		strings.Repeat("%", 255),
		strings.Repeat("*", 254) + "?",
	} {
		if len(key) != 255 {
			t.Fatalf("test bug: key %d has %d chars", i, len(key))
		}
		k := *b
		k.key = key
		p := k.acquire(b.t0)
		k.complete(p.Token, sampleResponse(), b.at(ms(1)))
		res := k.claimWant(k.claimParams(b.at(ms(2))), idemstore.ClaimCompleted)
		k.wantRecord("255-char key", res.Record, completedRecord(inFlightRecord(p), sampleResponse(), ttl))
	}
	// Keys that differ only in their last character, or in case, are different keys.
	k1, k2 := *b, *b
	k1.key, k2.key = strings.Repeat("a", 254)+"A", strings.Repeat("a", 254)+"a"
	k1.acquire(b.t0)
	k2.acquire(b.t0)
}

// roundTrip claims the bundle's key, completes it with resp and requires that both a
// replay and a read return resp byte for byte.
func (b *bundle) roundTrip(what string, resp *idemstore.Response) {
	b.t.Helper()
	p := b.acquire(b.t0)
	b.complete(p.Token, cloneResponse(resp), b.at(ms(1)))
	want := completedRecord(inFlightRecord(p), resp, ttl)
	res := b.claimWant(b.claimParams(b.at(ms(2))), idemstore.ClaimCompleted)
	b.wantRecord(what+": replayed record", res.Record, want)
	b.wantRecord(what+": record read back", b.mustGet(b.at(ms(2))), want)
}

func testOneMiBResponse(t *testing.T, h Harness) {
	b := setup(t, h)
	body := make([]byte, MaxResponseBytes)
	_, _ = rand.Read(body)
	b.roundTrip("1 MiB random body", &idemstore.Response{
		Status: 200,
		Header: http.Header{"Content-Type": {"application/octet-stream"}},
		Body:   body,
	})
}

func testNotStoredResponse(t *testing.T, h Harness) {
	b := setup(t, h)
	// What the middleware stores for a flushed or over-limit response: no body.
	b.roundTrip("not stored", &idemstore.Response{Status: 201, NotStored: true})
	b.key = "key-" + rand.Text()
	b.roundTrip("not stored with headers", &idemstore.Response{
		Status:    200,
		NotStored: true,
		Header:    http.Header{"Content-Type": {"text/event-stream"}},
	})
}

func testOddHeaders(t *testing.T, h Harness) {
	b := setup(t, h)
	b.roundTrip("odd headers", &idemstore.Response{
		Status: 303,
		Header: http.Header{
			"Link":                {`</v1/charges?page=2>; rel="next"`, `</v1/charges?page=9>; rel="last"`, `<a>; rel="first"`},
			"Vary":                {"Accept", "Accept-Encoding", "Authorization"},
			"Cache-Control":       {"no-store, private"},
			"Content-Disposition": {`attachment; filename="r\u00e9sum\u00e9 \"v2\".pdf"; filename*=UTF-8''r%C3%A9sum%C3%A9.pdf`},
			"Content-Language":    {"de-DE, en-CA"},
			"Location":            {"/v1/charges/ch_1?a=1&b=%20#frag"},
			"Etag":                {`W/"0815"`},
			"X-Empty":             {""},
			"X-Repeated-Empty":    {"", "", ""},
			"X-Unicode":           {"Zoë 用户 😀"},
			"X-Obs-Text":          {"\x80\xa0\xfe\xff"},
			"X-Tab":               {"a\tb"},
			"X-Json":              {`{"k":[1,2,{"n":null}]}`},
			"X-Long":              {strings.Repeat("v", 8192)},
		},
		Body: []byte("see other"),
	})
}

// testStoredResponseIsCopied checks that a store keeps its own copy of what it is given
// and hands out copies: writes by the caller into the response it completed with, or
// into a record it read, never reach the stored record. (Stores that serialise cannot
// fail it; an in-process store can.)
func testStoredResponseIsCopied(t *testing.T, h Harness) {
	b := setup(t, h)
	p := b.acquire(b.t0)
	resp := sampleResponse()
	b.complete(p.Token, resp, b.at(ms(1)))
	resp.Body[0] = 'X'
	resp.Header["Content-Type"][0] = "x/y"
	resp.Header.Set("X-Added", "after")

	want := completedRecord(inFlightRecord(p), sampleResponse(), ttl)
	b.wantRecord("record after the caller changed its response", b.mustGet(b.at(ms(2))), want)

	for _, rec := range []*idemstore.Record{b.mustGet(b.at(ms(2))), b.claimWant(b.claimParams(b.at(ms(2))), idemstore.ClaimCompleted).Record} {
		rec.Response.Body[0] = 'Y'
		rec.Response.Header["Location"][0] = "/elsewhere"
		rec.Response.Header.Set("X-Added", "after")
	}
	b.wantRecord("record after the caller changed records it read", b.mustGet(b.at(ms(3))), want)
}
