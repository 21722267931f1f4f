//go:build linux

package redistest

import "syscall"

// procAttr makes the kernel kill a server when the test binary dies, so that a crashed
// test leaves no redis-server behind.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
