package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/netrules"
)

// refreshesPerTimeout is how many times the liveness entry is refreshed
// within one --liveness-timeout: a late or failed refresh or two must not
// hand the VIP back to kube-proxy while the agent is fine.
const refreshesPerTimeout = 4

// livenessInterval is the time between refreshes.
func (a *Agent) livenessInterval() time.Duration {
	return max(a.cfg.LivenessTimeout/refreshesPerTimeout, 250*time.Millisecond)
}

// probeTimeout bounds each health probe, so that a check finishes well
// within the time an entry lives.
func (a *Agent) probeTimeout() time.Duration {
	return min(max(a.cfg.LivenessTimeout/3, 500*time.Millisecond), 3*time.Second)
}

// health returns nil while the agent can stand in for kube-apiserver: its
// certificate is ready and an upstream endpoint is healthy, or it is in
// degraded mode (or deciding whether to enter it). Otherwise it says why
// not. Each family's listener is checked on its own
// (listenerHealth): one family's failure takes only that family's VIPs
// back to kube-proxy.
func (a *Agent) health() error {
	if err := a.switchedOff(); err != nil {
		return err
	}
	if err := a.cert.Ready(); err != nil {
		return fmt.Errorf("serving certificate not ready: %w", err)
	}
	if err := a.up.healthy(); err != nil {
		// Unless this is an outage the pods suffer anyway (degraded.go).
		if err := a.degraded.covers(a.now(), err); err != nil {
			return err
		}
	}
	return a.warmup()
}

// warmup returns nil once the pinned resources have synced, or once
// CacheWarmupTimeout has passed since the run began, whichever is first;
// from then on it always does. Until then the agent does not intercept:
// an agent whose memory limit is too low for the cluster is killed while
// it lists, and a crash loop of such agents must not take the node's
// traffic on every restart.
func (a *Agent) warmup() error {
	if a.warmedUp.Load() || a.pinnedUnsynced == nil {
		return nil
	}
	pending := a.pinnedUnsynced()
	logger := a.logger
	switch {
	case len(pending) == 0:
		logger.Info("Pinned resources synced", "elapsed", a.now().Sub(a.started).Round(time.Millisecond))
	case !a.now().Before(a.started.Add(a.cfg.CacheWarmupTimeout)):
		logger.Info("Intercepting before the pinned resources synced; their reads are forwarded until they do",
			"timeout", a.cfg.CacheWarmupTimeout, "unsynced", pending)
	default:
		return fmt.Errorf("waiting up to %s after start-up for the pinned resources to sync: %s",
			a.cfg.CacheWarmupTimeout, strings.Join(pending, ", "))
	}
	a.warmedUp.Store(true)
	return nil
}

// listenerHealth returns nil while d's listener completes a TLS handshake.
func (a *Agent) listenerHealth(ctx context.Context, d *dataplane) error {
	if err := a.checkListener(ctx, d.listen, a.probeTimeout()); err != nil {
		return fmt.Errorf("%s listener not serving: %w", familyName(d.family), err)
	}
	return nil
}

// familyName names f for messages.
func familyName(f netrules.Family) string {
	if f == netrules.IPv6 {
		return "IPv6"
	}
	return "IPv4"
}

// joinOneLine joins errs into one error whose message is a single line.
func joinOneLine(errs []error) error {
	var err error
	for _, e := range errs {
		if err == nil {
			err = e
		} else {
			err = fmt.Errorf("%w; %w", err, e)
		}
	}
	return err
}

// runLiveness keeps the liveness entries of each active family alive while
// the agent is healthy and that family's listener serves, until ctx ends.
// When the agent turns unhealthy, every entry is deleted at once (new
// connections go to kube-proxy's path); when only one family's listener
// fails, only that family's entries go. Either way a sync is requested,
// which reports not-ready and restores interception once the agent is
// healthy again.
func (a *Agent) runLiveness(ctx context.Context) {
	logger := klog.FromContext(ctx)
	t := time.NewTicker(a.livenessInterval())
	defer t.Stop()
	// lastRefresh is when the entries were last refreshed, zero after a
	// tick that did not refresh them.
	var lastRefresh time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		healthErr := a.health()
		if healthErr == nil && a.syncSawUnhealthy.CompareAndSwap(true, false) {
			// Healthy since the last sync found otherwise (a certificate
			// issued, an upstream back): intercept now rather than at the
			// next sync period.
			a.requestSync()
		}
		// Listeners are checked outside the lock: a handshake takes time.
		listenerErrs := make([]error, len(a.planes))
		if healthErr == nil {
			for i, d := range a.planes {
				listenerErrs[i] = a.listenerHealth(ctx, d)
			}
		}
		if ctx.Err() != nil {
			return
		}
		a.planeMu.Lock()
		if ctx.Err() != nil {
			a.planeMu.Unlock()
			return
		}
		refreshed := false
		switch {
		case healthErr != nil:
			if _, aside := errors.AsType[stepAside](healthErr); aside {
				// On purpose (the kill switch, a configuration that does
				// not match the Service): not a failure to alert on.
				a.interception.liveness.WithLabelValues("stepped-aside").Inc()
			} else {
				a.interception.liveness.WithLabelValues("unhealthy").Inc()
			}
			if _, aside := errors.AsType[stepAside](healthErr); a.Intercepting() == nil && aside {
				logger.Info("Handing the VIP back to kube-proxy", "reason", healthErr.Error())
			} else if a.Intercepting() == nil {
				logger.Error(healthErr, "Agent unhealthy; handing the VIP back to kube-proxy")
			}
			a.clearEntries(logger)
			a.setNotIntercepting(notInterceptingBecause(healthErr))
			a.requestSync()
		case !a.anyActive():
			// Not intercepting (start-up, failed sync or self-check): the
			// sync loop decides when to start again.
			a.interception.liveness.WithLabelValues("skipped").Inc()
		default:
			var errs, down []error
			for i, d := range a.planes {
				switch {
				case !d.active:
					// This family is not intercepted; sync decides.
				case listenerErrs[i] != nil:
					down = append(down, listenerErrs[i])
					if err := d.clear(); err != nil {
						errs = append(errs, err)
					}
				default:
					if err := d.refresh(); err != nil {
						errs = append(errs, err)
					}
				}
			}
			if err := joinOneLine(down); err != nil {
				a.interception.liveness.WithLabelValues("unhealthy").Inc()
				logger.Error(err, "Listener not serving; handing its family's VIPs back to kube-proxy")
				a.setNotIntercepting(fmt.Errorf("unhealthy: %w", err))
				a.requestSync()
			}
			if err := errors.Join(errs...); err != nil {
				a.interception.liveness.WithLabelValues("error").Inc()
				logger.Error(err, "Refreshing the liveness set failed; repairing")
				a.requestSync()
			} else if len(down) == 0 {
				a.interception.liveness.WithLabelValues("refreshed").Inc()
				refreshed = true
			}
		}
		a.planeMu.Unlock()
		if now := a.now(); !refreshed {
			lastRefresh = time.Time{}
		} else {
			if !lastRefresh.IsZero() {
				gap := now.Sub(lastRefresh)
				a.interception.refreshGap.Observe(gap.Seconds())
				if gap >= a.cfg.LivenessTimeout {
					// The entry may have expired meanwhile: connections
					// went to kube-proxy's path for a moment.
					a.lastLapse.Store(now.UnixNano())
				}
			}
			lastRefresh = now
		}
	}
}

// anyActive reports whether some family is intercepted. a.planeMu must be
// held.
func (a *Agent) anyActive() bool {
	for _, d := range a.planes {
		if d.active {
			return true
		}
	}
	return false
}

// clearEntriesLocked takes a.planeMu and deletes every liveness entry.
func (a *Agent) clearEntriesLocked(logger klog.Logger) {
	a.planeMu.Lock()
	defer a.planeMu.Unlock()
	a.clearEntries(logger)
}

// clearEntries deletes every liveness entry; no family is active any more.
// a.planeMu must be held.
func (a *Agent) clearEntries(logger klog.Logger) {
	for _, d := range a.planes {
		if err := d.clear(); err != nil {
			logger.Error(err, "Deleting liveness entries")
		}
	}
}

// requestSync asks the run loop for a sync soon; it never blocks.
func (a *Agent) requestSync() {
	select {
	case a.syncNow <- struct{}{}:
	default:
	}
}
