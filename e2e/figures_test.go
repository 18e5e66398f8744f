package e2e

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
)

// figures are the measured figures of the suite: what the scenarios
// counted and timed. They are logged with their test and, when
// KUBE_APICACHE_FIGURES names a file, written there at the end of the run,
// so that `make test` can print them even when every test passes (go test
// shows a passing package's logs only with -v).
var figures struct {
	mu    sync.Mutex // protects lines
	lines []string
}

// figuref logs a measured figure and keeps it for the end-of-run report.
func figuref(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	t.Log(msg)
	figures.mu.Lock()
	defer figures.mu.Unlock()
	figures.lines = append(figures.lines, t.Name()+": "+msg)
}

// writeFigures writes the figures to the file KUBE_APICACHE_FIGURES names,
// if any.
func writeFigures() error {
	path := os.Getenv("KUBE_APICACHE_FIGURES")
	if path == "" {
		return nil
	}
	figures.mu.Lock()
	defer figures.mu.Unlock()
	text := strings.Join(figures.lines, "\n")
	if text != "" {
		text += "\n"
	}
	return os.WriteFile(path, []byte(text), 0o644)
}
