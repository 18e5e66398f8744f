package rewriting

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/agent/apis/rewrite/v1alpha1"
	"github.com/kube-apicache/kube-apicache/agent/rewrite"
)

// Profiles are the loaded rewrite profiles of one configuration file.
type Profiles struct {
	// Path is the file they came from, for errors.
	Path string
	// Config is the file's content, defaulted and valid on its own.
	Config *v1alpha1.RewriteConfiguration
	// Rewriters are the profiles' rewriters.
	Rewriters rewrite.Profiles
}

// Load reads the RewriteConfiguration at path and checks it on its own,
// one error per mistake; the checks against the cluster are
// CheckAgainstCluster's.
func Load(path string) (*Profiles, error) {
	c, err := v1alpha1.Load(path)
	if err != nil {
		return nil, err
	}
	if errs := v1alpha1.Validate(c, nil); len(errs) > 0 {
		return nil, fmt.Errorf("%s: %w", path, errs.ToAggregate())
	}
	rws, err := rewrite.NewProfiles(c)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &Profiles{Path: path, Config: c, Rewriters: rws}, nil
}

// CheckAgainstCluster checks the profiles against what the cluster
// serves (LookUpGroups), asking with cfg: a rename onto a group
// kube-apiserver serves itself, or onto one the profile's callers have no
// rights on, is an error. Failing to ask is retried until timeout.
func (p *Profiles) CheckAgainstCluster(ctx context.Context, cfg *rest.Config, timeout time.Duration) error {
	logger := klog.FromContext(ctx)
	var groups *ClusterGroups
	var lastErr error
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		groups, lastErr = LookUpGroups(ctx, cfg, p.Config)
		if lastErr != nil {
			logger.Info("Looking up the rewrite profiles' groups failed; retrying", "err", lastErr)
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%s: checking the profiles against the cluster: %w", p.Path, errors.Join(err, lastErr))
	}
	if errs := v1alpha1.Validate(p.Config, groups); len(errs) > 0 {
		return fmt.Errorf("%s: %w", p.Path, errs.ToAggregate())
	}
	names := make([]string, 0, len(p.Config.Profiles))
	for _, pr := range p.Config.Profiles {
		names = append(names, pr.Name)
	}
	logger.Info("Rewrite profiles checked against the cluster", "profiles", names)
	return nil
}
