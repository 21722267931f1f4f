package postgres

import (
	"encoding/binary"
	"errors"
	"net/http"
	"slices"
)

// Stored headers are kept byte for byte, since a header value may carry obs-text
// (bytes 0x80–0xFF) that neither PostgreSQL text nor JSON strings preserve. The form is
// a sequence of uvarint-length-prefixed strings: the number of names, then for each
// name (in sorted order) the name, the number of its values, and the values in order.

// encodeHeaders returns h in the stored form; nil when h is empty.
func encodeHeaders(h http.Header) []byte {
	if len(h) == 0 {
		return nil
	}
	names := make([]string, 0, len(h))
	for name := range h {
		names = append(names, name)
	}
	slices.Sort(names)
	b := binary.AppendUvarint(nil, uint64(len(names)))
	for _, name := range names {
		b = appendString(b, name)
		b = binary.AppendUvarint(b, uint64(len(h[name])))
		for _, v := range h[name] {
			b = appendString(b, v)
		}
	}
	return b
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

var errCorruptHeaders = errors.New("postgres: stored headers are corrupt")

// decodeHeaders reverses encodeHeaders; empty input is an empty header. It copies b
// once: the names and values are substrings of one string, and the value slices are
// carved from one array (each capped, so that an append to one never reaches its
// neighbour), as a replay reads them on every request.
func decodeHeaders(b []byte) (http.Header, error) {
	if len(b) == 0 {
		return http.Header{}, nil
	}
	d := decoder{b: b, s: string(b)}
	names := d.count()
	h := make(http.Header, names)
	all := make([]string, 0, names)
	for range names {
		name := d.string()
		n := d.count()
		start := len(all)
		for range n {
			all = append(all, d.string())
		}
		if d.err != nil {
			return nil, d.err
		}
		h[name] = all[start:len(all):len(all)]
	}
	if d.err == nil && len(d.b) != 0 {
		d.err = errCorruptHeaders
	}
	if d.err != nil {
		return nil, d.err
	}
	return h, nil
}

// decoder reads the stored form, remembering the first error. s holds the same bytes
// as b, as a string, so that strings are read without a copy.
type decoder struct {
	b   []byte
	s   string
	err error
}

func (d *decoder) advance(n int) {
	d.b, d.s = d.b[n:], d.s[n:]
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errCorruptHeaders
		return 0
	}
	d.advance(n)
	return v
}

// count reads a count, bounded by the bytes left (each item takes at least one byte).
func (d *decoder) count() int {
	v := d.uvarint()
	if v > uint64(len(d.b)) {
		d.err = errCorruptHeaders
		return 0
	}
	return int(v)
}

func (d *decoder) string() string {
	n := d.count()
	if d.err != nil {
		return ""
	}
	s := d.s[:n]
	d.advance(n)
	return s
}
