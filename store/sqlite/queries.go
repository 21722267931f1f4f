package sqlite

import (
	"embed"
	"strings"
)

//go:embed queries/*.sql
var queryFS embed.FS

// The store's SQL, one statement per file in queries/.
var (
	queryMigrationsCreate       = mustQuery("migrations_create")
	queryMigrationsApplied      = mustQuery("migrations_applied")
	queryMigrationsInsert       = mustQuery("migrations_insert")
	queryMigrationsUnknown      = mustQuery("migrations_unknown")
	queryPing                   = mustQuery("ping")
	queryRecordGet              = mustQuery("record_get")
	queryRecordClaimInsert      = mustQuery("record_claim_insert")
	queryRecordTakeOver         = mustQuery("record_take_over")
	queryRecordMarkUnknown      = mustQuery("record_mark_unknown")
	queryRecordComplete         = mustQuery("record_complete")
	queryRecordRelease          = mustQuery("record_release")
	queryRecordReleaseKeep      = mustQuery("record_release_keep")
	queryRecordStep             = mustQuery("record_step")
	queryRecordListResumable    = mustQuery("record_list_resumable")
	queryRecordRenew            = mustQuery("record_renew")
	queryRecordDeleteExp        = mustQuery("record_delete_expired")
	queryRecordDeleteOverflowed = mustQuery("record_delete_overflowed")
	queryRecordCountUnfin       = mustQuery("record_count_unfinished")

	// The operator's interface (admin.go).
	queryAdminListScope       = mustQuery("admin_list_scope")
	queryAdminListAll         = mustQuery("admin_list_all")
	queryAdminDelete          = mustQuery("admin_delete")
	queryAdminDeleteScope     = mustQuery("admin_delete_scope")
	queryAdminCountKept       = mustQuery("admin_count_kept")
	queryAdminListUnfinished  = mustQuery("admin_list_unfinished")
	queryAdminResolveRelease  = mustQuery("admin_resolve_release")
	queryAdminResolveComplete = mustQuery("admin_resolve_complete")
	queryAdminReseal          = mustQuery("admin_reseal")
)

func mustQuery(name string) string {
	b, err := queryFS.ReadFile("queries/" + name + ".sql")
	if err != nil {
		panic("sqlite: missing embedded query " + name)
	}
	return strings.TrimSpace(string(b))
}
