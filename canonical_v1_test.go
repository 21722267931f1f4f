package idem

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// v1Canonicalizer is the canonicaliser as FingerprintVersion 1 shipped it (commit
// 015e3ea), kept as the oracle that the canonical form never changes: it sorts each
// object's members by copying the object's bytes, once per level of nesting. Only its
// objects differ from canonicalizer's, whose token scanners it shares.
type v1Canonicalizer struct{ canonicalizer }

func v1CanonicalJSON(dst, src []byte) ([]byte, bool) {
	c := &v1Canonicalizer{canonicalizer{src: src, out: dst}}
	if !c.value() || c.skipSpace() != len(src) {
		return dst, false
	}
	return c.out, true
}

func (c *v1Canonicalizer) value() bool {
	if c.skipSpace() == len(c.src) {
		return false
	}
	switch b := c.src[c.pos]; {
	case b == '{':
		return c.object()
	case b == '[':
		return c.array()
	case b == '"':
		return c.str(false)
	case b == '-' || b >= '0' && b <= '9':
		return c.number()
	case b == 't':
		return c.literal("true")
	case b == 'f':
		return c.literal("false")
	case b == 'n':
		return c.literal("null")
	}
	return false
}

func (c *v1Canonicalizer) array() bool {
	if c.depth++; c.depth > maxJSONDepth {
		return false
	}
	c.pos++
	c.out = append(c.out, '[')
	if c.skipSpace() < len(c.src) && c.src[c.pos] == ']' {
		c.pos++
		c.out = append(c.out, ']')
		c.depth--
		return true
	}
	for {
		if !c.value() || c.skipSpace() == len(c.src) {
			return false
		}
		switch c.src[c.pos] {
		case ',':
			c.out = append(c.out, ',')
			c.pos++
		case ']':
			c.out = append(c.out, ']')
			c.pos++
			c.depth--
			return true
		default:
			return false
		}
	}
}

func (c *v1Canonicalizer) object() bool {
	if c.depth++; c.depth > maxJSONDepth {
		return false
	}
	c.pos++
	open := len(c.out)
	c.out = append(c.out, '{')
	if c.skipSpace() < len(c.src) && c.src[c.pos] == '}' {
		c.pos++
		c.out = append(c.out, '}')
		c.depth--
		return true
	}
	firstMember, firstName := len(c.members), len(c.names)
	sorted := true
	for {
		if c.skipSpace() == len(c.src) || c.src[c.pos] != '"' {
			return false
		}
		m := member{start: len(c.out), name: len(c.names)}
		if !c.str(true) || c.skipSpace() == len(c.src) || c.src[c.pos] != ':' {
			return false
		}
		c.pos++
		c.out = append(c.out, ':')
		if !c.value() || c.skipSpace() == len(c.src) {
			return false
		}
		m.end, m.nameTo = len(c.out), len(c.names)
		if n := len(c.members); n > firstMember && sorted {
			sorted = c.compareNames(c.members[n-1], m) < 0
		}
		c.members = append(c.members, m)
		switch c.src[c.pos] {
		case ',':
			c.out = append(c.out, ',')
			c.pos++
			continue
		case '}':
			c.pos++
		default:
			return false
		}
		break
	}
	if !sorted && !c.sortMembersByCopy(open, c.members[firstMember:]) {
		return false
	}
	c.members, c.names = c.members[:firstMember], c.names[:firstName]
	c.out = append(c.out, '}')
	c.depth--
	return true
}

func (c *v1Canonicalizer) sortMembersByCopy(open int, ms []member) bool {
	slices.SortFunc(ms, c.compareNames)
	for i := 1; i < len(ms); i++ {
		if c.compareNames(ms[i-1], ms[i]) == 0 {
			return false
		}
	}
	body := c.out[open+1:]
	c.scratch = append(c.scratch[:0], body...)
	w := body[:0]
	for i, m := range ms {
		if i > 0 {
			w = append(w, ',')
		}
		w = append(w, c.scratch[m.start-open-1:m.end-open-1]...)
	}
	return true
}

// sameAsV1 fails unless canonicalJSON and the version 1 canonicaliser agree on in: the
// same verdict and, for I-JSON, the same bytes, so that no fingerprint of version 1
// changes.
func sameAsV1(t interface{ Fatalf(string, ...any) }, in []byte) {
	got, gotOK := canonicalJSON([]byte("dst:"), in)
	want, wantOK := v1CanonicalJSON([]byte("dst:"), in)
	if gotOK != wantOK || !bytes.Equal(got, want) {
		t.Fatalf("canonicalJSON(%q) = %q, %v; version 1 gave %q, %v", in, got, gotOK, want, wantOK)
	}
}

// genNearJSON draws JSON text with members out of order and random whitespace, nested
// up to a few levels or (sometimes) hundreds deep, and then, often, a few bytes inserted,
// deleted or replaced, so that duplicate names, escaped names and invalid text are
// drawn too.
func genNearJSON() *rapid.Generator[[]byte] {
	return rapid.Custom(func(t *rapid.T) []byte {
		text := genJSONValue(4).Draw(t, "doc").text(t)
		if rapid.IntRange(0, 9).Draw(t, "deep") == 0 {
			n := rapid.IntRange(1, maxJSONDepth+2).Draw(t, "levels")
			text = strings.Repeat(`{"z":1,"y":`, n) + text + strings.Repeat(`}`, n)
		}
		b := []byte(text)
		for range rapid.IntRange(0, 3).Draw(t, "edits") {
			alphabet := []string{"{", "}", "[", "]", `"`, ",", ":", " ", "a", `\u0061`, "1", "é", "\xff", `\ud800`}
			piece := []byte(rapid.SampledFrom(alphabet).Draw(t, "piece"))
			i := rapid.IntRange(0, len(b)).Draw(t, "at")
			switch rapid.IntRange(0, 2).Draw(t, "edit") {
			case 0:
				b = slices.Insert(b, i, piece...)
			case 1:
				if i < len(b) {
					b = slices.Delete(b, i, i+1)
				}
			default:
				if i < len(b) {
					b = slices.Replace(b, i, i+1, piece...)
				}
			}
		}
		return b
	})
}

func TestCanonicalJSONPropertyIsVersion1ByteForByte(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		sameAsV1(t, genNearJSON().Draw(t, "json"))
	})
}

func TestCanonicalJSONOfDeepUnsortedObjectsIsVersion1(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		deepUnsortedJSON(maxJSONDepth-1, `[1,{"b":2,"a":[{"d":1,"c":2}]}]`),
		deepUnsortedJSON(maxJSONDepth, `0`),
		deepUnsortedJSON(maxJSONDepth+1, `0`), // over the limit: refused by both
		`{"b":{"d":{"f":1,"e":2},"c":0},"a":{"h":[{"j":1,"i":2},{"l":1,"k":2}],"g":0}}`,
		`[{"b":1,"a":2},{"b":{"y":1,"x":{"q":1,"p":2}},"a":2}]`,
	} {
		sameAsV1(t, []byte(in))
	}
}

// deepUnsortedJSON nests inner in levels objects, each with a member "z", holding the
// next level, before a member "a": every level is out of order, with its bulk inside.
func deepUnsortedJSON(levels int, inner string) string {
	var b strings.Builder
	for range levels {
		b.WriteString(`{"z":`)
	}
	b.WriteString(inner)
	for range levels {
		b.WriteString(`,"a":0}`)
	}
	return b.String()
}
