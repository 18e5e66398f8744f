package netrules_test

import (
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/kube-apicache/kube-apicache/netrules/netnstest"
)

// inNewNetNS runs fn on a locked OS thread inside a fresh network namespace
// with loopback up, deleted afterwards (see netnstest.Run).
func inNewNetNS(t *testing.T, fn func(h *netlink.Handle)) {
	t.Helper()
	netnstest.Run(t, 1, func(_ []netns.NsHandle, hs []*netlink.Handle) { fn(hs[0]) })
}
