package main

import (
	"testing"

	"github.com/idem-go/idem/examples/internal/exampletest"
)

// The example, served on a loopback port, replays a duplicate POST (same status and
// body, Idempotent-Replayed: true) and charges once.
func TestADuplicateChargeIsReplayed(t *testing.T) {
	exampletest.CheckHandler(t, newHandler)
}
