package idem

import (
	"encoding/hex"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/idem-go/idem/idemstore"
	"pgregory.net/rapid"
)

const chargeBody = `{"amount": 2000, "currency": "usd", "customer_id": "cust_abc123"}`

// newRequest builds the request the middleware would fingerprint. target is a path
// with an optional query, as sent on the request line.
func newRequest(t tb, method, target, contentType string) *http.Request {
	t.Helper()
	u, err := url.ParseRequestURI(target)
	if err != nil {
		t.Fatalf("bad target %q: %v", target, err)
	}
	r := &http.Request{Method: method, URL: u, Header: http.Header{}}
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	return r
}

// fp fingerprints a request given by its parts.
func fp(t tb, method, target, contentType, body string) Fingerprint {
	t.Helper()
	return FingerprintRequest(newRequest(t, method, target, contentType), []byte(body))
}

// tb is what the helpers need of *testing.T and *rapid.T alike.
type tb interface {
	Helper()
	Fatalf(format string, args ...any)
}

type req struct{ method, target, contentType, body string }

func (q req) fp(t tb) Fingerprint { return fp(t, q.method, q.target, q.contentType, q.body) }

func jsonPost(body string) req { return req{"POST", "/v1/charges", "application/json", body} }

func TestFingerprintCarriesTheCurrentVersion(t *testing.T) {
	t.Parallel()
	if got := jsonPost(chargeBody).fp(t).Version; got != idemstore.FingerprintVersion {
		t.Fatalf("Version = %d, want %d", got, idemstore.FingerprintVersion)
	}
}

// A change of these sums means the canonicalisation changed: bump FingerprintVersion, so
// that retries of records stored under the old version are not refused as key_reused.
// The sums were computed independently (in Python) from the documented framing: each
// field is a tag byte, the uvarint length and the bytes — V "1", M method, P path,
// Q the query's parameters (each n name, v value), then J canonical JSON, F form
// parameters or R raw bytes.
func TestFingerprintVersion1IsStable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		req  req
		want string
	}{
		{jsonPost(chargeBody), "e9a7a0e87278abcc16f095bc5b3953610fe5c962c0fb27abfd8d2e2941d00875"},
		{req{"POST", "/v1/charges?b=2&a=1", "application/x-www-form-urlencoded", "amount=2000&currency=usd"}, "e091708441650aae45ac8f7736bfce486a572d07471ee4ada36533b1e515dc53"},
		{req{"PUT", "/v1/orders/ord_1", "text/plain", "raw body"}, "bd32cf8aef9503f0e36c8ad4943e62e7a4525d4d2bae962adf1c8df0c892fa96"},
	} {
		if got := hex.EncodeToString(func() []byte { s := tc.req.fp(t).Sum; return s[:] }()); got != tc.want {
			t.Errorf("fingerprint of %+v = %s, want %s", tc.req, got, tc.want)
		}
	}
}

func TestFingerprintMatchesRetriesThatReserialiseTheSameRequest(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		a, b req
	}{
		{"JSON members reordered", jsonPost(chargeBody), jsonPost(`{"customer_id":"cust_abc123","currency":"usd","amount":2000}`)},
		{"JSON whitespace", jsonPost(chargeBody), jsonPost("{\n\t\"amount\":2000,\r\n\"currency\" :\"usd\",\"customer_id\": \"cust_abc123\"\n}\n")},
		{"JSON nested objects reordered", jsonPost(`{"a":{"y":1,"x":[{"q":1,"p":2}]}}`), jsonPost(`{"a":{"x":[{"p":2,"q":1}],"y":1}}`)},
		{"JSON with charset", jsonPost(chargeBody), req{"POST", "/v1/charges", "application/json; charset=utf-8", `{"currency":"usd","amount":2000,"customer_id":"cust_abc123"}`}},
		{"JSON media type in capitals", jsonPost(chargeBody), req{"POST", "/v1/charges", " Application/JSON ", `{"currency":"usd","amount":2000,"customer_id":"cust_abc123"}`}},
		{"+json suffix", req{"PATCH", "/v1/orders/ord_1", "application/merge-patch+json", `{"b":1,"a":2}`}, req{"PATCH", "/v1/orders/ord_1", "application/merge-patch+json", `{"a":2, "b":1}`}},
		{"JSON with malformed parameters", jsonPost(`{"b":1,"a":2}`), req{"POST", "/v1/charges", "application/json; charset", `{"a":2,"b":1}`}},
		{"form parameters reordered", formPost("amount=2000&currency=usd"), formPost("currency=usd&amount=2000")},
		{"form repeated names keep their order", formPost("tag=x&amount=1&tag=y"), formPost("amount=1&tag=x&tag=y")},
		{"form encodings of one value", formPost("name=a+b&x=%41"), formPost("x=A&name=a%20b")},
		{"form empty parameters", formPost("a=1&&b=2&"), formPost("b=2&a=1")},
		{"form name without =", formPost("flag&a=1"), formPost("a=1&flag=")},
		{"query reordered", req{"GET", "/v1/charges?limit=3&starting_after=ch_1", "", ""}, req{"GET", "/v1/charges?starting_after=ch_1&limit=3", "", ""}},
		{"query encodings of one value", req{"POST", "/x?a=%7E&b=c+d", "", ""}, req{"POST", "/x?b=c%20d&a=~", "", ""}},
		{"empty query", req{"POST", "/x?", "", ""}, req{"POST", "/x", "", ""}},
		{"headers other than Content-Type", jsonPost(chargeBody), jsonPost(chargeBody)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if a, b := tc.a.fp(t), tc.b.fp(t); a != b {
				t.Fatalf("fingerprints differ:\n%+v\n%+v", tc.a, tc.b)
			}
		})
	}
}

func formPost(body string) req {
	return req{"POST", "/v1/charges", "application/x-www-form-urlencoded", body}
}

func TestFingerprintDistinguishesDifferentRequests(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		a, b req
	}{
		{"method", jsonPost(chargeBody), req{"PUT", "/v1/charges", "application/json", chargeBody}},
		{"method case", req{"post", "/x", "", ""}, req{"POST", "/x", "", ""}},
		{"path", jsonPost(chargeBody), req{"POST", "/v1/charge", "application/json", chargeBody}},
		{"escaped slash in path", req{"POST", "/files/a%2Fb", "", ""}, req{"POST", "/files/a/b", "", ""}},
		{"trailing slash", req{"POST", "/x/", "", ""}, req{"POST", "/x", "", ""}},
		{"query value", req{"POST", "/x?a=1", "", ""}, req{"POST", "/x?a=2", "", ""}},
		{"repeated query names reordered", req{"POST", "/x?a=1&a=2", "", ""}, req{"POST", "/x?a=2&a=1", "", ""}},
		{"query moved into the path", req{"POST", "/x?a", "", ""}, req{"POST", "/xa", "", ""}},
		{"query and body swapped", req{"POST", "/x?a=1", "application/x-www-form-urlencoded", ""}, req{"POST", "/x", "application/x-www-form-urlencoded", "a=1"}},
		{"big integers", jsonPost(`{"amount":9007199254740993}`), jsonPost(`{"amount":9007199254740992}`)},
		{"integer and float", jsonPost(`{"amount":1}`), jsonPost(`{"amount":1.0}`)},
		{"exponent form", jsonPost(`{"amount":100}`), jsonPost(`{"amount":1e2}`)},
		{"trailing zero", jsonPost(`{"amount":1.5}`), jsonPost(`{"amount":1.50}`)},
		{"string escape", jsonPost(`{"name":"é"}`), jsonPost(`{"name":"\u00e9"}`)},
		{"string value", jsonPost(`{"currency":"usd"}`), jsonPost(`{"currency":"usD"}`)},
		{"array order", jsonPost(`[1,2]`), jsonPost(`[2,1]`)},
		{"JSON member moved into an object", jsonPost(`{"a":{},"b":1}`), jsonPost(`{"a":{"b":1}}`)},
		{"form value", formPost("amount=2000"), formPost("amount=2001")},
		{"form repeated names reordered", formPost("tag=x&tag=y"), formPost("tag=y&tag=x")},
		{"form name and value boundary", formPost("ab=c"), formPost("a=bc")},
		{"form parameter split", formPost("a=b&c=d"), formPost("a=b%26c%3Dd")},
		{"raw body", req{"POST", "/x", "text/plain", "a"}, req{"POST", "/x", "text/plain", "b"}},
		{"raw whitespace counts", req{"POST", "/x", "text/plain", `{"a":1}`}, req{"POST", "/x", "text/plain", `{"a": 1}`}},
		{"canonical JSON and the same bytes raw", jsonPost(`{"a":1}`), req{"POST", "/v1/charges", "text/plain", `{"a":1}`}},
		{"canonical form and the same bytes raw", formPost("a=1"), req{"POST", "/v1/charges", "text/plain", "a=1"}},
		{"invalid JSON reformatted", jsonPost(`{"a":1,"a":2}`), jsonPost(`{"a":1, "a":2}`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if a, b := tc.a.fp(t), tc.b.fp(t); a == b {
				t.Fatalf("same fingerprint for:\n%+v\n%+v", tc.a, tc.b)
			}
		})
	}
}

func TestFingerprintKeepsTheOrderOfManyRepeatedNames(t *testing.T) {
	t.Parallel()
	var interleaved, grouped, reversed []string
	for i := range 20 {
		interleaved = append(interleaved, fmt.Sprintf("tag=%d", i), fmt.Sprintf("id=%d", i))
	}
	for i := range 20 {
		grouped = append(grouped, fmt.Sprintf("id=%d", i))
	}
	for i := range 20 {
		grouped = append(grouped, fmt.Sprintf("tag=%d", i))
		reversed = append(reversed, fmt.Sprintf("tag=%d", 19-i))
	}
	reversed = append(reversed, grouped[:20]...)
	a, b, c := formPost(strings.Join(interleaved, "&")), formPost(strings.Join(grouped, "&")), formPost(strings.Join(reversed, "&"))
	if a.fp(t) != b.fp(t) {
		t.Fatalf("regrouping repeated names changed the fingerprint")
	}
	if a.fp(t) == c.fp(t) {
		t.Fatalf("reversing the values of a repeated name kept the fingerprint")
	}
}

func TestFingerprintHashesUncanonicalisableBodiesRaw(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ contentType, body string }{
		{"application/json", `{"a":1,"a":2}`},
		{"application/json", `{"a":"\ud800"}`},
		{"application/json", "{\"a\":\"\xff\"}"},
		{"application/json", `{"a":1} trailing`},
		{"application/json", `{"a":`},
		{"application/json", ``},
		{"application/problem+json", `not json`},
		{"application/x-www-form-urlencoded", "a=%zz&b=1"},
		{"application/x-www-form-urlencoded", "a=1;b=2"},
		{"application/x-www-form-urlencoded", "a=%4"},
		{"application/json garbage", `{"b":1,"a":2}`},
		{"application/json/x", `{"b":1,"a":2}`},
		{"application/", `{"b":1,"a":2}`},
		{"text/json", `{"b":1,"a":2}`},
		{"application/jsonx", `{"b":1,"a":2}`},
		{"+json", `{"b":1,"a":2}`},
		{"", `{"b":1,"a":2}`},
		{"multipart/form-data; boundary=x", "a=1&b=2"},
	} {
		got := fp(t, "POST", "/x", tc.contentType, tc.body)
		if raw := fp(t, "POST", "/x", "application/octet-stream", tc.body); got != raw {
			t.Errorf("Content-Type %q, body %q: not hashed as raw bytes", tc.contentType, tc.body)
		}
	}
}

func TestFingerprintHashesAnUnparsableQueryAsSent(t *testing.T) {
	t.Parallel()
	for _, pair := range [][2]string{
		{"/x?a=%zz&b=1", "/x?b=1&a=%zz"},
		{"/x?a=1;b=2", "/x?b=2;a=1"},
		{"/x?b=1&a=1" + strings.Repeat("&c=1", maxFormParams-1), "/x?a=1&b=1" + strings.Repeat("&c=1", maxFormParams-1)},
	} {
		if fp(t, "POST", pair[0], "", "") == fp(t, "POST", pair[1], "", "") {
			t.Errorf("%q and %q share a fingerprint: an unparsable query must be taken as sent", pair[0], pair[1])
		}
	}
}

func TestFingerprintSortsTheMostParametersURLParseQueryTakes(t *testing.T) {
	t.Parallel()
	many := strings.Repeat("&c=1", maxFormParams-2)
	if fp(t, "POST", "/x?b=1&a=1"+many, "", "") != fp(t, "POST", "/x?a=1&b=1"+many, "", "") {
		t.Fatalf("%d parameters were not sorted", maxFormParams)
	}
	if _, err := url.ParseQuery("b=1&a=1" + many); err != nil {
		t.Fatalf("url.ParseQuery refuses %d parameters: %v", maxFormParams, err)
	}
	if _, err := url.ParseQuery("b=1&a=1" + many + "&c=1"); err == nil {
		t.Fatalf("url.ParseQuery accepts %d parameters; update maxFormParams", maxFormParams+1)
	}
}

func TestFingerprintDoesNotChangeTheRequest(t *testing.T) {
	t.Parallel()
	r := newRequest(t, "POST", "/v1/charges?b=1&a=2", "application/json")
	body := []byte(`{"b":1, "a":2}`)
	FingerprintRequest(r, body)
	if r.URL.RawQuery != "b=1&a=2" || string(body) != `{"b":1, "a":2}` {
		t.Fatalf("request changed: %q %q", r.URL.RawQuery, body)
	}
}

func TestFingerprintOfTheChargeBodyAllocatesAtMostThreeTimes(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	r := newRequest(t, "POST", "/v1/charges", "application/json")
	body := []byte(chargeBody)
	FingerprintRequest(r, body) // warm the pool
	if n := testing.AllocsPerRun(200, func() { FingerprintRequest(r, body) }); n > 3 {
		t.Fatalf("FingerprintRequest allocates %v times, want at most 3", n)
	}
}

func TestFingerprintIsSafeForConcurrentUse(t *testing.T) {
	t.Parallel()
	reqs := []req{
		jsonPost(chargeBody),
		jsonPost(`{"z":{"b":[1,{"d":1,"c":2}],"a":"x"},"y":[{"q":1,"p":2}]}`),
		formPost("b=2&a=1&a=0&c=%41"),
		{"PUT", "/v1/orders/ord_1?z=1&y=2", "text/plain", "raw"},
		jsonPost(`{"a":1,"a":2}`),
	}
	want := make([]Fingerprint, len(reqs))
	for i, q := range reqs {
		want[i] = q.fp(t)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for n := range 200 {
				i := (g + n) % len(reqs)
				if got := reqs[i].fp(t); got != want[i] {
					t.Errorf("concurrent fingerprint of %+v differs", reqs[i])
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestBodyKindAgreesWithMimeParseMediaType(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		ct := rapid.OneOf(
			rapid.SampledFrom([]string{"application/json", "APPLICATION/JSON", "application/x-www-form-urlencoded", "application/ld+json", "text/plain"}),
			rapid.StringMatching(`[ \t]?[a-zA-Z+/\-()@ ;=é"*]{0,30}[ \t]?`),
		).Draw(t, "content type")
		want := kindRaw
		if mt, _, err := mime.ParseMediaType(ct); err == nil || err == mime.ErrInvalidMediaParameter {
			switch {
			case mt == "application/json":
				want = kindJSON
			case mt == "application/x-www-form-urlencoded":
				want = kindForm
			case strings.HasSuffix(mt, "+json") && len(mt) > 5 && strings.Contains(mt, "/"):
				want = kindJSON
			}
		}
		if got := bodyKind(ct); got != want {
			t.Fatalf("bodyKind(%q) = %d, want %d", ct, got, want)
		}
	})
}

// jsonValue is a generated JSON document whose serialisation (member order, whitespace)
// is chosen separately from its content.
type jsonValue struct {
	token   string // number, string or literal token, as sent
	array   []*jsonValue
	members []jsonMember
	isArray bool
}

type jsonMember struct {
	name  string // token, with quotes
	value *jsonValue
}

func genJSONNumber() *rapid.Generator[string] {
	return rapid.StringMatching(`-?(0|[1-9][0-9]{0,20})(\.[0-9]{1,6})?([eE][+-]?[0-9]{1,3})?`)
}

func genJSONString() *rapid.Generator[string] {
	return rapid.Custom(func(t *rapid.T) string {
		parts := rapid.SliceOfN(rapid.SampledFrom([]string{
			"a", "b", "z", "0", " ", "é", "😀", `\"`, `\\`, `\/`, `\n`, `\u00e9`, `\ud83d\ude00`, "_", "-",
		}), 0, 6).Draw(t, "parts")
		return `"` + strings.Join(parts, "") + `"`
	})
}

func genJSONValue(depth int) *rapid.Generator[*jsonValue] {
	return rapid.Custom(func(t *rapid.T) *jsonValue {
		kind := rapid.IntRange(0, 4).Draw(t, "kind")
		if depth == 0 {
			kind %= 3
		}
		switch kind {
		case 0:
			return &jsonValue{token: genJSONNumber().Draw(t, "number")}
		case 1:
			return &jsonValue{token: genJSONString().Draw(t, "string")}
		case 2:
			return &jsonValue{token: rapid.SampledFrom([]string{"true", "false", "null"}).Draw(t, "literal")}
		case 3:
			return &jsonValue{isArray: true, array: rapid.SliceOfN(genJSONValue(depth-1), 0, 4).Draw(t, "array")}
		}
		// Names without escapes, so that distinct tokens are distinct names.
		names := rapid.SliceOfNDistinct(rapid.StringMatching(`[a-z_é😀]{0,8}`), 0, 5, rapid.ID[string]).Draw(t, "names")
		v := &jsonValue{}
		for _, n := range names {
			v.members = append(v.members, jsonMember{`"` + n + `"`, genJSONValue(depth-1).Draw(t, "member")})
		}
		return v
	})
}

// serialise writes v with random whitespace and random member order.
func (v *jsonValue) serialise(t *rapid.T, b *strings.Builder) {
	ws := func() {
		b.WriteString(rapid.SampledFrom([]string{"", "", " ", "\n", "\t", "\r\n", "  "}).Draw(t, "ws"))
	}
	ws()
	switch {
	case v.token != "":
		b.WriteString(v.token)
	case v.isArray:
		b.WriteByte('[')
		for i, e := range v.array {
			if i > 0 {
				b.WriteByte(',')
			}
			e.serialise(t, b)
		}
		ws()
		b.WriteByte(']')
	default:
		b.WriteByte('{')
		for i, j := range rapid.Permutation(indexes(len(v.members))).Draw(t, "order") {
			if i > 0 {
				b.WriteByte(',')
			}
			ws()
			b.WriteString(v.members[j].name)
			ws()
			b.WriteByte(':')
			v.members[j].value.serialise(t, b)
		}
		ws()
		b.WriteByte('}')
	}
	ws()
}

func (v *jsonValue) text(t *rapid.T) string {
	var b strings.Builder
	v.serialise(t, &b)
	return b.String()
}

// tokens returns pointers to every number and string token of v, names included.
func (v *jsonValue) tokens() []*string {
	switch {
	case v.token != "":
		if v.token[0] == '"' || v.token[0] == '-' || v.token[0] >= '0' && v.token[0] <= '9' {
			return []*string{&v.token}
		}
		return nil
	case v.isArray:
		var out []*string
		for _, e := range v.array {
			out = append(out, e.tokens()...)
		}
		return out
	}
	var out []*string
	for i := range v.members {
		out = append(out, &v.members[i].name)
		out = append(out, v.members[i].value.tokens()...)
	}
	return out
}

func indexes(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// mutateToken changes a number or string token slightly, keeping it a valid token.
func mutateToken(t *rapid.T, tok string) string {
	if tok[0] == '"' {
		inner := tok[1 : len(tok)-1]
		switch rapid.IntRange(0, 2).Draw(t, "string mutation") {
		case 0:
			return `"` + inner + "x" + `"`
		case 1:
			if inner != "" && inner[0] != 'q' {
				return `"q` + inner[1:] + `"` // one character changed (or an escape broken up)
			}
			return `"` + "Q" + inner + `"`
		default:
			return `"\u0071` + inner + `"` // "q" spelled as an escape, prepended
		}
	}
	switch rapid.IntRange(0, 3).Draw(t, "number mutation") {
	case 0: // the last digit; a digit other than 0 never makes a leading zero
		i := len(tok) - 1
		d := byte('1')
		if tok[i] == '1' {
			d = '2'
		}
		return tok[:i] + string(d)
	case 1: // a trailing zero, or ".0"
		if strings.ContainsAny(tok, ".eE") {
			return tok + "0"
		}
		return tok + ".0"
	case 2: // exponent form
		switch {
		case strings.Contains(tok, "e"):
			return strings.Replace(tok, "e", "E", 1)
		case strings.Contains(tok, "E"):
			return strings.Replace(tok, "E", "e", 1)
		}
		return tok + "e0"
	default: // a sign
		if tok[0] == '-' {
			return tok[1:]
		}
		return "-" + tok
	}
}

func TestFingerprintPropertyJSONReserialisationKeepsIt(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		v := genJSONValue(3).Draw(t, "doc")
		a, b := v.text(t), v.text(t)
		if fp(t, "POST", "/x", "application/json", a) != fp(t, "POST", "/x", "application/json", b) {
			ca, _ := canonicalJSON(nil, []byte(a))
			cb, _ := canonicalJSON(nil, []byte(b))
			t.Fatalf("fingerprints differ:\n%s -> %s\n%s -> %s", a, ca, b, cb)
		}
		checkCanonicalJSONInvariants(t, []byte(a))
	})
}

func TestFingerprintPropertyAnyTokenChangeChangesIt(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		v := genJSONValue(3).Draw(t, "doc")
		toks := v.tokens()
		if len(toks) == 0 {
			t.Skip("no number or string token")
		}
		before := v.text(t)
		p := toks[rapid.IntRange(0, len(toks)-1).Draw(t, "token")]
		old := *p
		*p = mutateToken(t, old)
		if *p == old {
			t.Fatalf("mutation kept %s", old)
		}
		after := v.text(t)
		if fp(t, "POST", "/x", "application/json", before) == fp(t, "POST", "/x", "application/json", after) {
			t.Fatalf("token %s -> %s kept the fingerprint:\n%s\n%s", old, *p, before, after)
		}
	})
}

// genParams draws parameters with repeated names likely.
func genParams(t *rapid.T) [][2]string {
	n := rapid.IntRange(0, 24).Draw(t, "n") // beyond 12, where sorting stops being insertion sort
	ps := make([][2]string, n)
	for i := range ps {
		ps[i] = [2]string{
			rapid.SampledFrom([]string{"a", "b", "amount", "tag", "é", "x y", "&=", ""}).Draw(t, "name"),
			rapid.StringMatching(`[a-z0-9 é&=+%]{0,5}`).Draw(t, "value"),
		}
	}
	return ps
}

// shuffleKeepingRepeats reorders ps at random but keeps the relative order of
// parameters that share a name, which is meaningful (url.Values keeps it).
func shuffleKeepingRepeats(t *rapid.T, ps [][2]string) [][2]string {
	perm := rapid.Permutation(indexes(len(ps))).Draw(t, "perm")
	next := map[string][]([2]string){}
	for _, p := range ps {
		next[p[0]] = append(next[p[0]], p)
	}
	out := make([][2]string, 0, len(ps))
	for _, i := range perm {
		name := ps[i][0]
		out = append(out, next[name][0])
		next[name] = next[name][1:]
	}
	return out
}

// encodeParams writes ps, escaping each byte that needs it and, at random, some that
// do not (and a space as "+" or "%20").
func encodeParams(t *rapid.T, ps [][2]string) string {
	enc := func(s string) string {
		var b strings.Builder
		for i := 0; i < len(s); i++ {
			c := s[i]
			switch {
			case c == ' ' && rapid.Bool().Draw(t, "plus"):
				b.WriteByte('+')
			case c == ' ' || c == '&' || c == '=' || c == '+' || c == '%' || c >= 0x80 || rapid.IntRange(0, 9).Draw(t, "escape") == 0:
				fmt.Fprintf(&b, "%%%02X", c)
			default:
				b.WriteByte(c)
			}
		}
		return b.String()
	}
	parts := make([]string, len(ps))
	for i, p := range ps {
		parts[i] = enc(p[0]) + "=" + enc(p[1])
	}
	return strings.Join(parts, "&")
}

func TestFingerprintPropertyFormAndQueryReorderingKeepsIt(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		ps := genParams(t)
		a, b := encodeParams(t, ps), encodeParams(t, shuffleKeepingRepeats(t, ps))
		if fp(t, "POST", "/x", "application/x-www-form-urlencoded", a) != fp(t, "POST", "/x", "application/x-www-form-urlencoded", b) {
			t.Fatalf("form bodies %q and %q differ", a, b)
		}
		if fp(t, "POST", "/x?"+a, "", "") != fp(t, "POST", "/x?"+b, "", "") {
			t.Fatalf("queries %q and %q differ", a, b)
		}
		// Agreement with net/http: same url.Values, as far as order within a name goes.
		va, _ := url.ParseQuery(a)
		vb, _ := url.ParseQuery(b)
		for k := range va {
			if !slices.Equal(va[k], vb[k]) {
				t.Fatalf("generator bug: %q vs %q", a, b)
			}
		}
	})
}

func TestFingerprintPropertyMethodAndPathChangeIt(t *testing.T) {
	t.Parallel()
	methods := []string{"POST", "PATCH", "PUT", "DELETE", "GET"}
	rapid.Check(t, func(t *rapid.T) {
		m1, m2 := rapid.SampledFrom(methods).Draw(t, "m1"), rapid.SampledFrom(methods).Draw(t, "m2")
		p1, p2 := rapid.StringMatching(`/[a-z0-9/_%]{0,12}`).Draw(t, "p1"), rapid.StringMatching(`/[a-z0-9/_%]{0,12}`).Draw(t, "p2")
		u1, err1 := url.Parse(p1)
		u2, err2 := url.Parse(p2)
		if err1 != nil || err2 != nil {
			t.Skip("not a path")
		}
		body := []byte(chargeBody)
		r1 := &http.Request{Method: m1, URL: u1, Header: http.Header{"Content-Type": {"application/json"}}}
		r2 := &http.Request{Method: m2, URL: u2, Header: http.Header{"Content-Type": {"application/json"}}}
		same := m1 == m2 && u1.EscapedPath() == u2.EscapedPath()
		if (FingerprintRequest(r1, body) == FingerprintRequest(r2, body)) != same {
			t.Fatalf("%s %s vs %s %s: equal fingerprints = %v, want %v", m1, p1, m2, p2, !same, same)
		}
	})
}

func FuzzFingerprint(f *testing.F) {
	f.Add("POST", "/v1/charges", "a=1", "application/json", []byte(chargeBody))
	f.Add("POST", "/v1/charges", "", "application/x-www-form-urlencoded", []byte("amount=2000&currency=usd"))
	f.Add("PATCH", "/v1/orders/ord_1", "b=%zz", "application/merge-patch+json; charset=utf-8", []byte(`{"a":1,"a":2}`))
	f.Add("PUT", "/files/a%2Fb", "x;y", "text/plain", []byte("raw"))
	f.Fuzz(func(t *testing.T, method, path, query, contentType string, body []byte) {
		r := &http.Request{Method: method, URL: &url.URL{Path: path, RawQuery: query}, Header: http.Header{"Content-Type": {contentType}}}
		got := FingerprintRequest(r, body)
		if again := FingerprintRequest(r, body); got != again || got.Version != idemstore.FingerprintVersion {
			t.Fatalf("not deterministic: %x vs %x", got.Sum, again.Sum)
		}
		// A JSON body and its canonical form are the same request.
		if bodyKind(contentType) == kindJSON {
			if canon, ok := canonicalJSON(nil, body); ok && FingerprintRequest(r, canon) != got {
				t.Fatalf("canonical form %q of %q has another fingerprint", canon, body)
			}
		}
	})
}
