// Package metricsserver is the HTTPS listener that serves a component's
// /metrics, its health paths and, when asked, /debug/pprof/: the agent's
// (agent/status, on --metrics-bind-address) and the approver's. It owns the
// listener's certificate (files reloaded as they change, else self-signed)
// and who may read what on it: every request is authenticated
// (TokenReview) and authorized (SubjectAccessReview) through
// kube-apiserver, as kube-scheduler and kube-controller-manager do on
// their secure ports, cached and budgeted, except the open paths, which
// the kubelet probes anonymously.
//
// It must not decide what the paths answer: the caller hands it a handler
// that serves them and checks no credentials. A caller's token goes
// nowhere but into a TokenReview, and is never logged.
package metricsserver
