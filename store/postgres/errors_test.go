package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"

	"github.com/idem-go/idem/idemstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

func pgErr(code string) error {
	return fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: code, Message: "m"})
}

func TestInterpretErrorNormalisesAtTheEdge(t *testing.T) {
	tests := []struct {
		name string
		in   error
		is   error // errors.Is(out, is)
		not  []error
	}{
		{"no rows is not found", pgx.ErrNoRows, idemstore.ErrNotFound, []error{ErrUnavailable}},
		{"fence raise is lease lost", pgErr(sqlstateLeaseLost), idemstore.ErrLeaseLost, []error{ErrUnavailable}},
		{"connection failure is unavailable", pgErr("08006"), ErrUnavailable, []error{idemstore.ErrNotFound, idemstore.ErrLeaseLost}},
		{"too many clients is unavailable", pgErr("53300"), ErrUnavailable, nil},
		{"admin shutdown is unavailable", pgErr("57P01"), ErrUnavailable, nil},
		{"a non-server error is unavailable", errors.New("dial tcp: connection refused"), ErrUnavailable, nil},
		{"a prepared statement a pooler lost is unavailable", pgErr("26000"), ErrUnavailable, nil},
		{"a prepared statement a pooler doubled is unavailable", pgErr("42P05"), ErrUnavailable, nil},
		{"context cancellation passes through", context.Canceled, context.Canceled, []error{ErrUnavailable}},
		{"own timeout passes through", context.DeadlineExceeded, context.DeadlineExceeded, []error{ErrUnavailable}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := interpretError(tt.in)
			if !errors.Is(out, tt.is) {
				t.Errorf("interpretError(%v) = %v, want it to be %v", tt.in, out, tt.is)
			}
			for _, n := range tt.not {
				if errors.Is(out, n) {
					t.Errorf("interpretError(%v) = %v, must not be %v", tt.in, out, n)
				}
			}
		})
	}
	for _, code := range []string{"23505", "42P01", "57014", "40001"} {
		if out := interpretError(pgErr(code)); errors.Is(out, ErrUnavailable) || errors.Is(out, idemstore.ErrNotFound) || errors.Is(out, idemstore.ErrLeaseLost) {
			t.Errorf("interpretError(SQLSTATE %s) = %v, want a plain error", code, out)
		}
	}
	if interpretError(nil) != nil {
		t.Error("interpretError(nil) != nil")
	}
}

func TestWithRetryRetriesOnlyWhatCertainlyDidNotHappen(t *testing.T) {
	s := &Store{logger: slog.New(slog.DiscardHandler)}
	tests := []struct {
		name  string
		err   error
		calls int
	}{
		{"serialization failure is retried", pgErr("40001"), maxStatementAttempts},
		{"deadlock is retried", pgErr("40P01"), maxStatementAttempts},
		{"unique violation is not", pgErr("23505"), 1},
		{"a lost connection is not: the outcome is unknown", errors.New("unexpected EOF"), 1},
		{"a lease lost is not", idemstore.ErrLeaseLost, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			calls := 0
			err := s.withRetry(t.Context(), "test", func() error { calls++; return tt.err })
			if calls != tt.calls || !errors.Is(err, tt.err) {
				t.Errorf("withRetry made %d calls returning %v, want %d returning the error", calls, err, tt.calls)
			}
		})
	}
	calls := 0
	err := s.withRetry(t.Context(), "test", func() error {
		if calls++; calls == 1 {
			return pgErr("40P01")
		}
		return nil
	})
	if err != nil || calls != 2 {
		t.Errorf("a deadlock victim that succeeds on retry: %d calls, %v", calls, err)
	}
}
