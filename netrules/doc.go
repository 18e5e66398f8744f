// Package netrules is the mechanism that talks to the kernel: iptables chains
// and jumps, and addresses on links. It knows how to make the kernel's state
// match a description, idempotently, and how to remove it again. It does not
// decide which rules to install for which Service VIP: that is the caller's
// policy (see package agent).
//
// Every kernel-facing dependency is behind a narrow interface (IPTables,
// Netlink) that the real go-iptables and netlink types satisfy, so the logic
// here is tested without root against the stateful fakes in
// netrules/testing.
package netrules
