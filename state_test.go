package idem

import (
	"testing"
	"time"

	"github.com/idem-go/idem/idemstore"
)

func TestDecideFollowsTheStateMachine(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	fp := Fingerprint{Version: idemstore.FingerprintVersion, Sum: [32]byte{1}}
	other := Fingerprint{Version: idemstore.FingerprintVersion, Sum: [32]byte{2}}
	oldVersion := Fingerprint{Version: idemstore.FingerprintVersion - 1, Sum: [32]byte{3}}
	inFlight := func(leaseEnd, expires time.Time, f Fingerprint) *idemstore.Record {
		return &idemstore.Record{State: idemstore.StateInFlight, Token: "t", Fingerprint: f, LeaseEnd: leaseEnd, ExpiresAt: expires}
	}
	completed := func(expires time.Time, f Fingerprint) *idemstore.Record {
		return &idemstore.Record{State: idemstore.StateCompleted, Fingerprint: f, ExpiresAt: expires, Response: &Response{Status: 201}}
	}
	later, earlier := now.Add(time.Minute), now.Add(-time.Minute)
	tests := []struct {
		name string
		rec  *idemstore.Record
		fp   Fingerprint
		want idemstore.Decision
	}{
		{"absent record is claimed", nil, fp, idemstore.DecideClaim},
		{"expired completed record counts as absent", completed(earlier, fp), fp, idemstore.DecideClaim},
		{"record expiring exactly now counts as absent", completed(now, fp), other, idemstore.DecideClaim},
		{"expired in-flight record with other fingerprint is claimed", inFlight(earlier, earlier, other), fp, idemstore.DecideClaim},
		{"live lease answers in flight", inFlight(later, later, fp), fp, idemstore.DecideInFlight},
		{"lapsed lease is taken over", inFlight(earlier, later, fp), fp, idemstore.DecideTakeOver},
		{"lease ending exactly now is lapsed", inFlight(now, later, fp), fp, idemstore.DecideTakeOver},
		{"completed record is replayed", completed(later, fp), fp, idemstore.DecideReplay},
		{"completed record with other fingerprint is a mismatch", completed(later, fp), other, idemstore.DecideMismatch},
		{"live in-flight record with other fingerprint is a mismatch", inFlight(later, later, fp), other, idemstore.DecideMismatch},
		{"lapsed in-flight record with other fingerprint is a mismatch", inFlight(earlier, later, fp), other, idemstore.DecideMismatch},
		{"fingerprints of different versions match", completed(later, oldVersion), fp, idemstore.DecideReplay},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := idemstore.Decide(tt.rec, tt.fp, now); got != tt.want {
				t.Errorf("Decide = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestHeldByNeedsTheTokenAndAnInFlightRecord(t *testing.T) {
	t.Parallel()
	now := time.Now()
	tests := []struct {
		name  string
		rec   idemstore.Record
		token string
		want  bool
	}{
		{"holder with live lease", idemstore.Record{State: idemstore.StateInFlight, Token: "a", LeaseEnd: now.Add(time.Second)}, "a", true},
		{"holder with lapsed lease nobody took over", idemstore.Record{State: idemstore.StateInFlight, Token: "a", LeaseEnd: now.Add(-time.Second)}, "a", true},
		{"other token", idemstore.Record{State: idemstore.StateInFlight, Token: "a"}, "b", false},
		{"empty token never holds", idemstore.Record{State: idemstore.StateInFlight, Token: ""}, "", false},
		{"completed record is held by nobody", idemstore.Record{State: idemstore.StateCompleted, Token: "a"}, "a", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.rec.HeldBy(tt.token); got != tt.want {
				t.Errorf("HeldBy = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestExpiryKeepsInFlightRecordsUntilTheLeaseEnds(t *testing.T) {
	t.Parallel()
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if got := idemstore.InFlightExpiresAt(created, time.Hour, created.Add(2*time.Hour)); !got.Equal(created.Add(2 * time.Hour)) {
		t.Errorf("lease beyond ttl: expires %v, want lease end", got)
	}
	if got := idemstore.InFlightExpiresAt(created, time.Hour, created.Add(time.Minute)); !got.Equal(created.Add(time.Hour)) {
		t.Errorf("lease within ttl: expires %v, want created+ttl", got)
	}
	if got := idemstore.CompletedExpiresAt(created, time.Hour); !got.Equal(created.Add(time.Hour)) {
		t.Errorf("completed: expires %v, want created+ttl", got)
	}
	rec := idemstore.Record{State: idemstore.StateInFlight, LeaseEnd: created.Add(time.Minute), ExpiresAt: created.Add(time.Hour)}
	if rec.Expired(created.Add(59*time.Minute)) || !rec.Expired(created.Add(time.Hour)) {
		t.Error("Expired must turn true exactly at ExpiresAt")
	}
	if !rec.LeaseLive(created) || rec.LeaseLive(created.Add(time.Minute)) {
		t.Error("LeaseLive must turn false exactly at LeaseEnd")
	}
}
