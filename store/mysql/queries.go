package mysql

import (
	"embed"
	"strings"
)

//go:embed queries/*.sql
var queryFS embed.FS

// The store's SQL, one statement per file in queries/ (a record's columns, and a
// listed record's, in files of their own that the reads share).
var (
	queryMigrationsCreate  = mustQuery("migrations_create")
	queryMigrationsApplied = mustQuery("migrations_applied")
	queryMigrationsInsert  = mustQuery("migrations_insert")
	queryMigrationsUnknown = mustQuery("migrations_unknown")
	queryDurability        = mustQuery("durability")

	queryRecordGet           = mustQuery("record_columns") + "\n" + mustQuery("record_get")
	queryRecordLock          = mustQuery("record_columns") + "\n" + mustQuery("record_lock")
	queryRecordClaimInsert   = mustQuery("record_claim_insert")
	queryRecordClaimReplace  = mustQuery("record_claim_replace")
	queryRecordTakeOver      = mustQuery("record_take_over")
	queryRecordMarkUnknown   = mustQuery("record_mark_unknown")
	queryRecordComplete      = mustQuery("record_complete")
	queryRecordRelease       = mustQuery("record_release")
	queryRecordReleaseKeep   = mustQuery("record_release_keep")
	queryRecordStep          = mustQuery("record_step")
	queryRecordListResumable = mustQuery("record_list_resumable")
	queryRecordRenew         = mustQuery("record_renew")
	queryRecordDeleteExp     = mustQuery("record_delete_expired")
	queryRecordCountUnfin    = mustQuery("record_count_unfinished")

	// The operator's interface (admin.go).
	queryAdminListScope       = mustQuery("admin_list_columns") + "\n" + mustQuery("admin_list_scope")
	queryAdminListAll         = mustQuery("admin_list_columns") + "\n" + mustQuery("admin_list_all")
	queryAdminListUnfinished  = mustQuery("admin_list_columns") + "\n" + mustQuery("admin_list_unfinished")
	queryAdminDelete          = mustQuery("admin_delete")
	queryAdminDeleteScope     = mustQuery("admin_delete_scope")
	queryAdminCountKept       = mustQuery("admin_count_kept")
	queryAdminResolveRelease  = mustQuery("admin_resolve_release")
	queryAdminResolveComplete = mustQuery("admin_resolve_complete")
	queryAdminReseal          = mustQuery("admin_reseal")
)

// mustQuery returns the statement of queries/name.sql without its leading comment
// lines, which would otherwise travel to the server with every statement.
func mustQuery(name string) string {
	b, err := queryFS.ReadFile("queries/" + name + ".sql")
	if err != nil {
		panic("mysql: missing embedded query " + name)
	}
	var lines []string
	for line := range strings.SplitSeq(string(b), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "--") {
			continue
		}
		lines = append(lines, line)
	}
	return strings.TrimSpace(strings.Join(lines, "\n"))
}
