package mysql

import "testing"

// MigrationCount is the number of embedded migrations.
func MigrationCount(t testing.TB) int {
	t.Helper()
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	return len(ms)
}
