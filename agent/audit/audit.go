// Package audit records the requests the agent answers itself (reads from
// the node-local cache, and the 403s it sends callers the cache's access
// review denied) as audit.k8s.io/v1 Events, as kube-apiserver would have
// recorded them had they reached it. Forwarded requests are not recorded
// here: kube-apiserver audits them.
//
// It is kube-apiserver's own audit machinery (k8s.io/apiserver): the same
// policy file, the same log and webhook backends, the same flags, and the
// same filters building the events, so an auditor reads the agent's events
// as kube-apiserver's.
package audit

import (
	"errors"
	"fmt"
	"sync"

	"github.com/spf13/pflag"
	"k8s.io/apiserver/pkg/audit"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/options"
	"k8s.io/klog/v2"
)

// Options are kube-apiserver's audit options: a policy file, a log backend
// and a webhook backend. Without a policy file nothing is recorded.
type Options struct {
	options.AuditOptions
}

// NewOptions returns kube-apiserver's audit defaults: no policy (auditing
// off), JSON lines in blocking mode for the log backend, batches for the
// webhook.
func NewOptions() *Options {
	return &Options{AuditOptions: *options.NewAuditOptions()}
}

// AddFlags registers kube-apiserver's audit flags on fs, under the same
// names and with the same defaults (--audit-policy-file, --audit-log-*,
// --audit-webhook-*), so operators reuse their policy and settings.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	o.AuditOptions.AddFlags(fs)
	usage := map[string]string{
		"audit-policy-file": "Path to the audit policy file (kube-apiserver's format). With it, the requests the agent answers itself (cache reads and the 403s of denied callers) are recorded as kube-apiserver would record them; forwarded requests are left to kube-apiserver's audit. Without it nothing is recorded.",
		"audit-log-path":    "If set, the audited requests are logged to this file (mode 0600, rotated). '-' means standard out.",
	}
	for name, text := range usage {
		if f := fs.Lookup(name); f != nil {
			f.Usage = text
		}
	}
}

// Auditor records the requests its Wrap handlers serve. The zero value and
// a nil *Auditor record nothing.
type Auditor struct {
	// Fixed at construction; policy and backend are both nil when
	// auditing is off.
	policy      audit.PolicyRuleEvaluator
	backend     audit.Backend
	longRunning request.LongRunningRequestCheck
	// policyFile is set when a policy was given, even without a backend.
	policyFile string
	// stop ends the backend's workers; Start makes it, Shutdown closes it
	// (once).
	stop     chan struct{}
	shutdown sync.Once
}

// New returns the Auditor o configures: off when o is nil or names no
// policy file, or when the policy has no backend (neither a log path nor
// a webhook), as in kube-apiserver. It opens the log file (creating it
// 0600) and reads the webhook's kubeconfig, but starts nothing: Start does.
// longRunning tells which requests are long-running (watches): those are
// recorded at ResponseStarted too.
func New(o *Options, longRunning request.LongRunningRequestCheck) (*Auditor, error) {
	a := &Auditor{longRunning: longRunning}
	if o == nil {
		return a, nil
	}
	if errs := o.Validate(); len(errs) > 0 {
		return nil, fmt.Errorf("audit options: %w", errors.Join(errs...))
	}
	// ApplyTo fills in only the audit fields of a generic apiserver's
	// configuration (and reads only its egress selector, nil here).
	var c server.Config
	if err := o.ApplyTo(&c); err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	a.policyFile = o.PolicyFile
	if c.AuditPolicyRuleEvaluator != nil && c.AuditBackend != nil {
		a.policy, a.backend = c.AuditPolicyRuleEvaluator, c.AuditBackend
	}
	return a, nil
}

// Enabled reports whether requests are recorded.
func (a *Auditor) Enabled() bool {
	return a != nil && a.backend != nil
}

// Start starts the backend's workers (the buffering of batch mode, the
// webhook's sender). Call it once, before the first request is served.
func (a *Auditor) Start(logger klog.Logger) error {
	if !a.Enabled() {
		if a != nil && a.policyFile != "" {
			logger.Info("An audit policy is set but no audit backend (--audit-log-path or --audit-webhook-config-file); nothing is recorded", "policy", a.policyFile)
		}
		return nil
	}
	a.stop = make(chan struct{})
	if err := a.backend.Run(a.stop); err != nil {
		return fmt.Errorf("starting audit backend %s: %w", a.backend, err)
	}
	logger.Info("Auditing the requests the agent answers itself", "policy", a.policyFile, "backend", a.backend.String())
	return nil
}

// Shutdown stops the backend once it has delivered every event recorded
// so far (a webhook batch may take its retries). Call it after the server
// has stopped serving: events of requests still being served are dropped,
// and reported as audit errors. It does nothing if Start did not run, or
// the second time.
func (a *Auditor) Shutdown() {
	if !a.Enabled() || a.stop == nil {
		return
	}
	a.shutdown.Do(func() {
		close(a.stop)
		a.backend.Shutdown()
	})
}
