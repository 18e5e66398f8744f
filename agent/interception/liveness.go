package interception

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/netrules"
)

// refreshesPerTimeout is how many times the liveness entry is refreshed
// within one --liveness-timeout: a late or failed refresh or two must not
// hand the VIP back to kube-proxy while the agent is fine.
const refreshesPerTimeout = 4

// LivenessInterval is the time between refreshes.
func (c *Config) LivenessInterval() time.Duration {
	return max(c.LivenessTimeout/refreshesPerTimeout, 250*time.Millisecond)
}

// ProbeTimeout bounds each health probe, so that a check finishes well
// within the time an entry lives.
func (c *Config) ProbeTimeout() time.Duration {
	return min(max(c.LivenessTimeout/3, 500*time.Millisecond), 3*time.Second)
}

// health returns nil while the agent may intercept: the kill switch and
// the Service check let it, and it can stand in for kube-apiserver
// (Deps.health). Otherwise it says why not. Each family's
// listener is checked on its own (listenerHealth): one family's failure
// takes only that family's VIPs back to kube-proxy.
func (ic *Interceptor) health() error {
	if err := ic.switchedOff(); err != nil {
		return err
	}
	return ic.deps.Health()
}

// listenerHealth returns nil while d's listener completes a TLS handshake.
func (ic *Interceptor) listenerHealth(ctx context.Context, d *dataplane) error {
	if err := checkListener(ctx, d.listen, ic.cfg.ProbeTimeout()); err != nil {
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
func (ic *Interceptor) runLiveness(ctx context.Context) {
	logger := klog.FromContext(ctx)
	t := time.NewTicker(ic.cfg.LivenessInterval())
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
		healthErr := ic.health()
		if healthErr == nil && ic.syncSawUnhealthy.CompareAndSwap(true, false) {
			// Healthy since the last sync found otherwise (a certificate
			// issued, an upstream back): intercept now rather than at the
			// next sync period.
			ic.RequestSync()
		}
		// Listeners are checked outside the lock: a handshake takes time.
		listenerErrs := make([]error, len(ic.planes))
		if healthErr == nil {
			for i, d := range ic.planes {
				listenerErrs[i] = ic.listenerHealth(ctx, d)
			}
		}
		if ctx.Err() != nil {
			return
		}
		ic.planeMu.Lock()
		if ctx.Err() != nil {
			ic.planeMu.Unlock()
			return
		}
		refreshed := false
		switch {
		case healthErr != nil:
			if _, aside := errors.AsType[stepAside](healthErr); aside {
				// On purpose (the kill switch, a configuration that does
				// not match the Service): not a failure to alert on.
				ic.metrics.liveness.WithLabelValues("stepped-aside").Inc()
			} else {
				ic.metrics.liveness.WithLabelValues("unhealthy").Inc()
			}
			if _, aside := errors.AsType[stepAside](healthErr); ic.Intercepting() == nil && aside {
				logger.Info("Handing the VIP back to kube-proxy", "reason", healthErr.Error())
			} else if ic.Intercepting() == nil {
				logger.Error(healthErr, "Agent unhealthy; handing the VIP back to kube-proxy")
			}
			ic.clearEntries(logger)
			ic.setNotIntercepting(notInterceptingBecause(healthErr))
			ic.RequestSync()
		case !ic.anyActive():
			// Not intercepting (start-up, failed sync or self-check): the
			// sync loop decides when to start again.
			ic.metrics.liveness.WithLabelValues("skipped").Inc()
		default:
			var errs, down []error
			for i, d := range ic.planes {
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
				ic.metrics.liveness.WithLabelValues("unhealthy").Inc()
				logger.Error(err, "Listener not serving; handing its family's VIPs back to kube-proxy")
				ic.setNotIntercepting(fmt.Errorf("unhealthy: %w", err))
				ic.RequestSync()
			}
			if err := errors.Join(errs...); err != nil {
				ic.metrics.liveness.WithLabelValues("error").Inc()
				logger.Error(err, "Refreshing the liveness set failed; repairing")
				ic.RequestSync()
			} else if len(down) == 0 {
				ic.metrics.liveness.WithLabelValues("refreshed").Inc()
				refreshed = true
			}
		}
		ic.planeMu.Unlock()
		if now := ic.now(); !refreshed {
			lastRefresh = time.Time{}
		} else {
			if !lastRefresh.IsZero() {
				gap := now.Sub(lastRefresh)
				ic.metrics.refreshGap.Observe(gap.Seconds())
				if gap >= ic.cfg.LivenessTimeout {
					// The entry may have expired meanwhile: connections
					// went to kube-proxy's path for a moment.
					ic.lastLapse.Store(now.UnixNano())
				}
			}
			lastRefresh = now
		}
	}
}

// anyActive reports whether some family is intercepted. ic.planeMu must be
// held.
func (ic *Interceptor) anyActive() bool {
	for _, d := range ic.planes {
		if d.active {
			return true
		}
	}
	return false
}

// clearEntriesLocked takes ic.planeMu and deletes every liveness entry.
func (ic *Interceptor) clearEntriesLocked(logger klog.Logger) {
	ic.planeMu.Lock()
	defer ic.planeMu.Unlock()
	ic.clearEntries(logger)
}

// clearEntries deletes every liveness entry; no family is active any more.
// ic.planeMu must be held.
func (ic *Interceptor) clearEntries(logger klog.Logger) {
	for _, d := range ic.planes {
		if err := d.clear(); err != nil {
			logger.Error(err, "Deleting liveness entries")
		}
	}
}

// RequestSync asks the run loop for a sync soon; it never blocks.
func (ic *Interceptor) RequestSync() {
	select {
	case ic.syncNow <- struct{}{}:
	default:
	}
}
