package agent

import (
	"context"
	"fmt"
	"time"

	"github.com/kube-apicache/kube-apicache/agent/rewriting"
)

// newRewriting loads the rewrite profiles of RewriteConfigFile and builds
// the filter that applies them, with the agent's reviewer. The checks
// against the cluster wait for Run (checkRewriteProfiles).
func (a *Agent) newRewriting() error {
	if a.cfg.RewriteConfigFile == "" {
		return nil
	}
	profiles, err := rewriting.Load(a.cfg.RewriteConfigFile)
	if err != nil {
		return fmt.Errorf("--rewrite-config: %w", err)
	}
	reviewer, err := a.accessReviewer()
	if err != nil {
		return err
	}
	m, err := rewriting.NewMetrics(a.metrics.registry)
	if err != nil {
		return fmt.Errorf("registering rewriting metrics: %w", err)
	}
	if a.rewriting, err = rewriting.New(rewriting.Options{
		Profiles: profiles.Rewriters,
		Identify: reviewer.Authenticate,
		Metrics:  m,
	}); err != nil {
		return err
	}
	a.rewriteProfiles = profiles
	return nil
}

// checkRewriteProfiles checks the rewrite profiles against the cluster
// before the agent serves anyone; a mistake stops the agent.
func (a *Agent) checkRewriteProfiles(ctx context.Context) error {
	if a.rewriteProfiles == nil {
		return nil
	}
	timeout := a.cfg.UpstreamCheckTimeout
	if timeout <= 0 {
		timeout = time.Minute
	}
	if err := a.rewriteProfiles.CheckAgainstCluster(ctx, a.restConfig(), timeout); err != nil {
		return fmt.Errorf("--rewrite-config: %w", err)
	}
	return nil
}
