package mysql_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/idem-go/idem/internal/mysqltest"
	"github.com/idem-go/idem/store/mysql"
)

// TestDurabilityWarnsOfEverySettingThatCanLoseACommittedClaim: a claim the client was
// told about must survive a crash of the server or its host; each setting that breaks
// that is named with its fix, and the safe settings say nothing.
func TestDurabilityWarnsOfEverySettingThatCanLoseACommittedClaim(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		d    mysql.Durability
		want []string
	}{
		{"every commit flushed", mysql.Durability{FlushLogAtTrxCommit: 1, SyncBinlog: 1, LogBin: true}, nil},
		{"no binary log", mysql.Durability{FlushLogAtTrxCommit: 1, SyncBinlog: 0, LogBin: false}, nil},
		{"redo log written, flushed each second", mysql.Durability{FlushLogAtTrxCommit: 2, SyncBinlog: 1}, []string{"innodb_flush_log_at_trx_commit = 2", "crash of the host"}},
		{"redo log neither written nor flushed", mysql.Durability{FlushLogAtTrxCommit: 0, SyncBinlog: 1}, []string{"innodb_flush_log_at_trx_commit = 0", "crash of the server"}},
		{"binary log left to the OS", mysql.Durability{FlushLogAtTrxCommit: 1, SyncBinlog: 0, LogBin: true}, []string{"sync_binlog = 0", "set it to 1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := strings.Join(tc.d.Warnings(), "\n")
			if len(tc.want) == 0 && got != "" {
				t.Fatalf("Warnings() = %q, want none", got)
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("Warnings() = %q, want it to say %q", got, w)
				}
			}
		})
	}
}

// TestOpenReadsTheServersDurabilitySettingsAndWarnsOnlyWhenTheyCanLoseAClaim: Open
// reads innodb_flush_log_at_trx_commit, sync_binlog and log_bin, and logs at WARN
// exactly the warnings they call for.
func TestOpenReadsTheServersDurabilitySettingsAndWarnsOnlyWhenTheyCanLoseAClaim(t *testing.T) {
	t.Parallel()
	logs := &recordingHandler{}
	s, err := mysql.Open(context.Background(), mysqltest.Database(t, nil), mysql.Config{Logger: slog.New(logs), DisableCleaner: true, MaxOpenConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d, err := s.Durability(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("server %s: innodb_flush_log_at_trx_commit %d, sync_binlog %d, log_bin %v", d.Version, d.FlushLogAtTrxCommit, d.SyncBinlog, d.LogBin)
	if got, want := len(logs.warnings()), len(d.Warnings()); got != want {
		t.Fatalf("Open logged %d warnings %q, want the %d of %+v", got, logs.warnings(), want, d)
	}
}

// TestDSNsRedactTheirPassword: a URL or a driver DSN never shows its password in
// what the store prints.
func TestDSNsRedactTheirPassword(t *testing.T) {
	t.Parallel()
	for _, dsn := range []string{
		"mysql://app:s3cret@db.example:3306/pay?tls=true",
		"app:s3cret@tcp(db.example:3306)/pay?tls=true",
	} {
		if got := mysql.Redact(dsn); strings.Contains(got, "s3cret") || !strings.Contains(got, "db.example") {
			t.Errorf("Redact(%q) = %q", dsn, got)
		}
		_, err := mysql.Open(context.Background(), dsn+"&timeout=notaduration", mysql.Config{})
		if err == nil || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("Open(%q) = %v, want an error without the password", dsn, err)
		}
	}
}

// TestURLsBecomeTheDriversDSN: mysql://user:pass@host:port/db?params names the same
// server, database and parameters as the driver's own form, port 3306 by default.
func TestURLsBecomeTheDriversDSN(t *testing.T) {
	t.Parallel()
	dc, err := mysql.ParseDSN("mysql://app:p%40ss@db.example/pay?tls=skip-verify&charset=utf8mb4")
	if err != nil {
		t.Fatal(err)
	}
	if dc.User != "app" || dc.Passwd != "p@ss" || dc.Addr != "db.example:3306" || dc.DBName != "pay" || dc.TLSConfig != "skip-verify" {
		t.Fatalf("ParseDSN = %+v", dc)
	}
	if !dc.ClientFoundRows || !dc.InterpolateParams {
		t.Fatalf("ParseDSN left clientFoundRows %v, interpolateParams %v, want both set", dc.ClientFoundRows, dc.InterpolateParams)
	}
}

// recordingHandler keeps the messages of WARN records.
type recordingHandler struct {
	mu   sync.Mutex
	msgs []string
}

func (h *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level == slog.LevelWarn {
		h.mu.Lock()
		h.msgs = append(h.msgs, r.Message)
		h.mu.Unlock()
	}
	return nil
}
func (h *recordingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordingHandler) WithGroup(string) slog.Handler      { return h }

func (h *recordingHandler) warnings() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.msgs...)
}
