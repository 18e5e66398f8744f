package scale

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
)

// snapshot is kube-apiserver's counters at one moment.
type snapshot struct {
	cpu, rss, bytes, etcd, watches float64
	requests                       map[string]float64
	// watchesBy are the watches held by resource.
	watchesBy map[string]float64
}

// since returns the phase between s0 and s: counters as differences,
// watches and RSS as they are at s.
func (s snapshot) since(s0 snapshot) Phase {
	p := Phase{CPUSeconds: s.cpu - s0.cpu, BytesSent: s.bytes - s0.bytes, EtcdRequests: s.etcd - s0.etcd,
		Watches: s.watches, RSSBytes: s.rss, Requests: map[string]float64{}}
	for verb, n := range s.requests {
		if d := n - s0.requests[verb]; d > 0 {
			p.Requests[verb] = d
		}
	}
	return p
}

// snapshot reads kube-apiserver's /metrics and its process's CPU and RSS.
func (h *harness) snapshot(ctx context.Context) (snapshot, error) {
	raw, err := h.admin.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return snapshot{}, fmt.Errorf("reading kube-apiserver metrics: %w", err)
	}
	s := snapshot{requests: map[string]float64{}, watchesBy: map[string]float64{}}
	pid := h.apiserver.Process.Pid()
	s.cpu, s.rss = procCPU(pid), procRSS(pid)
	for name, v := range scrape(string(raw), "apiserver_response_sizes_sum", "apiserver_watch_events_sizes_sum",
		"apiserver_request_total", "etcd_requests_total", "apiserver_longrunning_requests") {
		switch {
		case strings.HasPrefix(name, "apiserver_response_sizes_sum"), strings.HasPrefix(name, "apiserver_watch_events_sizes_sum"):
			s.bytes += v
		case strings.HasPrefix(name, "apiserver_request_total"):
			s.requests[label(name, "verb")] += v
		case strings.HasPrefix(name, "etcd_requests_total"):
			s.etcd += v
		case strings.HasPrefix(name, "apiserver_longrunning_requests") && label(name, "verb") == "WATCH":
			s.watches += v
			s.watchesBy[label(name, "resource")] += v
		}
	}
	return s, nil
}

// watches returns the watches kube-apiserver holds now.
func (h *harness) watches(ctx context.Context) (float64, error) {
	s, err := h.snapshot(ctx)
	return s.watches, err
}

// scrape returns the samples of the named metric families in a Prometheus
// text exposition, keyed by the sample's whole name with labels.
func scrape(text string, names ...string) map[string]float64 {
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		key := line[:i]
		family, _, _ := strings.Cut(key, "{")
		for _, n := range names {
			if family == n {
				if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
					out[key] += v
				}
			}
		}
	}
	return out
}

// label returns the value of label l in a sample name.
func label(sample, l string) string {
	_, rest, ok := strings.Cut(sample, l+`="`)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(rest, `"`)
	return v
}

// procCPU returns a process's user+system CPU-seconds.
func procCPU(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return 0
	}
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	return (utime + stime) / 100 // USER_HZ
}

// procRSS returns a process's resident set in bytes.
func procRSS(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				kb, _ := strconv.ParseFloat(f[0], 64)
				return kb * 1024
			}
		}
	}
	return 0
}

// commit is the source tree's commit, if git can tell.
func commit() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

// machine describes the machine the run measured on.
func machine() string {
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		if f := strings.Fields(line); len(f) >= 2 {
			if kb, err := strconv.ParseFloat(f[1], 64); err == nil {
				mem = fmt.Sprintf(", %.0f GiB", kb/(1<<20))
			}
		}
	}
	return fmt.Sprintf("%s/%s, %d CPUs%s", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), mem)
}
