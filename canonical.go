package idem

import (
	"bytes"
	"slices"
	"sync"
	"unicode/utf8"
)

// maxJSONDepth bounds the nesting of arrays and objects the canonicaliser follows. The
// scanner recurses, and a body of a million '[' must not exhaust the stack; deeper
// bodies are hashed as raw bytes, which is still deterministic.
const maxJSONDepth = 1000

// canonicalJSON appends to dst the canonical form of the JSON text src that the request
// fingerprint hashes (SPEC §4), and reports whether src was valid I-JSON (RFC 7493).
//
// The canonical form removes insignificant whitespace and sorts the members of every
// object by name, comparing the names' decoded UTF-8 bytes (the order of code points,
// not RFC 8785's UTF-16 order). Every number and string token, member names included, is
// kept byte for byte as sent: 1, 1.0 and 1e0 stay three different bodies, as do "é" and
// "\u00e9", and 9007199254740993 is never rounded. The canonical form is therefore
// itself valid I-JSON and its own canonical form.
//
// src is refused (ok false, dst returned unchanged) when it is not a single JSON value
// with nothing but whitespace after it, when an object has two members whose names
// decode to the same string, when a string holds invalid UTF-8, a surrogate code point
// that is not part of an escaped pair, or a Unicode noncharacter (all forbidden by
// I-JSON), or when arrays and objects nest deeper than 1000.
//
// Its cost is linear in len(src) at any depth of nesting.
func canonicalJSON(dst, src []byte) ([]byte, bool) {
	c := canonPool.Get().(*canonicalizer)
	out, ok := c.canonical(dst, src)
	c.release()
	return out, ok
}

var canonPool = sync.Pool{New: func() any { return new(canonicalizer) }}

// canonicalizer is a JSON scanner that writes the canonical form as it validates, in
// one pass when every object's members come in order and in two when some do not (the
// second moves each byte once, see emit). Its buffers are reused across calls through
// a pool.
type canonicalizer struct {
	src   []byte
	pos   int
	out   []byte
	depth int
	// names holds the decoded names of the members of the objects being scanned; members
	// holds their spans in out. Both are stacks: an object pops what it pushed.
	names   []byte
	members []member
	// reorders lists, in the order they open, the objects whose members were sent out of
	// order, with their ancestors; order holds the members of each, put in order.
	// Objects are written to out as sent and put in order once the whole text is
	// scanned (emit), so that every byte is moved once however deep it is nested.
	reorders []reorder
	order    []member
	// scratch holds the text as scanned while emit writes it to out in order.
	scratch []byte
	base    int // where the scanned text starts in out
}

// member is one `"name":value` of an object, as written to out.
type member struct {
	start, end   int // span in out
	name, nameTo int // decoded name in names
	next         int // index in reorders of the first object that opens after start
}

// reorder is an object that emit puts in order, or (inOrder) one that holds such
// objects.
type reorder struct {
	open, end   int // span in out, from '{' to past '}'
	first, last int // its members, in order, in c.order
	next        int // index in reorders past the objects nested in this one
	inOrder     bool
}

// maxPooledBuffer is the largest buffer a pooled scanner keeps, so that one big body
// does not pin its memory for the life of the process.
const maxPooledBuffer = 64 << 10

func (c *canonicalizer) release() {
	c.src, c.out = nil, nil
	if cap(c.scratch) > maxPooledBuffer {
		c.scratch = nil
	}
	if cap(c.names) > maxPooledBuffer {
		c.names = nil
	}
	if cap(c.members) > maxPooledBuffer/32 {
		c.members = nil
	}
	if cap(c.order) > maxPooledBuffer/32 {
		c.order = nil
	}
	if cap(c.reorders) > maxPooledBuffer/32 {
		c.reorders = nil
	}
	canonPool.Put(c)
}

func (c *canonicalizer) canonical(dst, src []byte) ([]byte, bool) {
	c.src, c.pos, c.out, c.depth = src, 0, dst, 0
	c.names, c.members = c.names[:0], c.members[:0]
	c.reorders, c.order = c.reorders[:0], c.order[:0]
	ok := c.value() && c.skipSpace() == len(src)
	if !ok {
		return dst, false
	}
	if len(c.reorders) > 0 {
		c.base = len(dst)
		c.scratch = append(c.scratch[:0], c.out[c.base:]...)
		c.out = c.out[:c.base]
		c.emit(c.base, c.base+len(c.scratch), 0)
	}
	return c.out, true
}

// emit appends to out the scanned text from..to (positions in out before emit began,
// now in scratch), writing the members of each object of reorders, from index k on,
// in order. Every byte is appended once; emit recurses once per level of objects to
// put in order, at most maxJSONDepth.
func (c *canonicalizer) emit(from, to, k int) {
	for ; k < len(c.reorders) && c.reorders[k].open < to; k++ {
		r := c.reorders[k]
		if r.inOrder {
			continue // its members stay where they are; objects inside it follow
		}
		c.out = append(c.out, c.scratch[from-c.base:r.open-c.base]...)
		c.out = append(c.out, '{')
		for i, m := range c.order[r.first:r.last] {
			if i > 0 {
				c.out = append(c.out, ',')
			}
			c.emit(m.start, m.end, m.next)
		}
		c.out = append(c.out, '}')
		from, k = r.end, r.next-1
	}
	c.out = append(c.out, c.scratch[from-c.base:to-c.base]...)
}

// skipSpace skips JSON's insignificant whitespace and returns the new position.
func (c *canonicalizer) skipSpace() int {
	for c.pos < len(c.src) {
		switch c.src[c.pos] {
		case ' ', '\t', '\n', '\r':
			c.pos++
		default:
			return c.pos
		}
	}
	return c.pos
}

func (c *canonicalizer) value() bool {
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

func (c *canonicalizer) literal(lit string) bool {
	if !bytes.HasPrefix(c.src[c.pos:], []byte(lit)) {
		return false
	}
	c.out = append(c.out, lit...)
	c.pos += len(lit)
	return true
}

// number checks the RFC 8259 number grammar and copies the token as sent:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (c *canonicalizer) number() bool {
	s, i := c.src, c.pos
	if s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case i < len(s) && s[i] >= '1' && s[i] <= '9':
		i = digits(s, i)
	default:
		return false
	}
	if i < len(s) && s[i] == '.' {
		j := digits(s, i+1)
		if j == i+1 {
			return false
		}
		i = j
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		j := digits(s, i)
		if j == i {
			return false
		}
		i = j
	}
	c.out = append(c.out, s[c.pos:i]...)
	c.pos = i
	return true
}

func digits(s []byte, i int) int {
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return i
}

// str checks the string token at c.pos and copies it as sent. With decode, it also
// appends the string's decoded value to c.names, for ordering and comparing names.
func (c *canonicalizer) str(decode bool) bool {
	s, start := c.src, c.pos
	i := start + 1
	run := i // start of the bytes not yet appended to names
	for {
		// The common case: printable ASCII.
		for i < len(s) && s[i] >= 0x20 && s[i] < 0x80 && s[i] != '"' && s[i] != '\\' {
			i++
		}
		if i >= len(s) {
			return false
		}
		switch b := s[i]; {
		case b == '"':
			if decode {
				c.names = append(c.names, s[run:i]...)
			}
			i++
			c.out = append(c.out, s[start:i]...)
			c.pos = i
			return true
		case b == '\\':
			if decode {
				c.names = append(c.names, s[run:i]...)
			}
			r, n := unescape(s[i:])
			if n == 0 || !scalarOK(r) {
				return false
			}
			if decode {
				c.names = utf8.AppendRune(c.names, r)
			}
			i += n
			run = i
		case b < 0x20:
			return false
		default:
			r, n := utf8.DecodeRune(s[i:])
			if r == utf8.RuneError && n == 1 || !scalarOK(r) {
				return false
			}
			i += n
		}
	}
}

// scalarOK reports whether I-JSON allows the code point in a string: no surrogates
// (utf8 and unescape never yield one) and no noncharacters (RFC 7493 §2.1).
func scalarOK(r rune) bool {
	return !(r >= 0xfdd0 && r <= 0xfdef || r&0xfffe == 0xfffe)
}

// unescape decodes the escape sequence at the start of s (which begins with '\') and
// returns the code point and the length of the sequence, or n == 0 when it is invalid:
// an unknown escape, bad hex, or a surrogate that is not a high-low \u pair.
func unescape(s []byte) (r rune, n int) {
	if len(s) < 2 {
		return 0, 0
	}
	switch s[1] {
	case '"', '\\', '/':
		return rune(s[1]), 2
	case 'b':
		return '\b', 2
	case 'f':
		return '\f', 2
	case 'n':
		return '\n', 2
	case 'r':
		return '\r', 2
	case 't':
		return '\t', 2
	case 'u':
	default:
		return 0, 0
	}
	r = hex4(s[2:])
	switch {
	case r < 0:
		return 0, 0
	case r >= 0xdc00 && r <= 0xdfff:
		return 0, 0 // a low surrogate alone
	case r < 0xd800 || r > 0xdbff:
		return r, 6
	}
	// A high surrogate must be followed by an escaped low one.
	if len(s) < 12 || s[6] != '\\' || s[7] != 'u' {
		return 0, 0
	}
	lo := hex4(s[8:])
	if lo < 0xdc00 || lo > 0xdfff {
		return 0, 0
	}
	return 0x10000 + (r-0xd800)<<10 + (lo - 0xdc00), 12
}

// hex4 decodes four hex digits, or returns -1.
func hex4(s []byte) rune {
	if len(s) < 4 {
		return -1
	}
	var r rune
	for _, b := range s[:4] {
		switch {
		case b >= '0' && b <= '9':
			b -= '0'
		case b >= 'a' && b <= 'f':
			b -= 'a' - 10
		case b >= 'A' && b <= 'F':
			b -= 'A' - 10
		default:
			return -1
		}
		r = r<<4 | rune(b)
	}
	return r
}

func (c *canonicalizer) array() bool {
	if c.depth++; c.depth > maxJSONDepth {
		return false
	}
	c.pos++ // '['
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

func (c *canonicalizer) object() bool {
	if c.depth++; c.depth > maxJSONDepth {
		return false
	}
	c.pos++ // '{'
	open := len(c.out)
	c.out = append(c.out, '{')
	if c.skipSpace() < len(c.src) && c.src[c.pos] == '}' {
		c.pos++
		c.out = append(c.out, '}')
		c.depth--
		return true
	}
	// Reserved now, so that reorders lists objects in the order they open.
	node := len(c.reorders)
	c.reorders = append(c.reorders, reorder{open: open})
	firstMember, firstName := len(c.members), len(c.names)
	sorted := true
	for {
		if c.skipSpace() == len(c.src) || c.src[c.pos] != '"' {
			return false
		}
		m := member{start: len(c.out), name: len(c.names), next: len(c.reorders)}
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
			// Strictly increasing names need neither sorting nor a duplicate check.
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
	c.out = append(c.out, '}')
	switch {
	case !sorted:
		ms := c.members[firstMember:]
		if !c.sortMembers(ms) {
			return false
		}
		first := len(c.order)
		c.order = append(c.order, ms...)
		c.reorders[node] = reorder{open: open, end: len(c.out), first: first, last: len(c.order), next: len(c.reorders)}
	case node == len(c.reorders)-1:
		c.reorders = c.reorders[:node] // in order, and nothing inside it to put in order
	default:
		c.reorders[node] = reorder{open: open, end: len(c.out), next: len(c.reorders), inOrder: true}
	}
	c.members, c.names = c.members[:firstMember], c.names[:firstName]
	c.depth--
	return true
}

func (c *canonicalizer) compareNames(a, b member) int {
	return bytes.Compare(c.names[a.name:a.nameTo], c.names[b.name:b.nameTo])
}

// sortMembers puts ms in the order of their names, and reports false when two names
// are equal (I-JSON forbids that).
func (c *canonicalizer) sortMembers(ms []member) bool {
	slices.SortFunc(ms, c.compareNames)
	for i := 1; i < len(ms); i++ {
		if c.compareNames(ms[i-1], ms[i]) == 0 {
			return false
		}
	}
	return true
}
