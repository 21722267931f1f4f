package idem_test

import (
	"testing"

	"github.com/idem-go/idem"
)

func TestDefaultStorePolicyReleasesRetryableStatuses(t *testing.T) {
	t.Parallel()
	released := []int{400, 401, 403, 404, 408, 409, 413, 415, 422, 425, 429, 500, 501, 502, 503, 504, 599}
	stored := []int{200, 201, 202, 204, 301, 302, 303, 304, 307, 402, 405, 406, 410, 411, 412, 418, 451}
	for _, s := range released {
		if idem.DefaultStorePolicy(s) {
			t.Errorf("status %d is stored, want released", s)
		}
	}
	for _, s := range stored {
		if !idem.DefaultStorePolicy(s) {
			t.Errorf("status %d is released, want stored", s)
		}
	}
}
