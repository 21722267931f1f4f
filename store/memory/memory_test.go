package memory_test

import (
	"testing"

	"github.com/idem-go/idem/admin/admintest"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/store/memory"
	"github.com/idem-go/idem/store/storetest"
)

// TestConformance runs the store conformance suite against the in-memory store.
func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, storetest.Harness{
		NewStore: func(*testing.T) idemstore.Store { return memory.New() },
	})
}

func TestAdminConformance(t *testing.T) {
	t.Parallel()
	admintest.Run(t, admintest.Harness{
		NewStore: func(t *testing.T) admintest.Store { return memory.New() },
	})
}
