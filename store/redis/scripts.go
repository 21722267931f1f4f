package redis

import (
	_ "embed"

	goredis "github.com/redis/go-redis/v9"
)

// Each state change is one Lua script, so Redis runs the read, the decision and the
// write atomically: no other client acts in between, and no check-then-set crosses the
// network. Scripts run with EVALSHA and fall back to EVAL when Redis does not know the
// script (after a restart, a failover or SCRIPT FLUSH).

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

var (
	claimScript    = newScript(claimSrc)
	completeScript = newScript(completeSrc)
	releaseScript  = newScript(releaseSrc)
	renewScript    = newScript(renewSrc)
	getScript      = newScript(getSrc)
)

func newScript(src string) *goredis.Script {
	return goredis.NewScript(prelude + "\n" + src)
}
