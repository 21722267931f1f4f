// Package headercodec is the byte-for-byte form in which the SQL stores (sqlite, mysql)
// keep a response's headers.
package headercodec

import (
	"encoding/binary"
	"errors"
	"net/http"
	"slices"
)

// Encode encodes stored headers byte for byte: header values may hold any
// bytes (obs-text), which JSON would replace with U+FFFD. The encoding is, for each
// name in sorted order, the name, the number of values and each value, every string
// prefixed with its length as a uvarint. A nil or empty header encodes as no bytes.
func Encode(h http.Header) []byte {
	names := make([]string, 0, len(h))
	for name := range h {
		names = append(names, name)
	}
	slices.Sort(names)
	var b []byte
	putString := func(s string) {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	for _, name := range names {
		putString(name)
		b = binary.AppendUvarint(b, uint64(len(h[name])))
		for _, v := range h[name] {
			putString(v)
		}
	}
	return b
}

// ErrMalformed is the error of Decode for bytes that Encode did not make.
var ErrMalformed = errors.New("stored headers are malformed")

// Decode reverses Encode; no bytes decode as a nil header.
func Decode(b []byte) (http.Header, error) {
	if len(b) == 0 {
		return nil, nil
	}
	uvarint := func() (uint64, error) {
		n, size := binary.Uvarint(b)
		if size <= 0 {
			return 0, ErrMalformed
		}
		b = b[size:]
		return n, nil
	}
	str := func() (string, error) {
		n, err := uvarint()
		if err != nil || n > uint64(len(b)) {
			return "", ErrMalformed
		}
		s := string(b[:n])
		b = b[n:]
		return s, nil
	}
	h := http.Header{}
	for len(b) > 0 {
		name, err := str()
		if err != nil {
			return nil, err
		}
		count, err := uvarint()
		if err != nil || count > uint64(len(b)) { // each value takes at least one byte
			return nil, ErrMalformed
		}
		values := make([]string, 0, count)
		for range count {
			v, err := str()
			if err != nil {
				return nil, err
			}
			values = append(values, v)
		}
		h[name] = values
	}
	return h, nil
}
