// Package degraded decides when the agent is in degraded mode: no
// kube-apiserver endpoint has answered for a short while, and kube-proxy's
// own path to the Service VIP fails too, so handing the VIP back to
// kube-proxy would gain the pods nothing.
//
// It reads the upstream set's health and probes kube-proxy's path; it
// must not answer requests itself: the serving chain fails fast and the
// cache recalls decisions while Active says so.
package degraded
