package idem

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/idem-go/idem/idemstore"
)

// FingerprintRequest returns the fingerprint of r with the given body (SPEC §4), version
// [idemstore.FingerprintVersion]: a SHA-256 over, in this order,
//
//   - the fingerprint version;
//   - the method, as sent (methods are case-sensitive);
//   - the path as escaped on the wire (r.URL.EscapedPath), so that "/a%2Fb" and "/a/b",
//     which a router may take for different resources, never share a fingerprint;
//   - the query: its parameters decoded as url.ParseQuery does and sorted by name, with
//     repeated names kept in the order sent ("a=1&a=2" and "a=2&a=1" differ); a query that
//     url.ParseQuery would refuse is taken as sent;
//   - the body, canonicalised by the media type of Content-Type: application/json and any
//     type with a +json suffix as canonicalJSON describes; application/x-www-form-urlencoded
//     like the query; anything else, a malformed Content-Type, and a body that fails to
//     canonicalise as the raw bytes.
//
// Each field is tagged and length-prefixed, and a canonical body is tagged differently
// from a raw one, so no two different requests frame to the same bytes. Header fields
// other than Content-Type, the host and the scheme are not part of the fingerprint.
//
// body is the request body as read by the middleware; r.Body is not touched.
func FingerprintRequest(r *http.Request, body []byte) Fingerprint {
	st := fpPool.Get().(*fpState)
	defer st.release()
	b := st.appendRequest(r)
	tag, data := byte(tagRawBody), body
	switch bodyKind(contentType(r.Header)) {
	case kindJSON:
		if canon, ok := st.canon.canonical(st.body[:0], body); ok {
			tag, data, st.body = tagJSONBody, canon, canon
		}
	case kindForm:
		if canon, ok := canonicalPairs(st, st.body[:0], body); ok {
			tag, data, st.body = tagFormBody, canon, canon
		}
	}
	return st.sum256(b, tag, data)
}

// contentType is h.Get("Content-Type") without canonicalising the name on every call
// (net/http canonicalises the names of the headers it receives, and Get finds nothing
// under another spelling either).
func contentType(h http.Header) string {
	if v := h["Content-Type"]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// appendRequest frames the fields of r before its body: the version, the method, the
// path and the query (canonical, or as sent). The canonical query is in st.body.
func (st *fpState) appendRequest(r *http.Request) []byte {
	b := appendField(st.frame[:0], tagVersion, strconv.AppendInt(st.num[:0], idemstore.FingerprintVersion, 10))
	b = appendStringField(b, tagMethod, r.Method)
	var path, query string
	if r.URL != nil {
		path, query = r.URL.EscapedPath(), r.URL.RawQuery
	}
	b = appendStringField(b, tagPath, path)
	if canon, ok := canonicalPairs(st, st.body[:0], query); ok {
		b, st.body = appendField(b, tagQuery, canon), canon
	} else {
		b = appendStringField(b, tagRawQuery, query)
	}
	return b
}

// FingerprintJSONFields returns a [FingerprintFunc] that covers, of a JSON body, only
// the named members (compared as canonicalJSON writes them), with the method, path
// and query as [FingerprintRequest] covers them: a retry that changes other members (a
// client's trace id, a timestamp) is still the same operation. A member named but
// absent differs from one present. A request whose body is not a JSON object (by
// Content-Type and content) is fingerprinted as FingerprintRequest does. Changing the
// list changes the fingerprints of requests already recorded (they answer key_reused
// until their records expire).
//
// A name is a member of the top-level object ("amount"), a dotted path to a nested
// member ("payment.amount": the member amount of the object payment), or a JSON
// Pointer (RFC 6901, "/payment/amount"), which also names members whose names hold a
// dot ("/a.b") or are empty. Paths go through objects only: a member whose parent is
// not an object (an array, a number) is absent, and an array is covered whole by
// naming it. A name that can match nothing (empty, an empty segment such as
// "payment..amount" or "payment.", a pointer with an escape other than ~0 and ~1), or
// no name at all, panics: the function would cover less than it says.
func FingerprintJSONFields(include ...string) FingerprintFunc {
	if len(include) == 0 {
		panic("idem: FingerprintJSONFields: no name given: the body would not be covered at all (use FingerprintRequest for the whole body)")
	}
	return jsonMembers(newPathTrie("FingerprintJSONFields", include), true)
}

// FingerprintJSONExcept is [FingerprintJSONFields] covering every member of a JSON
// body except the named ones (names as FingerprintJSONFields takes them: top-level,
// dotted paths or JSON Pointers).
func FingerprintJSONExcept(exclude ...string) FingerprintFunc {
	return jsonMembers(newPathTrie("FingerprintJSONExcept", exclude), false)
}

// pathTrie holds the member paths of FingerprintJSONFields and FingerprintJSONExcept:
// end marks a named member, kids the members below one named on the way.
type pathTrie struct {
	end  bool
	kids map[string]*pathTrie
}

// newPathTrie parses names (fn's arguments) into a trie, panicking on a name that can
// match nothing.
func newPathTrie(fn string, names []string) *pathTrie {
	root := &pathTrie{}
	for _, name := range names {
		segs, err := parseMemberPath(name)
		if err != nil {
			panic(fmt.Sprintf("idem: %s: the member %q can never match: %v", fn, name, err))
		}
		t := root
		for _, seg := range segs {
			if t.kids == nil {
				t.kids = map[string]*pathTrie{}
			}
			if t.kids[seg] == nil {
				t.kids[seg] = &pathTrie{}
			}
			t = t.kids[seg]
		}
		t.end = true
	}
	return root
}

// parseMemberPath splits a member's name into the member names of its path: a JSON
// Pointer when it starts with "/", else a dotted path.
func parseMemberPath(name string) ([]string, error) {
	if name == "" {
		return nil, errors.New("an empty name")
	}
	if ptr, ok := strings.CutPrefix(name, "/"); ok {
		segs := strings.Split(ptr, "/")
		for i, seg := range segs {
			for j := 0; j < len(seg); j++ {
				if seg[j] == '~' && (j+1 == len(seg) || (seg[j+1] != '0' && seg[j+1] != '1')) {
					return nil, errors.New("a JSON Pointer escapes only ~0 (~) and ~1 (/)")
				}
			}
			segs[i] = strings.ReplaceAll(strings.ReplaceAll(seg, "~1", "/"), "~0", "~")
		}
		return segs, nil
	}
	segs := strings.Split(name, ".")
	for _, seg := range segs {
		if seg == "" {
			return nil, errors.New(`a dotted path has an empty member name (name a member with a dot or an empty name by its JSON Pointer, "/a.b")`)
		}
	}
	return segs, nil
}

// jsonMembers fingerprints the members of a JSON object body that paths names (keep)
// or all but those (!keep).
func jsonMembers(paths *pathTrie, keep bool) FingerprintFunc {
	return func(r *http.Request, body []byte) Fingerprint {
		selected, ok := selectMembers(r, body, paths, keep)
		if !ok {
			return FingerprintRequest(r, body)
		}
		st := fpPool.Get().(*fpState)
		defer st.release()
		return st.sum256(st.appendRequest(r), tagSelectedJSON, selected)
	}
}

// selectMembers returns the canonical JSON of the members of body, a JSON object, that
// paths selects (keep) or leaves (!keep), or false when body is not a JSON object. The
// selected members keep their nesting; objects are written with their members sorted.
func selectMembers(r *http.Request, body []byte, paths *pathTrie, keep bool) ([]byte, bool) {
	if bodyKind(contentType(r.Header)) != kindJSON {
		return nil, false
	}
	canon, ok := canonicalJSON(nil, body)
	if !ok || len(canon) == 0 || canon[0] != '{' {
		return nil, false
	}
	var members map[string]json.RawMessage // tokens kept as sent (canonical)
	if err := json.Unmarshal(canon, &members); err != nil {
		return nil, false
	}
	var selected map[string]any
	if keep {
		selected = projectMembers(members, paths)
	} else {
		selected = pruneMembers(members, paths)
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(selected); err != nil { // sorted by name
		return nil, false
	}
	return out.Bytes(), true
}

// projectMembers returns the members of obj that t names, nested as they are.
func projectMembers(obj map[string]json.RawMessage, t *pathTrie) map[string]any {
	out := make(map[string]any, len(t.kids))
	for name, kid := range t.kids {
		v, ok := obj[name]
		switch {
		case !ok:
		case kid.end:
			out[name] = v
		default:
			if child, ok := jsonObject(v); ok {
				if sub := projectMembers(child, kid); len(sub) > 0 {
					out[name] = sub
				}
			}
		}
	}
	return out
}

// pruneMembers returns the members of obj without those t names.
func pruneMembers(obj map[string]json.RawMessage, t *pathTrie) map[string]any {
	out := make(map[string]any, len(obj))
	for name, v := range obj {
		kid := t.kids[name]
		switch {
		case kid == nil:
			out[name] = v
		case kid.end:
		default:
			if child, ok := jsonObject(v); ok {
				out[name] = pruneMembers(child, kid)
			} else {
				out[name] = v
			}
		}
	}
	return out
}

// jsonObject decodes v when it is a JSON object.
func jsonObject(v json.RawMessage) (map[string]json.RawMessage, bool) {
	if len(v) == 0 || v[0] != '{' {
		return nil, false
	}
	var obj map[string]json.RawMessage
	return obj, json.Unmarshal(v, &obj) == nil
}

// sum256 hashes the framed fields b followed by the body field (tag, data). The body
// may be large: it is hashed where it lies instead of being copied into the frame.
func (st *fpState) sum256(b []byte, tag byte, data []byte) Fingerprint {
	b = binary.AppendUvarint(append(b, tag), uint64(len(data)))
	st.frame = b
	st.h.Reset()
	st.h.Write(b)
	st.h.Write(data)
	// Sum into the pooled state: a slice of a local would make the local escape.
	st.h.Sum(st.sum[:0])
	return Fingerprint{Version: idemstore.FingerprintVersion, Sum: st.sum}
}

// FingerprintInput returns the fingerprint of a function's input (SPEC §16), version
// [idemstore.FingerprintVersion], for a [Call]: a SHA-256 over the version, op (the operation's
// name, such as "charges.create" or a gRPC method's full name, so that one key used for
// two operations is key_reused) and the input. An input that is valid I-JSON is
// canonicalised as canonicalJSON describes, so that a repeat that re-serialises the
// same value matches; any other input (a protobuf message's deterministic encoding,
// say) is hashed as its raw bytes. The framing differs from [FingerprintRequest]'s, so
// a function's input never matches an HTTP request.
func FingerprintInput(op string, input []byte) Fingerprint {
	st := fpPool.Get().(*fpState)
	defer st.release()
	b := appendField(st.frame[:0], tagVersion, strconv.AppendInt(st.num[:0], idemstore.FingerprintVersion, 10))
	b = appendStringField(b, tagOperation, op)
	tag, data := byte(tagRawBody), input
	if canon, ok := st.canon.canonical(st.body[:0], input); ok {
		tag, data, st.body = tagJSONBody, canon, canon
	}
	return st.sum256(b, tag, data)
}

// FingerprintJSON is [FingerprintInput] of v encoded with encoding/json: the
// fingerprint of a function's input given as a Go value. It fails only when v cannot
// be encoded.
func FingerprintJSON(op string, v any) (Fingerprint, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return Fingerprint{}, fmt.Errorf("idem: fingerprinting the input of %q: %w", op, err)
	}
	return FingerprintInput(op, b), nil
}

// Field tags of the fingerprint's framing. Changing any of them, or the framing, is a
// change of [idemstore.FingerprintVersion].
const (
	tagVersion  = 'V'
	tagMethod   = 'M'
	tagPath     = 'P'
	tagQuery    = 'Q' // canonical parameters
	tagRawQuery = 'q' // the query as sent, when it does not parse
	tagJSONBody = 'J' // canonicalJSON of the body
	tagFormBody = 'F' // canonical parameters of a form body
	tagRawBody  = 'R' // the body as sent
	// tagOperation names a function's operation (FingerprintInput), in place of the
	// method, path and query of a request.
	tagOperation = 'O'
	// tagSelectedJSON is the chosen members of a JSON body (FingerprintJSONFields).
	tagSelectedJSON = 'S'
)

func appendField(b []byte, tag byte, data []byte) []byte {
	b = binary.AppendUvarint(append(b, tag), uint64(len(data)))
	return append(b, data...)
}

func appendStringField(b []byte, tag byte, data string) []byte {
	b = binary.AppendUvarint(append(b, tag), uint64(len(data)))
	return append(b, data...)
}

// fpState is what one fingerprint needs, pooled so that fingerprinting a small request
// does not allocate.
type fpState struct {
	h     hash.Hash
	frame []byte // the framed fields before the body
	body  []byte // the canonical query, then the canonical body
	num   [20]byte
	sum   [sha256.Size]byte
	canon canonicalizer
	pairs []pair
	dec   []byte // decoded parameter names and values
}

var fpPool = sync.Pool{New: func() any { return &fpState{h: sha256.New()} }}

func (st *fpState) release() {
	if cap(st.body) > maxPooledBuffer {
		st.body = nil
	}
	if cap(st.frame) > maxPooledBuffer {
		st.frame = nil
	}
	if cap(st.dec) > maxPooledBuffer {
		st.dec = nil
	}
	if cap(st.pairs) > maxPooledBuffer/32 {
		st.pairs = nil
	}
	st.canon.src, st.canon.out = nil, nil
	if cap(st.canon.scratch) > maxPooledBuffer || cap(st.canon.names) > maxPooledBuffer || cap(st.canon.members) > maxPooledBuffer/32 {
		st.canon = canonicalizer{}
	}
	fpPool.Put(st)
}

// Body kinds, by media type.
const (
	kindRaw = iota
	kindJSON
	kindForm
)

// bodyKind classifies a Content-Type value. The common case, a bare ASCII media type,
// is handled without mime.ParseMediaType, which allocates a parameter map; anything else
// goes through it. A media type with malformed parameters still counts, as its
// parameters do not change how the body is canonicalised.
func bodyKind(contentType string) int {
	switch contentType { // the usual values, without parsing them
	case "application/json":
		return kindJSON
	case "application/x-www-form-urlencoded":
		return kindForm
	}
	mt, ok := simpleMediaType(contentType)
	if !ok {
		var err error
		mt, _, err = mime.ParseMediaType(contentType)
		if err != nil && !errors.Is(err, mime.ErrInvalidMediaParameter) {
			return kindRaw
		}
	}
	switch {
	case strings.EqualFold(mt, "application/json"):
		return kindJSON
	case strings.EqualFold(mt, "application/x-www-form-urlencoded"):
		return kindForm
	case len(mt) > len("+json") && strings.EqualFold(mt[len(mt)-len("+json"):], "+json") && strings.IndexByte(mt, '/') > 0:
		return kindJSON
	}
	return kindRaw
}

// simpleMediaType returns the media type of a Content-Type value that is ASCII, has no
// parameters and is a valid type/subtype: exactly the values for which
// mime.ParseMediaType would return the same media type (up to case) and no error.
func simpleMediaType(v string) (string, bool) {
	for i := 0; i < len(v); i++ {
		if v[i] >= 0x80 || v[i] == ';' {
			return "", false
		}
	}
	v = strings.TrimSpace(v)
	slash := strings.IndexByte(v, '/')
	if slash <= 0 || slash == len(v)-1 {
		return "", false
	}
	for i := 0; i < len(v); i++ {
		if i != slash && !isTokenByte(v[i]) {
			return "", false
		}
	}
	return v, true
}

// isTokenByte reports whether c may appear in an RFC 2045 token (as mime does).
func isTokenByte(c byte) bool { return tokenBytes[c] }

var tokenBytes = func() (t [256]bool) {
	for c := 0x21; c < 0x7f; c++ {
		t[c] = !strings.ContainsRune(`()<>@,;:\"/[]?=`, rune(c))
	}
	return t
}()

// pair is a decoded parameter: name and value are spans of fpState.dec.
type pair struct{ name, nameTo, valueTo int }

// canonicalPairs appends to dst the canonical form of an application/x-www-form-urlencoded
// text (a query or a form body): the parameters decoded as url.ParseQuery decodes them,
// stably sorted by name, each written as length-prefixed name and value. It reports false
// for text that url.ParseQuery refuses (a bad %-escape, a ';', or more than
// maxFormParams parameters).
func canonicalPairs[S string | []byte](st *fpState, dst []byte, s S) ([]byte, bool) {
	st.pairs, st.dec = st.pairs[:0], st.dec[:0]
	if count(s, '&') >= maxFormParams {
		return dst, false
	}
	for len(s) > 0 {
		seg := s
		if i := index(s, '&'); i >= 0 {
			seg, s = s[:i], s[i+1:]
		} else {
			s = s[:0]
		}
		if len(seg) == 0 {
			continue
		}
		if index(seg, ';') >= 0 {
			return dst, false
		}
		name, value := seg, seg[:0]
		if i := index(seg, '='); i >= 0 {
			name, value = seg[:i], seg[i+1:]
		}
		p := pair{name: len(st.dec)}
		var ok bool
		if st.dec, ok = appendUnescaped(st.dec, name); !ok {
			return dst, false
		}
		p.nameTo = len(st.dec)
		if st.dec, ok = appendUnescaped(st.dec, value); !ok {
			return dst, false
		}
		p.valueTo = len(st.dec)
		st.pairs = append(st.pairs, p)
	}
	slices.SortStableFunc(st.pairs, func(a, b pair) int {
		return bytes.Compare(st.dec[a.name:a.nameTo], st.dec[b.name:b.nameTo])
	})
	for _, p := range st.pairs {
		dst = appendField(dst, 'n', st.dec[p.name:p.nameTo])
		dst = appendField(dst, 'v', st.dec[p.nameTo:p.valueTo])
	}
	return dst, true
}

// maxFormParams is url.ParseQuery's default limit on the number of parameters (its
// GODEBUG urlmaxqueryparams setting is not followed here).
const maxFormParams = 10000

func count[S string | []byte](s S, c byte) int {
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			n++
		}
	}
	return n
}

func index[S string | []byte](s S, c byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return i
		}
	}
	return -1
}

// appendUnescaped appends s decoded as a query component ('+' is a space, %XX a byte),
// like url.QueryUnescape, and reports false for a malformed %-escape.
func appendUnescaped[S string | []byte](dst []byte, s S) ([]byte, bool) {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '+':
			dst = append(dst, ' ')
		case '%':
			if i+2 >= len(s) {
				return dst, false
			}
			hi, lo := unhex(s[i+1]), unhex(s[i+2])
			if hi < 0 || lo < 0 {
				return dst, false
			}
			dst = append(dst, byte(hi<<4|lo))
			i += 2
		default:
			dst = append(dst, c)
		}
	}
	return dst, true
}

func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}
