package memory_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/idem-go/idem/admin"
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
		Raw:      rawRecords,
	})
}

// rawRecords returns what the store holds: every record, its response's headers and
// body and its steps included, as the operator's interface reads them.
func rawRecords(t *testing.T, st idemstore.Store) []byte {
	t.Helper()
	s := st.(*memory.Store)
	ctx := context.Background()
	res, err := s.RecordList(ctx, &admin.RecordListParams{Limit: admin.MaxListLimit})
	if err != nil {
		t.Fatal(err)
	}
	var raw []byte
	for _, r := range res.Records {
		got, err := s.RecordInspect(ctx, &admin.RecordInspectParams{Scope: r.Scope, Key: r.Key, Body: true})
		if err != nil {
			t.Fatal(err)
		}
		rec := got.Record
		raw = fmt.Appendf(raw, "%s %s %x %v\n", rec.Scope, rec.Key, rec.Fingerprint.Sum, rec.Header)
		raw = append(append(raw, rec.Body...), rec.Steps...)
	}
	return raw
}

func TestAdminConformance(t *testing.T) {
	t.Parallel()
	admintest.Run(t, admintest.Harness{
		NewStore: func(t *testing.T) admintest.Store { return memory.New() },
	})
}
