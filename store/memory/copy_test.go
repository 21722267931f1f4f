package memory_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/memory"
)

// TestStoredResponseDoesNotAliasCallerSlices checks the copy-in/copy-out promise: the
// caller's later writes to the response it completed with, or to a record it read, never
// reach the stored record.
func TestStoredResponseDoesNotAliasCallerSlices(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := memory.New()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	fp := idem.Fingerprint{Version: idem.FingerprintVersion, Sum: [32]byte{1}}
	if _, err := s.RecordClaim(ctx, &idem.RecordClaimParams{
		Scope: "s", Key: "k", Fingerprint: fp, Token: "t", RecordID: "r",
		Lease: time.Minute, TTL: time.Hour, Now: now,
	}); err != nil {
		t.Fatal(err)
	}
	resp := &idem.Response{Status: 201, Header: http.Header{"Content-Type": {"a/b"}}, Body: []byte("body")}
	if err := s.RecordComplete(ctx, &idem.RecordCompleteParams{Scope: "s", Key: "k", Token: "t", Response: resp, TTL: time.Hour, Now: now}); err != nil {
		t.Fatal(err)
	}
	resp.Body[0] = 'X'
	resp.Header["Content-Type"][0] = "x/y"

	get := func() *idem.Record {
		rec, err := s.RecordGet(ctx, &idem.RecordGetParams{Scope: "s", Key: "k", Now: now})
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}
	rec := get()
	want := &idem.Response{Status: 201, Header: http.Header{"Content-Type": {"a/b"}}, Body: []byte("body")}
	if !rec.Response.Equal(want) {
		t.Fatalf("stored response changed by the caller's writes: %+v", rec.Response)
	}
	rec.Response.Body[0] = 'Y'
	rec.Response.Header.Set("Content-Type", "y/z")
	if !get().Response.Equal(want) {
		t.Fatal("stored response changed through a record read from the store")
	}
}
