// Package interception decides whether the node's traffic to the
// kubernetes Service VIPs reaches the agent, and keeps the node in that
// state: the redirect policy over netrules.
//
// It picks the dataplane (iptables or nftables) and writes the redirect
// in it, keeps the kernel's dead-man switch (the liveness set) alive while
// the agent may stand in for kube-apiserver, checks that the redirect
// takes effect for the node (the self-check) and for its pods (the
// pod-path check), tells this node's pod traffic from traffic routed in
// (detect-local), follows the kill switch and the kubernetes Service, and
// removes what it or a dead predecessor left on the node.
//
// It must not serve, forward or cache requests, hold an upstream
// connection, or read a caller's credentials: what it needs to know of
// the rest of the agent comes through Deps, one func or gauge each, and
// its only way into the listener is Probes. It fails open: any state it
// cannot vouch for goes back to kube-proxy's path.
package interception
