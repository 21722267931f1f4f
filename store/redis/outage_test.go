package redis_test

import (
	"context"
	"crypto/rand"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/store/redis/redistest"
)

// TestClaimsFailWhileRedisIsDownAndRecoverWithoutReopening stops a private Redis under
// an open store: claims fail with an error that is neither ErrNotFound nor
// ErrLeaseLost (the middleware answers 503), and once Redis is back on the same port
// the same store serves claims again.
func TestClaimsFailWhileRedisIsDownAndRecoverWithoutReopening(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	s := openStore(t, srv.URL())
	ctx := t.Context()
	claim := func() error {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := s.RecordClaim(ctx, claimParams("scope", "key-"+rand.Text(), time.Time{}))
		return err
	}
	if err := claim(); err != nil {
		t.Fatalf("claim before the outage: %v", err)
	}

	srv.Kill()
	err := claim()
	if err == nil {
		t.Fatal("claim succeeded while Redis was down")
	}
	if errors.Is(err, idemstore.ErrNotFound) || errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("claim while Redis was down: err = %v, want a store error, not ErrNotFound or ErrLeaseLost", err)
	}
	if err := s.Ping(ctx); err == nil {
		t.Fatal("Ping succeeded while Redis was down")
	}

	srv.Restart()
	if err := claim(); err != nil {
		t.Fatalf("claim after Redis came back: %v", err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping after Redis came back: %v", err)
	}
}

// TestRestartWithoutPersistenceLosesRecords shows what the docs warn about: a Redis
// restarted without persistence has forgotten a completed record, so a retry of its
// request would execute again (unless a database backstop refuses it).
func TestRestartWithoutPersistenceLosesRecords(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	s := openStore(t, srv.URL())
	ctx := t.Context()
	p := claimParams("scope", "key-"+rand.Text(), time.Time{})
	if _, err := s.RecordClaim(ctx, p); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordComplete(ctx, &idemstore.CompleteParams{Scope: p.Scope, Key: p.Key, Token: p.Token, Response: &idemstore.Response{Status: 201}, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	srv.Restart()
	retry := *p
	retry.Token, retry.RecordID = "tok-retry", "rec-retry"
	res, err := s.RecordClaim(ctx, &retry)
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != idemstore.ClaimAcquired {
		t.Fatalf("retry after a restart without persistence = %v; this test documents that it is acquired", res.Outcome)
	}
}
