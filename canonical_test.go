package idem

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestCanonicalJSONSortsMembersAndRemovesWhitespace(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{`{"amount": 2000, "currency": "usd", "customer_id": "cust_abc123"}`, `{"amount":2000,"currency":"usd","customer_id":"cust_abc123"}`},
		{"{\"currency\":\"usd\",\r\n\t\"amount\" : 2000}", `{"amount":2000,"currency":"usd"}`},
		{`{"b":{"z":[3,2,1],"y":{}},"a":[]}`, `{"a":[],"b":{"y":{},"z":[3,2,1]}}`},
		{`[{"b":1,"a":2},{"d":3,"c":4}]`, `[{"a":2,"b":1},{"c":4,"d":3}]`},
		{` "just a string" `, `"just a string"`},
		{"\n42\n", `42`},
		{`[true,false,null]`, `[true,false,null]`},
		// Names are ordered by their decoded bytes, but written as sent.
		{`{"b":1,"\u0061":2}`, `{"\u0061":2,"b":1}`},
		{`{"é":1,"z":2}`, `{"z":2,"é":1}`},
		// UTF-8 byte order, not RFC 8785's UTF-16 order: U+FF61 sorts before U+1F600.
		{`{"😀":1,"｡":2}`, `{"｡":2,"😀":1}`},
		{`{"":1," ":2}`, `{"":1," ":2}`},
		{`{"ab":1,"a":2}`, `{"a":2,"ab":1}`},
	} {
		got, ok := canonicalJSON(nil, []byte(tc.in))
		if !ok || string(got) != tc.want {
			t.Errorf("canonicalJSON(%s) = %s, %v; want %s", tc.in, got, ok, tc.want)
		}
	}
}

func TestCanonicalJSONKeepsTokensExactlyAsSent(t *testing.T) {
	t.Parallel()
	for _, tok := range []string{
		`9007199254740993`, `9007199254740992`, `1.0`, `1.00`, `1e2`, `1E2`, `1e+2`, `100e-2`, `-0`, `0.1`,
		`123456789012345678901234567890.123456789e-300`,
		`"é"`, `"\u00e9"`, `"\u00E9"`, `"\/"`, `"/"`, `"\ud83d\ude00"`, `"😀"`, `"a\tb"`, `"\""`,
	} {
		in := "{ \"v\" : " + tok + " }"
		got, ok := canonicalJSON(nil, []byte(in))
		if want := `{"v":` + tok + `}`; !ok || string(got) != want {
			t.Errorf("canonicalJSON(%s) = %s, %v; want %s", in, got, ok, want)
		}
	}
}

func TestCanonicalJSONRefusesWhatIsNotIJSON(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, in string }{
		{"empty", ``},
		{"whitespace only", " \n "},
		{"trailing data", `{"a":1} x`},
		{"two values", `1 2`},
		{"unterminated object", `{"a":1`},
		{"unterminated string", `"abc`},
		{"trailing comma in object", `{"a":1,}`},
		{"trailing comma in array", `[1,]`},
		{"missing colon", `{"a" 1}`},
		{"unquoted name", `{a:1}`},
		{"single quotes", `'a'`},
		{"leading zero", `01`},
		{"bare fraction dot", `1.`},
		{"empty exponent", `1e`},
		{"plus sign", `+1`},
		{"NaN", `NaN`},
		{"truncated literal", `tru`},
		{"control character in string", "\"a\x01b\""},
		{"unknown escape", `"\x41"`},
		{"short unicode escape", `"\u00e"`},
		{"duplicate names", `{"a":1,"a":2}`},
		{"duplicate names, one escaped", `{"a":1,"\u0061":2}`},
		{"duplicate names, not adjacent", `{"b":1,"a":2,"c":3,"b":4}`},
		{"duplicate names, nested", `{"x":{"a":1,"a":1}}`},
		{"invalid UTF-8", "\"\xff\""},
		{"invalid UTF-8 in a name", "{\"\xc3\":1}"},
		{"UTF-8 encoded surrogate", "\"\xed\xa0\x80\""},
		{"overlong UTF-8", "\"\xc0\xaf\""},
		{"lone high surrogate", `"\ud800"`},
		{"lone low surrogate", `"\udc00"`},
		{"high surrogate then a letter", `"\ud800x"`},
		{"two high surrogates", `"\ud800\ud800"`},
		{"noncharacter escaped", `"\uffff"`},
		{"noncharacter literal", "\"\uFDD0\""},
		{"byte order mark", "\ufeff{}"},
		{"too deep", strings.Repeat("[", maxJSONDepth+1) + strings.Repeat("]", maxJSONDepth+1)},
	} {
		got, ok := canonicalJSON([]byte("prefix"), []byte(tc.in))
		if ok || string(got) != "prefix" {
			t.Errorf("%s: canonicalJSON(%q) = %q, %v; want dst unchanged and false", tc.name, tc.in, got, ok)
		}
	}
}

func TestCanonicalJSONAcceptsDeepNestingUpToTheLimit(t *testing.T) {
	t.Parallel()
	in := strings.Repeat(`{"a":[`, maxJSONDepth/2) + strings.Repeat(`]}`, maxJSONDepth/2)
	if got, ok := canonicalJSON(nil, []byte(in)); !ok || string(got) != in {
		t.Fatalf("nesting of %d refused", maxJSONDepth)
	}
}

func TestCanonicalJSONAppendsToDst(t *testing.T) {
	t.Parallel()
	got, ok := canonicalJSON([]byte("x:"), []byte(` { "b" : 1 , "a" : 2 } `))
	if !ok || string(got) != `x:{"a":2,"b":1}` {
		t.Fatalf("got %q, %v", got, ok)
	}
}

// checkCanonicalJSONInvariants is shared by FuzzCanonicalJSON and the property tests.
func checkCanonicalJSONInvariants(t interface {
	Fatalf(string, ...any)
}, in []byte) {
	out, ok := canonicalJSON(nil, in)
	if !ok {
		if out != nil {
			t.Fatalf("refused input returned %q", out)
		}
		if plainIJSON(in) {
			t.Fatalf("canonicalJSON refused %q, which encoding/json takes for I-JSON", in)
		}
		return
	}
	if !json.Valid(in) || !json.Valid(out) {
		t.Fatalf("canonicalJSON accepted %q (json.Valid %v) -> %q (json.Valid %v)", in, json.Valid(in), out, json.Valid(out))
	}
	if len(out) > len(in) {
		t.Fatalf("canonical form %q is longer than %q", out, in)
	}
	again, ok := canonicalJSON(nil, out)
	if !ok || !bytes.Equal(again, out) {
		t.Fatalf("canonical form is not a fixed point: %q -> %q (%v)", out, again, ok)
	}
	// Same value: decode both with numbers kept as text.
	if a, b := decodeJSON(in), decodeJSON(out); !reflect.DeepEqual(a, b) {
		t.Fatalf("canonical form %q decodes to %#v, input %q to %#v", out, b, in, a)
	}
}

func decodeJSON(b []byte) any {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		panic(err)
	}
	return v
}

// plainIJSON is an independent oracle built on encoding/json for inputs where it can
// decide: valid JSON, valid UTF-8, no escapes (so no lone surrogates hide in them), no
// noncharacters, no duplicate names, within the depth limit.
func plainIJSON(in []byte) bool {
	if !json.Valid(in) || !utf8.Valid(in) || bytes.Contains(in, []byte(`\u`)) || bytes.HasPrefix(in, []byte("\ufeff")) {
		return false
	}
	for _, r := range string(in) {
		if !scalarOK(r) {
			return false
		}
	}
	d := json.NewDecoder(bytes.NewReader(in))
	d.UseNumber()
	depth, ok := 0, true
	var walk func() bool // returns false on duplicate names or excessive depth
	walk = func() bool {
		tok, err := d.Token()
		if err != nil {
			return false
		}
		delim, isDelim := tok.(json.Delim)
		if !isDelim {
			return true
		}
		if depth++; depth > maxJSONDepth {
			return false
		}
		defer func() { depth-- }()
		seen := map[string]bool{}
		for d.More() {
			if delim == '{' {
				name, err := d.Token()
				if err != nil || seen[name.(string)] {
					return false
				}
				seen[name.(string)] = true
			}
			if !walk() {
				return false
			}
		}
		_, err = d.Token() // closing delimiter
		return err == nil
	}
	ok = walk()
	if _, err := d.Token(); !errors.Is(err, io.EOF) {
		return false
	}
	return ok
}

func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{
		`{"amount": 2000, "currency": "usd", "customer_id": "cust_abc123"}`,
		`{"b":{"z":[3,2,1],"y":{}},"a":[]}`,
		`{"a":1,"a":2}`,
		`{"a":1,"\u0061":2}`,
		`"\ud83d\ude00"`,
		`"\ud800"`,
		"\"\xff\"",
		`[9007199254740993, 1.0, 1e2, -0]`,
		`{"é":1,"z":2,"😀":3,"｡":4}`,
		`1 2`,
		`{"a":[{"c":1,"b":2}],"a ":null}`,
		"\"\uFDD0\"",
	} {
		f.Add([]byte(s))
	}
	f.Add([]byte(`{"z":{"y":{"x":[{"b":1,"a":2}],"w":0},"v":{"c":1,"b":2}},"a":0}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		checkCanonicalJSONInvariants(t, in)
		sameAsV1(t, in)
	})
}
