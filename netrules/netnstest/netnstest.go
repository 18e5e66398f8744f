// Package netnstest runs kernel tests inside network namespaces they
// create and delete, so that nothing they do reaches the machine's own
// network namespace.
package netnstest

import (
	"os"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// RequireRoot skips the test without root, except under CI=true, where it
// fails: CI must run the kernel tests.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("kernel tests need root; CI must run them")
	}
	t.Skip("kernel tests need root")
}

// Run runs fn on a locked OS thread inside the last of n fresh network
// namespaces (n ≥ 1), each with loopback up, and deletes them all
// afterwards. fn gets the namespaces and a netlink handle in each, in
// creation order. Programs fn executes from this goroutine (iptables)
// inherit the thread's namespace. Without root the test is skipped, except
// under CI=true.
func Run(t testing.TB, n int, fn func(nss []netns.NsHandle, hs []*netlink.Handle)) {
	t.Helper()
	RequireRoot(t)
	runtime.LockOSThread()
	// The thread's namespace changes below: it is unlocked only once back
	// in the original namespace, so no other goroutine ever runs in a test
	// namespace (otherwise the locked thread dies with the goroutine).
	origin, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	defer origin.Close()
	defer func() {
		if err := netns.Set(origin); err != nil {
			t.Errorf("returning to the original namespace: %v", err)
			return
		}
		runtime.UnlockOSThread()
	}()
	nss := make([]netns.NsHandle, 0, n)
	hs := make([]*netlink.Handle, 0, n)
	defer func() {
		for _, h := range hs {
			h.Close()
		}
		for _, ns := range nss {
			ns.Close()
		}
	}()
	for range n {
		ns, err := netns.New() // creates and enters
		if err != nil {
			t.Fatalf("creating a network namespace: %v", err)
		}
		nss = append(nss, ns)
		h, err := netlink.NewHandleAt(ns)
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, h)
		lo, err := h.LinkByName("lo")
		if err == nil {
			err = h.LinkSetUp(lo)
		}
		if err != nil {
			t.Fatalf("bringing up loopback: %v", err)
		}
	}
	fn(nss, hs)
}
