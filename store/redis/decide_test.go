package redis_test

import (
	"crypto/rand"
	"errors"
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/memory"
)

// TestScriptsDecideAsTheStateMachine runs random sequences of claims, completions,
// releases, renewals and reads, at random injected times, against the Redis store and
// against store/memory, which applies idem.Decide in Go, and requires the same answer
// to every call: the Lua scripts make the state machine's decisions.
func TestScriptsDecideAsTheStateMachine(t *testing.T) {
	t.Parallel()
	rs := openStore(t, testenv.RedisURL(t))
	ctx := t.Context()
	fps := []idemstore.Fingerprint{{Version: 1, Sum: [32]byte{1}}, {Version: 1, Sum: [32]byte{2}}, {Version: 2, Sum: [32]byte{3}}}

	rapid.Check(t, func(rt *rapid.T) {
		ms := memory.New()
		scope, key := "scope-"+rand.Text(), "key-"+rand.Text()
		now := time.Now().UTC().Truncate(time.Millisecond)
		var tokens []string
		token := func() string {
			if len(tokens) == 0 || rapid.IntRange(0, 9).Draw(rt, "bogus token") == 0 {
				return "tok-unknown"
			}
			return rapid.SampledFrom(tokens).Draw(rt, "token")
		}
		ttl := func() time.Duration {
			return time.Duration(rapid.IntRange(1, 60).Draw(rt, "ttl s")) * time.Second
		}
		lease := func() time.Duration {
			return time.Duration(rapid.IntRange(1, 30).Draw(rt, "lease s")) * time.Second
		}
		for step := range rapid.IntRange(1, 40).Draw(rt, "steps") {
			now = now.Add(time.Duration(rapid.IntRange(0, 20_000).Draw(rt, "advance ms")) * time.Millisecond)
			what := fmt.Sprintf("step %d", step)
			switch op := rapid.SampledFrom([]string{"claim", "complete", "release", "renew", "get"}).Draw(rt, "op"); op {
			case "claim":
				p := &idemstore.ClaimParams{
					Scope: scope, Key: key, Fingerprint: rapid.SampledFrom(fps).Draw(rt, "fp"),
					Token: fmt.Sprintf("tok-%d", step), RecordID: fmt.Sprintf("rec-%d", step),
					Lease: lease(), TTL: ttl(), Now: now,
				}
				tokens = append(tokens, p.Token)
				want, werr := ms.RecordClaim(ctx, p)
				got, gerr := rs.RecordClaim(ctx, p)
				sameErr(rt, what+" claim", gerr, werr)
				if got.Outcome != want.Outcome || got.TookOver != want.TookOver {
					rt.Fatalf("%s claim: redis %v (took over %v), state machine %v (took over %v)", what, got.Outcome, got.TookOver, want.Outcome, want.TookOver)
				}
				sameRecord(rt, what+" claim", got.Record, want.Record)
			case "complete":
				p := &idemstore.CompleteParams{Scope: scope, Key: key, Token: token(), TTL: ttl(), Now: now,
					Response: &idemstore.Response{Status: 201, Body: []byte(what)}}
				sameErr(rt, what+" complete", rs.RecordComplete(ctx, p), ms.RecordComplete(ctx, p))
			case "release":
				p := &idemstore.ReleaseParams{Scope: scope, Key: key, Token: token()}
				sameErr(rt, what+" release", rs.RecordRelease(ctx, p), ms.RecordRelease(ctx, p))
			case "renew":
				p := &idemstore.RenewParams{Scope: scope, Key: key, Token: token(), Lease: lease(), TTL: ttl(), Now: now}
				got, gerr := rs.RecordRenew(ctx, p)
				want, werr := ms.RecordRenew(ctx, p)
				sameErr(rt, what+" renew", gerr, werr)
				if !got.Equal(want) {
					rt.Fatalf("%s renew: redis lease end %v, state machine %v", what, got, want)
				}
			case "get":
				p := &idemstore.GetParams{Scope: scope, Key: key, Now: now}
				got, gerr := rs.RecordGet(ctx, p)
				want, werr := ms.RecordGet(ctx, p)
				sameErr(rt, what+" get", gerr, werr)
				sameRecord(rt, what+" get", got, want)
			}
		}
	})
}

func sameErr(t *rapid.T, what string, got, want error) {
	if (got == nil) != (want == nil) || (want != nil && !errors.Is(got, want)) {
		t.Fatalf("%s: redis error %v, state machine error %v", what, got, want)
	}
}

func sameRecord(t *rapid.T, what string, got, want *idemstore.Record) {
	if got == nil || want == nil {
		if got != want {
			t.Fatalf("%s: redis record %+v, state machine record %+v", what, got, want)
		}
		return
	}
	g, w := *got, *want
	if g.State == idemstore.StateCompleted { // a completed record has no lease
		g.LeaseEnd, w.LeaseEnd = time.Time{}, time.Time{}
	}
	if !g.Response.Equal(w.Response) {
		t.Fatalf("%s: redis response %+v, state machine %+v", what, g.Response, w.Response)
	}
	g.Response, w.Response = nil, nil
	if g.ID != w.ID || g.State != w.State || g.Token != w.Token || g.Fingerprint != w.Fingerprint ||
		!g.LeaseEnd.Equal(w.LeaseEnd) || !g.CreatedAt.Equal(w.CreatedAt) || !g.ExpiresAt.Equal(w.ExpiresAt) ||
		g.Scope != w.Scope || g.Key != w.Key {
		t.Fatalf("%s: redis record %+v, state machine record %+v", what, g, w)
	}
}
