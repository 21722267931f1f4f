package postgres_test

import (
	"context"
	"net/http"
	"net/url"
	"reflect"
	"testing"
	"time"

	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/store/postgres"
)

// TestRecordReadsTheSameWithTheSimpleProtocol checks the store's own decoding of a
// record row (binary values, the default) against pgx's Scan, which reads the rows of
// the simple protocol (text values): the same records, in flight and completed, with
// headers that hold obs-text, an empty body and a NULL one.
func TestRecordReadsTheSameWithTheSimpleProtocol(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	u, err := url.Parse(s.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("default_query_exec_mode", "simple_protocol")
	u.RawQuery = q.Encode()
	simple, err := postgres.Open(context.Background(), u.String(), postgres.Config{Schema: s.schema, MaxConns: 2})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(simple.Close)

	t0 := time.Date(2026, 11, 30, 4, 5, 6, 123456000, time.UTC)
	inFlight := claimParams("k-in-flight", t0)
	mustClaim(t, s, inFlight, idemstore.ClaimAcquired)
	for i, resp := range []*idemstore.Response{
		{Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "X-Obs": {"caf\xe9", ""}}, Body: []byte(`{"id":"ch_1"}`)},
		{Status: 204, Header: http.Header{}, Body: []byte{}},
		{Status: 500, NotStored: true},
	} {
		p := claimParams("k-completed-"+string(rune('a'+i)), t0)
		mustClaim(t, s, p, idemstore.ClaimAcquired)
		if err := s.RecordComplete(t.Context(), &idemstore.CompleteParams{Scope: p.Scope, Key: p.Key, Token: p.Token, Response: resp, TTL: time.Hour, Now: t0}); err != nil {
			t.Fatalf("RecordComplete: %v", err)
		}
		sameRecord(t, s, simple, p.Key, t0)
	}
	sameRecord(t, s, simple, inFlight.Key, t0)

	// The claim statement (its leading column, and the store's time) reads alike too.
	again := claimParams("k-completed-a", t0)
	fast, err := s.RecordClaim(t.Context(), again)
	if err != nil {
		t.Fatal(err)
	}
	slow, err := simple.RecordClaim(t.Context(), again)
	if err != nil {
		t.Fatal(err)
	}
	if fast.Outcome != slow.Outcome || !fast.Now.Equal(t0) || !reflect.DeepEqual(fast, slow) {
		t.Errorf("claim read\n%+v\nwith the simple protocol\n%+v", fast, slow)
	}
}

func sameRecord(t *testing.T, s schemaStore, simple *postgres.Store, key string, now time.Time) {
	t.Helper()
	p := &idemstore.GetParams{Scope: "scope", Key: key, Now: now}
	fast, err := s.RecordGet(t.Context(), p)
	if err != nil {
		t.Fatalf("RecordGet: %v", err)
	}
	slow, err := simple.RecordGet(t.Context(), p)
	if err != nil {
		t.Fatalf("RecordGet with the simple protocol: %v", err)
	}
	if !reflect.DeepEqual(fast, slow) {
		t.Errorf("record %s read\n%+v\nwith the simple protocol\n%+v", key, fast, slow)
	}
	if fast.State == idemstore.StateCompleted && fast.Response == nil {
		t.Errorf("completed record %s has no response", key)
	}
}
