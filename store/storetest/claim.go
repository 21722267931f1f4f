package storetest

import (
	"testing"
)

func init() {
	register(
		testCase{"PingAnswers", testPingAnswers},
	)
}

func testPingAnswers(t *testing.T, h Harness) {
	b := setup(t, h)
	if err := b.s.Ping(b.ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
}
