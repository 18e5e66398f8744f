package netrules_test

import (
	"os"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// inNewNetNS runs fn on a locked OS thread inside a fresh network namespace
// with loopback up, and deletes the namespace afterwards: nothing the test
// does reaches the machine's own network namespace. Programs fn executes
// from this goroutine (iptables) inherit the namespace. Without root the
// test is skipped, except under CI=true, where it fails.
func inNewNetNS(t *testing.T, fn func(h *netlink.Handle)) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("kernel tests need root; CI must run them")
		}
		t.Skip("kernel tests need root")
	}
	runtime.LockOSThread()
	// The thread's namespace is changed below: never hand it back to the
	// scheduler, so no other goroutine can run in the test namespace.
	origin, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer origin.Close()
	ns, err := netns.New() // creates and enters the namespace
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("creating network namespace: %v", err)
	}
	defer func() {
		if err := netns.Set(origin); err != nil {
			// The thread stays locked and dies with the goroutine.
			t.Errorf("returning to the original namespace: %v", err)
			return
		}
		runtime.UnlockOSThread()
	}()
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		t.Fatal(err)
	}
	fn(h)
}
