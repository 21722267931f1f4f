package idem

import (
	"errors"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"pgregory.net/rapid"
)

// keyPattern is SPEC §3's definition of a key, for checking ParseKey against.
var keyPattern = regexp.MustCompile(`^[\x21\x23-\x2B\x2D-\x5B\x5D-\x7E]{1,255}$`)

const uuidKey = "8e7b2f5a-4c1d-4e6b-9a3f-0d2c1b4a5e6f"

func TestParseKeyAcceptsBareAndQuotedFormsAlike(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("k", MaxKeyLength)
	for _, tc := range []struct {
		name  string
		value string
		want  string
	}{
		{"uuid bare", uuidKey, uuidKey},
		{"uuid quoted", `"` + uuidKey + `"`, uuidKey},
		{"design note example", "a1b2c3d4", "a1b2c3d4"},
		{"every allowed punctuation", "!#$%&'()*+-./:;<=>?@[]^_`{|}~", "!#$%&'()*+-./:;<=>?@[]^_`{|}~"},
		{"semicolon in a bare key is a key byte", "abc;p=1xyz", "abc;p=1xyz"},
		{"255 bytes bare", long, long},
		{"255 bytes quoted", `"` + long + `"`, long},
		{"surrounding spaces and tabs trimmed", " \t" + uuidKey + "\t ", uuidKey},
		{"spaces around a quoted key trimmed", `  "` + uuidKey + `"  `, uuidKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseKey([]string{tc.value}, DefaultMinKeyLength)
			if err != nil {
				t.Fatalf("ParseKey(%q) error: %v", tc.value, err)
			}
			if got != tc.want {
				t.Fatalf("ParseKey(%q) = %q, want %q", tc.value, got, tc.want)
			}
		})
	}
}

func TestParseKeyRequiresAHeader(t *testing.T) {
	t.Parallel()
	for _, values := range [][]string{nil, {}} {
		if _, err := ParseKey(values, DefaultMinKeyLength); !errors.Is(err, ErrKeyRequired) {
			t.Fatalf("ParseKey(%q) error = %v, want ErrKeyRequired", values, err)
		}
	}
}

func TestParseKeyRefusesInvalidValues(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		values []string
		reason string // a fragment the error must contain
	}{
		{"two headers", []string{uuidKey, uuidKey}, "two Idempotency-Key headers"},
		{"three headers", []string{uuidKey, uuidKey, uuidKey}, "3 Idempotency-Key headers"},
		{"empty value", []string{""}, "empty value"},
		{"only whitespace", []string{" \t "}, "empty value"},
		{"too short", []string{"abc12"}, "key is 5 characters, at least 8 required"},
		{"too short quoted", []string{`"abc12"`}, "key is 5 characters, at least 8 required"},
		{"empty quoted string", []string{`""`}, "key is 0 characters, at least 8 required"},
		{"256 bytes", []string{strings.Repeat("k", 256)}, "key is 256 characters, at most 255 allowed"},
		{"256 bytes quoted", []string{`"` + strings.Repeat("k", 256) + `"`}, "at most 255 allowed"},
		{"double quote in bare form", []string{`abcd"efgh`}, `'"' at position 5`},
		{"comma in bare form", []string{"abcd,efgh"}, "',' (a list?) at position 5"},
		{"backslash in bare form", []string{`abcd\efgh`}, `'\\' at position 5`},
		{"bare list", []string{"abcdefgh, ijklmnop"}, "','"},
		{"inner space", []string{"abcd efgh"}, "space at position 5"},
		{"control character", []string{"ab\x01defghi"}, "control character 0x01 at position 3"},
		{"NUL", []string{"abcdefgh\x00"}, "control character 0x00 at position 9"},
		{"inner tab", []string{"abcd\tefgh"}, "control character 0x09 at position 5"},
		{"DEL", []string{"abcd\x7fefgh"}, "DEL (0x7F) at position 5"},
		{"non-ASCII", []string{"abcdéfgh"}, "non-ASCII byte 0xC3 at position 5"},
		{"control character quoted", []string{"\"ab\x01defghi\""}, "control character 0x01 at position 4"},
		{"non-ASCII quoted", []string{`"abcdéfgh"`}, "non-ASCII byte 0xC3 at position 6"},
		{"space quoted", []string{`"abcd efgh"`}, "space at position 6"},
		{"comma quoted", []string{`"abcd,efgh"`}, "','"},
		{"quoted list", []string{`"abcdefgh", "ijklmnop"`}, "a list is not allowed"},
		{"parameter", []string{`"abcdefgh";p=1`}, "parameters are not allowed"},
		{"parameter after space", []string{`"abcdefgh" ;p=1`}, "parameters are not allowed"},
		{"trailing garbage", []string{`"abcdefgh"x`}, "unexpected data after the closing quote at position 11"},
		{"unterminated quote", []string{`"abcdefgh`}, "no closing quote"},
		{"lone quote", []string{`"`}, "no closing quote"},
		{"escaped quote", []string{`"abcd\"efgh"`}, "escaped '\"' at position 6"},
		{"escaped backslash", []string{`"abcd\\efgh"`}, "escaped '\\\\' at position 6"},
		{"invalid escape", []string{`"abcd\nefgh"`}, "invalid escape"},
		{"backslash at the end", []string{`"abcdefgh\`}, "invalid escape"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			key, err := ParseKey(tc.values, DefaultMinKeyLength)
			if !errors.Is(err, ErrKeyInvalid) {
				t.Fatalf("ParseKey(%q) = %q, %v; want ErrKeyInvalid", tc.values, key, err)
			}
			if !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("ParseKey(%q) error %q does not say %q", tc.values, err, tc.reason)
			}
		})
	}
}

func TestParseKeyMinimumLengthIsConfigurable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		key    string
		minLen int
		ok     bool
	}{
		{"abcd", 4, true},
		{"abc", 4, false},
		{"a", 1, true},
		{"a", 0, true}, // minLen below 1 counts as 1
		{"a", -5, true},
		{uuidKey, 36, true},
		{uuidKey, 37, false},
		{"abcdefg", DefaultMinKeyLength, false},
		{"abcdefgh", DefaultMinKeyLength, true},
	} {
		_, err := ParseKey([]string{tc.key}, tc.minLen)
		if (err == nil) != tc.ok {
			t.Errorf("ParseKey(%q, min %d) error = %v, want ok=%v", tc.key, tc.minLen, err, tc.ok)
		}
	}
}

func TestParseKeyErrorNeverContainsTheKey(t *testing.T) {
	t.Parallel()
	const secret = "SECRETKEY"
	for _, v := range []string{
		secret + "\x01", secret + " x", `"` + secret + `";p=1`, `"` + secret, strings.Repeat(secret, 30),
		`"` + secret + `\"x"`, secret + ",x",
	} {
		_, err := ParseKey([]string{v}, DefaultMinKeyLength)
		if err == nil {
			t.Fatalf("ParseKey(%q) accepted", v)
		}
		if strings.Contains(err.Error(), "SECRET") {
			t.Fatalf("ParseKey(%q) error %q reveals the key", v, err)
		}
	}
}

func TestParseKeyReturnsWithoutAllocating(t *testing.T) {
	for _, v := range []string{uuidKey, `"` + uuidKey + `"`} {
		values := []string{v}
		if n := testing.AllocsPerRun(100, func() { _, _ = ParseKey(values, DefaultMinKeyLength) }); n != 0 {
			t.Errorf("ParseKey(%q) allocates %v times, want 0", v, n)
		}
	}
}

// genKey draws a valid key of 1 to 255 bytes.
func genKey() *rapid.Generator[string] {
	return rapid.StringOfN(rapid.RuneFrom(nil, &unicode.RangeTable{R16: []unicode.Range16{
		{Lo: 0x21, Hi: 0x21, Stride: 1}, {Lo: 0x23, Hi: 0x2b, Stride: 1},
		{Lo: 0x2d, Hi: 0x5b, Stride: 1}, {Lo: 0x5d, Hi: 0x7e, Stride: 1},
	}}), 1, MaxKeyLength, -1)
}

func TestParseKeyPropertyBareAndQuotedAreEqual(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		k := genKey().Draw(t, "key")
		bare, err := ParseKey([]string{k}, 1)
		if err != nil {
			t.Fatalf("bare %q refused: %v", k, err)
		}
		quoted, err := ParseKey([]string{`"` + k + `"`}, 1)
		if err != nil {
			t.Fatalf("quoted %q refused: %v", k, err)
		}
		if bare != k || quoted != k {
			t.Fatalf("ParseKey bare = %q, quoted = %q, want %q", bare, quoted, k)
		}
	})
}

func TestParseKeyPropertyAnyInvalidByteIsRefused(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		k := genKey().Draw(t, "key")
		bad := rapid.Byte().Filter(func(c byte) bool { return !keyByte[c] }).Draw(t, "byte")
		// Inside the key: OWS at either end is trimmed, so insert strictly inside.
		at := rapid.IntRange(0, len(k)).Draw(t, "at")
		v := k[:at] + string([]byte{bad}) + k[at:]
		if (bad == ' ' || bad == '\t') && (at == 0 || at == len(k)) {
			v = k[:1] + string([]byte{bad}) + k[1:] + "x"
			if len(k) == 1 {
				v = k + string([]byte{bad}) + "x"
			}
		}
		for _, form := range []string{v, `"` + v + `"`} {
			if got, err := ParseKey([]string{form}, 1); !errors.Is(err, ErrKeyInvalid) {
				t.Fatalf("ParseKey(%q) = %q, %v; want ErrKeyInvalid", form, got, err)
			}
		}
	})
}

func TestParseKeyPropertyAcceptedKeysMatchTheSpecPattern(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		v := rapid.String().Draw(t, "value")
		if rapid.Bool().Draw(t, "quoted") {
			v = `"` + v + `"`
		}
		checkParseKeyInvariants(t, v, rapid.IntRange(-1, 300).Draw(t, "min"))
	})
}

// checkErrorHidesKey checks that the error for v does not reveal it. Letters are mapped
// to 'Z' first (which keeps the verdict and the positions) so that a value that happens
// to spell part of an error template ("invalid Idempotency-Key") is no false alarm.
func checkErrorHidesKey(t interface{ Fatalf(string, ...any) }, v string, minLen int) {
	vz := []byte(v)
	for i, c := range vz {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' {
			vz[i] = 'Z'
		}
	}
	inner := strings.Trim(string(vz), " \t\"")
	if len(inner) < 8 || !strings.Contains(inner, "Z") {
		return
	}
	if _, err := ParseKey([]string{string(vz)}, minLen); err != nil && strings.Contains(err.Error(), inner) {
		t.Fatalf("ParseKey(%q) error %q reveals the key", vz, err)
	}
}

// checkParseKeyInvariants is shared by the property test and FuzzParseKey.
func checkParseKeyInvariants(t interface{ Fatalf(string, ...any) }, v string, minLen int) {
	key, err := ParseKey([]string{v}, minLen)
	if err != nil {
		if !errors.Is(err, ErrKeyInvalid) {
			t.Fatalf("ParseKey(%q) error %v does not wrap ErrKeyInvalid", v, err)
		}
		checkErrorHidesKey(t, v, minLen)
		return
	}
	if !keyPattern.MatchString(key) || len(key) < minLen {
		t.Fatalf("ParseKey(%q, %d) accepted %q, which SPEC §3 refuses", v, minLen, key)
	}
	// The other form of the same key names the same key.
	other := `"` + key + `"`
	if strings.HasPrefix(trimOWS(v), `"`) {
		other = key
	}
	if k2, err := ParseKey([]string{other}, minLen); err != nil || k2 != key {
		t.Fatalf("ParseKey(%q) = %q, %v; want %q like %q", other, k2, err, key, v)
	}
}

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{
		uuidKey, `"` + uuidKey + `"`, " \t" + uuidKey + " ", "a1b2c3d4", "abc", `""`, `"abcdefgh";p=1`,
		`"abcdefgh", "ijklmnop"`, "abcd,efgh", `"abcd\"efgh"`, `"abcdefgh`, "abcd\x7fefgh", "abcdéfgh",
		strings.Repeat("k", 256),
	} {
		f.Add(s, DefaultMinKeyLength)
	}
	f.Fuzz(func(t *testing.T, v string, minLen int) {
		checkParseKeyInvariants(t, v, minLen)
	})
}
