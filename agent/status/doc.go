// Package status is the agent's metrics and status listener: the HTTPS
// server on --metrics-bind-address that serves /metrics, the health paths
// (/healthz, /livez, /readyz, /intercepting), /statusz and, with
// --profiling, /debug/pprof/. It decides what those paths answer, the
// Status the status command reads, and kube_apicache_build_info; the
// listener under them (its certificate, files reloaded as they change,
// else self-signed, and who may read what: TokenReview and
// SubjectAccessReview through kube-apiserver, cached and budgeted; the
// health paths open to anyone, /statusz and /metrics to callers RBAC
// allows, whose token may also come in TokenHeader through kube-apiserver's
// pods proxy) is agent/internal/metricsserver,
// which the approver's listener shares.
//
// It must not decide the agent's health, readiness or interception, nor
// reach the interceptor, the upstream set or the serving chain: what it
// reports of them comes through Checks, one func or fixed string each, and
// the metrics it serves from the registry it is given. A caller's token
// goes nowhere but into a TokenReview, and is never logged.
package status
