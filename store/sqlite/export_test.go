package sqlite

import "testing"

// ClaimSynchronous returns PRAGMA synchronous on the connection that writes claims.
func ClaimSynchronous(t *testing.T, s *Store) int {
	t.Helper()
	var n int
	if err := s.claimDB.QueryRow(`PRAGMA synchronous`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
