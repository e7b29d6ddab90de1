//go:build integration && !linux

package vllmclient_test

import "syscall"

// sysProcAttr: only Linux can tie a child's life to its parent; elsewhere
// the tests' cleanups stop the children.
func sysProcAttr() *syscall.SysProcAttr { return nil }
