package main

import (
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// setTCPUserTimeout returns a net.Dialer Control function that sets TCP_USER_TIMEOUT
// to d on the socket: how long sent data may stay unacknowledged before the kernel
// drops the connection.
func setTCPUserTimeout(d time.Duration) func(network, address string, c syscall.RawConn) error {
	return func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(d.Milliseconds()))
		})
		if err != nil {
			return err
		}
		return serr
	}
}
