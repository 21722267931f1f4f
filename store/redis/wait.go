package redis

import (
	"context"
	"errors"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/idemstore"
)

// ErrNotReplicated is the error (wrapped) of a claim or a renewal that the master made
// but that fewer replicas than [Config.WaitReplicas] acknowledged within
// [Config.WaitTimeout]: a failover before it replicates could lose it. A claim that
// fails so has been given back and its handler does not run; the middleware answers
// 503 store_unavailable with Retry-After.
var ErrNotReplicated = errors.New("not acknowledged by enough replicas")

// Replicated writes: with Config.WaitReplicas set, a script that writes what a
// guarantee rests on (a claim, a renewal, a completion) is followed by
// WAIT numreplicas timeout in the same pipeline, on the same connection. WAIT answers
// how many replicas have acknowledged every write this connection made so far, the
// script's included, so it costs no extra round trip, only the time replication takes.
// (A script cannot call WAIT itself.)

// evalWaited runs script on key, then WAIT, in one pipeline on the connection of the
// master that holds key, and returns the script's reply and how many replicas
// acknowledged it. A Redis that does not know the script (NOSCRIPT) gets it again with
// EVAL. An error of the script is returned as it is (its OOM refusal is the caller's to
// interpret); an error of WAIT alone, which leaves the write's fate unknown, is
// returned too.
func (s *Store) evalWaited(ctx context.Context, script *goredis.Script, key string, args ...any) (*goredis.Cmd, int64, error) {
	var c goredis.Cmdable = s.client
	if cc, ok := s.client.(*goredis.ClusterClient); ok {
		// WAIT names no key, so the cluster client would send it to any node: the
		// pipeline goes to the key's master itself.
		node, err := cc.MasterForKey(ctx, key)
		if err != nil {
			return nil, 0, err
		}
		c = node
	}
	run := func(eval bool) (*goredis.Cmd, *goredis.Cmd) {
		var res *goredis.Cmd
		var acks *goredis.Cmd
		_, _ = c.Pipelined(ctx, func(p goredis.Pipeliner) error {
			if eval {
				res = script.Eval(ctx, p, []string{key}, args...)
			} else {
				res = script.EvalSha(ctx, p, []string{key}, args...)
			}
			// Pipeliner has no Wait method (WAIT blocks its connection), so Do.
			acks = p.Do(ctx, "wait", s.cfg.WaitReplicas, s.cfg.WaitTimeout.Milliseconds())
			return nil
		})
		return res, acks
	}
	res, acks := run(false)
	if goredis.HasErrorPrefix(res.Err(), "NOSCRIPT") {
		res, acks = run(true)
	}
	if err := res.Err(); err != nil {
		return res, 0, err
	}
	n, err := acks.Int64()
	if err != nil {
		return res, 0, fmt.Errorf("WAIT after the write: %w", err)
	}
	return res, n, nil
}

// notReplicated is the error of a write that n replicas acknowledged, fewer than
// WaitReplicas.
func (s *Store) notReplicated(what string, n int64) error {
	return fmt.Errorf("redis store: %s: %w: %d of %d within %v, so a failover could lose it", what, ErrNotReplicated, n, s.cfg.WaitReplicas, s.cfg.WaitTimeout)
}

// giveBackTimeout bounds giving back a claim that its replicas did not acknowledge.
const giveBackTimeout = time.Second

// giveBack undoes a claim that its replicas did not acknowledge, so that its handler
// does not run and the key is free for a retry at once: a fresh record is released
// (deleted), and a record taken over (or re-acquired by a re-sent claim, which may have
// been a takeover) keeps its record id and history, its lease ended now, as a holder
// that died leaves it. Both are fenced by the claim's token. When that fails too, the
// record stays held until its lease lapses, which is safe: nothing ran.
func (s *Store) giveBack(ctx context.Context, key, outcome string, p *idemstore.ClaimParams) error {
	// The claim's context may be nearly spent (WAIT took its time): the give-back
	// has a bound of its own, so that it is tried, and the request still ends soon.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), giveBackTimeout)
	defer cancel()
	var err error
	if outcome == "acquired" {
		err = releaseScript.Run(ctx, s.client, []string{key}, p.Token).Err()
	} else {
		err = renewScript.Run(ctx, s.client, []string{key}, nowArg(p.Now), p.Token, 0, p.TTL.Microseconds(), s.cfg.TTLMargin.Milliseconds()).Err()
	}
	if err != nil {
		return fmt.Errorf("giving the claim back failed too, so the key frees when its %v lease lapses: %w", p.Lease, err)
	}
	return nil
}

// run runs script on key, followed by WAIT when Config.WaitReplicas is set
// ([Store.evalWaited]), and returns its reply and how many replicas acknowledged it
// (0 when nothing waits: no caller compares it then).
func (s *Store) run(ctx context.Context, script *goredis.Script, key string, args ...any) (*goredis.Cmd, int64, error) {
	if s.cfg.WaitReplicas == 0 {
		res := script.Run(ctx, s.client, []string{key}, args...)
		return res, 0, res.Err()
	}
	return s.evalWaited(ctx, script, key, args...)
}

// sliceReply is res's reply as a slice, or err.
func sliceReply(res *goredis.Cmd, err error) ([]any, error) {
	if err != nil {
		return nil, err
	}
	return res.Slice()
}

// intReply is res's reply as an integer, or err.
func intReply(res *goredis.Cmd, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	return res.Int64()
}
