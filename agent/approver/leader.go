package approver

import (
	"context"
	"errors"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

// LeaderElection configures the Lease that makes one approver replica the
// leader. The defaults of kube-controller-manager (15s, 10s, 2s) fit.
type LeaderElection struct {
	// Namespace and Name locate the Lease.
	Namespace, Name string
	// Identity names this replica in the Lease (pod name and a random
	// suffix).
	Identity string
	// LeaseDuration is how long standbys wait after the last renewal
	// before they take over; RenewDeadline how long the leader keeps
	// trying to renew before it gives up; RetryPeriod how often
	// candidates try.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// ErrLostLeadership is returned by RunAsLeader when the lease was lost
// while ctx was still live: the process should exit and start over as a
// standby.
var ErrLostLeadership = errors.New("lost the approver's leader lease")

// RunAsLeader blocks until this replica holds the Lease, runs lead with a
// context that ends when the lease is lost, and returns when ctx ends (the
// lease is then released, so a standby takes over at once) or the lease is
// lost (ErrLostLeadership). client should have a rate limiter of its own,
// so a busy controller cannot delay the renewals. health, if not nil, is
// given a check that fails once the leader has missed renewals.
func RunAsLeader(ctx context.Context, client kubernetes.Interface, le LeaderElection, m *Metrics,
	health *leaderelection.HealthzAdaptor, lead func(context.Context)) error {
	logger := klog.FromContext(ctx)
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: le.Namespace, Name: le.Name},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: le.Identity},
	}
	cfg := leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   le.LeaseDuration,
		RenewDeadline:   le.RenewDeadline,
		RetryPeriod:     le.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            le.Name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				logger.Info("Leading: deciding CSRs", "lease", klog.KRef(le.Namespace, le.Name), "identity", le.Identity)
				m.leader.Set(1)
				lead(ctx)
			},
			OnStoppedLeading: func() {
				m.leader.Set(0)
			},
			OnNewLeader: func(identity string) {
				if identity != le.Identity {
					logger.Info("Standing by", "leader", identity)
				}
			},
		},
	}
	if health != nil {
		cfg.WatchDog = health
	}
	elector, err := leaderelection.NewLeaderElector(cfg)
	if err != nil {
		return fmt.Errorf("leader election: %w", err)
	}
	if health != nil {
		health.SetLeaderElection(elector)
	}
	elector.Run(ctx)
	if ctx.Err() == nil {
		return ErrLostLeadership
	}
	return nil
}
