package serving

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2/textlogger"
)

// TestThrottledLog: the first event is logged at once, later ones at most
// once a minute with how many there were since the last line.
func TestThrottledLog(t *testing.T) {
	var out bytes.Buffer
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&out)))
	now := time.Unix(1000, 0)
	l := newThrottledLog("Refused", "forward")
	l.now = func() time.Time { return now }
	for _, step := range []time.Duration{0, 10 * time.Second, 20 * time.Second, 31 * time.Second, time.Second} {
		now = now.Add(step)
		l.log(logger, "source", now.Unix())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := []string{
		`"Refused" handler="forward" count=1 interval="1m0s" source=1000`,
		`"Refused" handler="forward" count=3 interval="1m0s" source=1061`,
	}
	if len(lines) != len(want) {
		t.Fatalf("logged %q, want lines ending in %q", lines, want)
	}
	for i := range want {
		if !strings.HasSuffix(lines[i], want[i]) {
			t.Errorf("line %d: %s, want it to end in %s", i, lines[i], want[i])
		}
	}
}
