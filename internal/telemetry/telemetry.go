// Package telemetry holds what the Prometheus (idemprom) and OpenTelemetry (idemotel)
// adapters of idem.Observer share: how an event's error becomes a label value, so that
// both name the same things alike.
package telemetry

import (
	"context"
	"errors"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
)

// The values of an error label (ErrorKind).
const (
	ErrLeaseLost = "lease_lost" // the key was no longer held (taken over)
	ErrTimeout   = "timeout"    // the call's deadline passed
	ErrCanceled  = "canceled"   // the call's context was cancelled
	ErrOther     = "error"      // any other failure
)

// The values of a release's result label (ReleaseResult).
const (
	ReleaseReleased = "released" // the key was released
	ReleaseNotHeld  = "not_held" // taken over, or completed by a SPEC §7 transaction
	ReleaseError    = "error"    // the store failed; the key frees when its lease lapses
)

// ErrorKind classifies a non-nil err for a label: lease_lost, timeout, canceled or
// error. It never returns the error's text, which may hold anything.
func ErrorKind(err error) string {
	switch {
	case errors.Is(err, idem.ErrLeaseLost):
		return ErrLeaseLost
	case errors.Is(err, context.DeadlineExceeded):
		return ErrTimeout
	case errors.Is(err, context.Canceled):
		return ErrCanceled
	}
	return ErrOther
}

// StoreFailed reports whether a store call's error is a failure of the store, rather
// than one of its answers (the key is no longer held, or absent).
func StoreFailed(err error) bool {
	return err != nil && !errors.Is(err, idem.ErrLeaseLost) && !errors.Is(err, idemstore.ErrNotFound)
}

// ReleaseResult is the result label of a release that ended with err.
func ReleaseResult(err error) string {
	switch {
	case err == nil:
		return ReleaseReleased
	case errors.Is(err, idem.ErrLeaseLost):
		return ReleaseNotHeld
	}
	return ReleaseError
}
