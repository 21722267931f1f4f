//go:build !linux

package main

import (
	"syscall"
	"time"
)

// setTCPUserTimeout does nothing where TCP_USER_TIMEOUT is not available: keepalives
// and the stores' own timeouts still bound a connection that stops answering.
func setTCPUserTimeout(time.Duration) func(network, address string, c syscall.RawConn) error {
	return nil
}
