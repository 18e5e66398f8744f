package agent

import (
	"strings"
	"testing"
	"time"
)

// TestWarmup: until the pinned resources have synced the agent cannot
// stand in for kube-apiserver (an agent killed while it lists them must
// never have taken the node's traffic), and says why; once they have, it
// can, for good: a later relist does not take the traffic away. A warm-up
// that timed out lets the agent intercept with resources still unsynced.
func TestWarmup(t *testing.T) {
	cfg := &Config{CacheWarmupTimeout: time.Hour}
	pending := []string{"services"}
	start := time.Now()
	w := &warmup{started: start, pinnedUnsynced: func() []string { return pending }}

	if err := w.wait(cfg, start.Add(time.Minute)); err == nil || !strings.Contains(err.Error(), "pinned resources to sync: services") {
		t.Fatalf("wait() = %v, want the wait for services", err)
	}
	pending = nil
	if err := w.wait(cfg, start.Add(time.Minute)); err != nil {
		t.Fatalf("wait() = %v once synced", err)
	}
	pending = []string{"services"}
	if err := w.wait(cfg, start.Add(2*time.Minute)); err != nil {
		t.Errorf("wait() = %v while a pinned resource relists after the warm-up", err)
	}

	w = &warmup{started: start, pinnedUnsynced: func() []string { return pending }}
	if err := w.wait(cfg, start.Add(2*time.Hour)); err != nil {
		t.Errorf("wait() = %v after the warm-up timed out", err)
	}
	if !w.done.Load() {
		t.Errorf("a timed-out warm-up is not over")
	}
}
