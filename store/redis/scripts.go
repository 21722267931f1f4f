package redis

import (
	_ "embed"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// Each state change is one Lua script, so Redis runs the read, the decision and the
// write atomically: no other client acts in between, and no check-then-set crosses the
// network. Scripts run with EVALSHA and fall back to EVAL when Redis does not know the
// script (after a restart, a failover or SCRIPT FLUSH).
//
// Every script starts with a Redis 7 shebang line that declares its flags, which
// decide what Redis does when its used memory is above maxmemory: the claim (no
// flags) is refused before it runs, the fenced completion, release and renewal
// (allow-oom) always run, and the read (no-writes) always runs. Without flags Redis
// would check memory only at a script's first write, and the claim, whose first write
// is a DEL, would go through while the completion was refused.

//go:embed lua/prelude.lua
var prelude string

//go:embed lua/claim.lua
var claimSrc string

//go:embed lua/complete.lua
var completeSrc string

//go:embed lua/release.lua
var releaseSrc string

//go:embed lua/renew.lua
var renewSrc string

//go:embed lua/get.lua
var getSrc string

//go:embed lua/inspect.lua
var inspectSrc string

//go:embed lua/delete.lua
var deleteSrc string

//go:embed lua/resolve.lua
var resolveSrc string

var (
	claimScript    = newScript(claimSrc)
	completeScript = newScript(completeSrc)
	releaseScript  = newScript(releaseSrc)
	renewScript    = newScript(renewSrc)
	getScript      = newScript(getSrc)
	inspectScript  = newScript(inspectSrc)
	deleteScript   = newScript(deleteSrc)
	resolveScript  = newScript(resolveSrc)
)

// newScript puts the prelude after the script's shebang, which Redis reads only on
// the first line.
func newScript(src string) *goredis.Script {
	shebang, body, _ := strings.Cut(src, "\n")
	if !strings.HasPrefix(shebang, "#!lua") {
		panic("redis store: an embedded script does not start with its #!lua flags line")
	}
	return goredis.NewScript(shebang + "\n" + prelude + "\n" + body)
}
