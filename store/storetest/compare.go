package storetest

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/idem-go/idem/idemstore"
)

// diffRecords describes how got differs from want, field by field; "" when they are the
// same record in the same state. Times compare as instants, responses byte for byte.
func diffRecords(got, want *idemstore.Record) string {
	if got == nil || want == nil {
		if got == want {
			return ""
		}
		return fmt.Sprintf("record = %v, want %v", got, want)
	}
	var d []string
	add := func(field string, g, w any) { d = append(d, fmt.Sprintf("%s = %v, want %v", field, g, w)) }
	if got.Scope != want.Scope {
		add("Scope", fmt.Sprintf("%q", got.Scope), fmt.Sprintf("%q", want.Scope))
	}
	if got.Key != want.Key {
		add("Key", got.Key, want.Key)
	}
	if got.ID != want.ID {
		add("ID", got.ID, want.ID)
	}
	if got.Fingerprint != want.Fingerprint {
		add("Fingerprint", got.Fingerprint, want.Fingerprint)
	}
	if got.State != want.State {
		add("State", got.State, want.State)
	}
	if got.Token != want.Token {
		add("Token", got.Token, want.Token)
	}
	// A completed record has no lease; stores may keep or clear the last one.
	if got.State == idemstore.StateInFlight && !got.LeaseEnd.Equal(want.LeaseEnd) {
		add("LeaseEnd", got.LeaseEnd, want.LeaseEnd)
	}
	if !got.Response.Equal(want.Response) {
		d = append(d, "Response: "+diffResponses(got.Response, want.Response))
	}
	if got.RecoveryPoint != want.RecoveryPoint {
		add("RecoveryPoint", got.RecoveryPoint, want.RecoveryPoint)
	}
	if !bytes.Equal(got.Steps, want.Steps) {
		add("Steps", short(got.Steps), short(want.Steps))
	}
	if got.Operation != want.Operation {
		add("Operation", got.Operation, want.Operation)
	}
	if !got.CreatedAt.Equal(want.CreatedAt) {
		add("CreatedAt", got.CreatedAt, want.CreatedAt)
	}
	if !got.ExpiresAt.Equal(want.ExpiresAt) {
		add("ExpiresAt", got.ExpiresAt, want.ExpiresAt)
	}
	return strings.Join(d, "; ")
}

// describeResponse prints a response compactly, without dumping a large body or header.
func describeResponse(r *idemstore.Response) string {
	if r == nil {
		return "<nil>"
	}
	return fmt.Sprintf("{Status: %d, NotStored: %v, %d header(s), Body: %s}", r.Status, r.NotStored, len(r.Header), short(r.Body))
}

// diffResponses says how got differs from want: which of status, NotStored, body and
// headers differ, naming each differing header.
func diffResponses(got, want *idemstore.Response) string {
	if got == nil || want == nil {
		return fmt.Sprintf("%s, want %s", describeResponse(got), describeResponse(want))
	}
	var d []string
	if got.Status != want.Status {
		d = append(d, fmt.Sprintf("Status = %d, want %d", got.Status, want.Status))
	}
	if got.NotStored != want.NotStored {
		d = append(d, fmt.Sprintf("NotStored = %v, want %v", got.NotStored, want.NotStored))
	}
	if !bytes.Equal(got.Body, want.Body) {
		i := 0
		for i < len(got.Body) && i < len(want.Body) && got.Body[i] == want.Body[i] {
			i++
		}
		d = append(d, fmt.Sprintf("Body (%d bytes) = %s, want (%d bytes) %s; first difference at byte %d",
			len(got.Body), short(got.Body), len(want.Body), short(want.Body), i))
	}
	names := map[string]bool{}
	for k := range got.Header {
		names[k] = true
	}
	for k := range want.Header {
		names[k] = true
	}
	for _, k := range slices.Sorted(maps.Keys(names)) {
		g, gok := got.Header[k]
		w, wok := want.Header[k]
		switch {
		case !gok:
			d = append(d, fmt.Sprintf("header %q missing, want %s", k, shortValues(w)))
		case !wok:
			d = append(d, fmt.Sprintf("header %q = %s, want none", k, shortValues(g)))
		case !slices.Equal(g, w):
			d = append(d, fmt.Sprintf("header %q = %s, want %s", k, shortValues(g), shortValues(w)))
		}
	}
	return strings.Join(d, "; ")
}

// short quotes b, cut to its first 48 bytes.
func short(b []byte) string {
	if len(b) > 48 {
		return fmt.Sprintf("%q…", b[:48])
	}
	return fmt.Sprintf("%q", b)
}

func shortValues(vs []string) string {
	q := make([]string, len(vs))
	for i, v := range vs {
		q[i] = short([]byte(v))
	}
	return "[" + strings.Join(q, " ") + "]"
}

// inFlightRecord is the record that a claim p acquiring a key afresh installs.
func inFlightRecord(p *idemstore.ClaimParams) *idemstore.Record {
	leaseEnd := p.Now.Add(p.Lease)
	return &idemstore.Record{
		Scope:       p.Scope,
		Key:         p.Key,
		ID:          p.RecordID,
		Fingerprint: p.Fingerprint,
		State:       idemstore.StateInFlight,
		Token:       p.Token,
		LeaseEnd:    leaseEnd,
		CreatedAt:   p.Now,
		ExpiresAt:   idemstore.InFlightExpiresAt(p.Now, p.TTL, leaseEnd),
	}
}

// completedRecord is rec, whose recovery point never advanced, completed with resp
// under ttl.
func completedRecord(rec *idemstore.Record, resp *idemstore.Response, ttl time.Duration) *idemstore.Record {
	if rec.RecoveryPoint != "" {
		panic("storetest: completedRecord of a record whose recovery point advanced; use completedRecordAt")
	}
	return completedRecordAt(rec, resp, ttl, rec.CreatedAt)
}

// completedRecordAt is rec completed at now with resp under ttl: it expires at
// created_at + ttl, or now + ttl when its recovery point advanced.
func completedRecordAt(rec *idemstore.Record, resp *idemstore.Response, ttl time.Duration, now time.Time) *idemstore.Record {
	c := *rec
	c.State = idemstore.StateCompleted
	c.Token = ""
	c.LeaseEnd = time.Time{}
	c.Response = resp
	c.ExpiresAt = rec.CompletionExpiresAt(now, ttl)
	c.RecoveryPoint = "" // it says where an unfinished operation stands; the results stay
	return &c
}

// wantRecord fails the test when got is not want.
func (b *bundle) wantRecord(what string, got, want *idemstore.Record) {
	b.t.Helper()
	if d := diffRecords(got, want); d != "" {
		b.t.Fatalf("%s: %s", what, d)
	}
}
