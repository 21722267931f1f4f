package redis

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/idem-go/idem/idemstore"
)

// Fields of a record's Redis hash. The hash holds neither the scope nor the key:
// the caller knows both, and the key's name is their digest.
const (
	fieldID        = "id"     // record id
	fieldFPVersion = "fpv"    // fingerprint version, decimal
	fieldFP        = "fp"     // fingerprint sum, hex
	fieldState     = "st"     // in_flight | completed
	fieldToken     = "tok"    // lock token (in flight only)
	fieldLease     = "lease"  // lease end, µs since the epoch (in flight only)
	fieldCreated   = "ctime"  // created_at, µs since the epoch
	fieldExpires   = "exp"    // expires_at, µs since the epoch
	fieldStatus    = "status" // response status (completed only)
	fieldHeader    = "hdr"    // stored response headers, see encodeHeader (completed only)
	fieldBody      = "body"   // response body, raw bytes (completed only)
	fieldNotStored = "ns"     // "1" when the response was not stored (completed only)
	fieldRecovery  = "rp"     // recovery point (SPEC §13; Redis keeps none)
	fieldUnknown   = "ou"     // "1" when completed as outcome unknown (SPEC §13)
	fieldScope     = "sc"     // scopeDigest of the record's scope, to delete a scope (admin.go)
)

// decodeReply splits a script's {outcome, now, fields} answer.
func decodeReply(res []any) (outcome string, now time.Time, fields []any, err error) {
	if len(res) != 3 {
		return "", time.Time{}, nil, fmt.Errorf("redis store: script answered %d values", len(res))
	}
	outcome, _ = res[0].(string)
	nowStr, _ := res[1].(string)
	if now, err = parseMicros(nowStr); err != nil {
		return "", time.Time{}, nil, err
	}
	fields, ok := res[2].([]any)
	if !ok {
		return "", time.Time{}, nil, fmt.Errorf("redis store: script answered fields of type %T", res[2])
	}
	return outcome, now, fields, nil
}

// decodeRecord builds a record from a hash's HGETALL answer (field, value, …).
func decodeRecord(scope, key string, fields []any) (*idemstore.Record, error) {
	m := make(map[string]string, len(fields)/2)
	for i := 0; i+1 < len(fields); i += 2 {
		k, _ := fields[i].(string)
		v, _ := fields[i+1].(string)
		m[k] = v
	}
	rec := &idemstore.Record{
		Scope:         scope,
		Key:           key,
		ID:            m[fieldID],
		State:         idemstore.State(m[fieldState]),
		Token:         m[fieldToken],
		RecoveryPoint: m[fieldRecovery],
	}
	if rec.State != idemstore.StateInFlight && rec.State != idemstore.StateCompleted {
		return nil, fmt.Errorf("redis store: record has state %q", rec.State)
	}
	var err error
	if rec.Fingerprint, err = decodeFingerprint(m[fieldFPVersion], m[fieldFP]); err != nil {
		return nil, err
	}
	if rec.CreatedAt, err = parseMicros(m[fieldCreated]); err != nil {
		return nil, err
	}
	if rec.ExpiresAt, err = parseMicros(m[fieldExpires]); err != nil {
		return nil, err
	}
	if rec.State == idemstore.StateInFlight {
		rec.LeaseEnd, err = parseMicros(m[fieldLease])
		return rec, err
	}
	rec.Response, err = decodeResponse(m)
	return rec, err
}

func decodeFingerprint(version, sum string) (idemstore.Fingerprint, error) {
	var fp idemstore.Fingerprint
	v, err := strconv.Atoi(version)
	if err != nil {
		return fp, fmt.Errorf("redis store: record has fingerprint version %q", version)
	}
	fp.Version = v
	b, err := hex.DecodeString(sum)
	if err != nil || len(b) != len(fp.Sum) {
		return fp, fmt.Errorf("redis store: record has a malformed fingerprint")
	}
	copy(fp.Sum[:], b)
	return fp, nil
}

func decodeResponse(m map[string]string) (*idemstore.Response, error) {
	status, err := strconv.Atoi(m[fieldStatus])
	if err != nil {
		return nil, fmt.Errorf("redis store: record has response status %q", m[fieldStatus])
	}
	resp := &idemstore.Response{Status: status, Body: []byte(m[fieldBody]), NotStored: m[fieldNotStored] == "1",
		OutcomeUnknown: m[fieldUnknown] == "1"}
	if h := m[fieldHeader]; h != "" {
		if resp.Header, err = decodeHeader(h); err != nil {
			return nil, err
		}
	}
	return resp, nil
}

// encodeHeader writes h as a sequence of length-prefixed strings: for each name (in
// sorted order) uvarint(len) name uvarint(count), then each value as uvarint(len)
// value. Unlike JSON it keeps any byte of a value (obs-text is not UTF-8).
func encodeHeader(h http.Header) string {
	if len(h) == 0 {
		return ""
	}
	var b []byte
	str := func(s string) {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	for _, name := range slices.Sorted(maps.Keys(h)) {
		str(name)
		b = binary.AppendUvarint(b, uint64(len(h[name])))
		for _, v := range h[name] {
			str(v)
		}
	}
	return string(b)
}

func decodeHeader(s string) (http.Header, error) {
	bad := errors.New("redis store: record has malformed headers")
	b := []byte(s)
	num := func() (uint64, bool) {
		n, k := binary.Uvarint(b)
		if k <= 0 {
			return 0, false
		}
		b = b[k:]
		return n, true
	}
	str := func() (string, bool) {
		n, ok := num()
		if !ok || n > uint64(len(b)) {
			return "", false
		}
		v := string(b[:n])
		b = b[n:]
		return v, true
	}
	h := http.Header{}
	for len(b) > 0 {
		name, ok := str()
		if !ok {
			return nil, bad
		}
		count, ok := num()
		if !ok || count > uint64(len(b)) {
			return nil, bad
		}
		values := make([]string, 0, count)
		for range count {
			v, ok := str()
			if !ok {
				return nil, bad
			}
			values = append(values, v)
		}
		h[name] = values
	}
	return h, nil
}

func parseMicros(s string) (time.Time, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("redis store: malformed time %q", s)
	}
	return time.UnixMicro(n).UTC(), nil
}
