package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

func sandboxNode() string { return sandbox.NodeName }

// measurer sends a case's requests from the client pod's network namespace
// with its token, through the Service VIP or straight to kube-apiserver.
type measurer struct {
	b              *bench
	agentClient    *http.Client
	directClient   *http.Client
	agentBase      string
	directBase     string
	users          map[string]bool // whose requests count as upstream
	apiserverPIDs  []int
	agentPID       int
	clockTicksPerS float64
}

func newMeasurer(b *bench) (*measurer, error) {
	caPEM, err := os.ReadFile(filepath.Join(b.client.Dir, "serviceaccount", "ca.crt"))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("no certificate in the pod's ca.crt")
	}
	newClient := func() *http.Client {
		return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
			DialContext:         b.client.NetNS.DialContext,
			TLSClientConfig:     &tls.Config{RootCAs: pool},
			ForceAttemptHTTP2:   true,
			MaxIdleConnsPerHost: 16,
		}}
	}
	m := &measurer{
		b:              b,
		agentClient:    newClient(),
		directClient:   newClient(),
		agentBase:      fmt.Sprintf("https://%s:%d", sandbox.ServiceVIP, sandbox.ServicePort),
		directBase:     b.c.APIServers()[0].URL,
		users:          map[string]bool{b.client.Username(): true, sandbox.AgentUsername(): true},
		agentPID:       b.agent.Process.Pid(),
		clockTicksPerS: 100, // USER_HZ on Linux
	}
	for _, as := range b.c.APIServers() {
		m.apiserverPIDs = append(m.apiserverPIDs, as.Process.Pid())
	}
	for _, pid := range append([]int{m.agentPID}, m.apiserverPIDs...) {
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil {
			return nil, err
		}
		if name := strings.TrimSpace(string(comm)); name != "kube-apiserver" && name != "kube-apicache" {
			return nil, fmt.Errorf("pid %d is %q, not the process to measure", pid, name)
		}
	}
	return m, nil
}

// requester returns a function that sends one request of bc along one path
// and reads the whole answer; it reports the latency, and an error for
// anything but 200.
func (m *measurer) requester(bc benchCase, viaAgent bool) func(context.Context) (time.Duration, error) {
	client, base := m.directClient, m.directBase
	if viaAgent {
		client, base = m.agentClient, m.agentBase
	}
	return func(ctx context.Context) (time.Duration, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+bc.path, nil)
		if err != nil {
			return 0, err
		}
		req.Header.Set("Authorization", "Bearer "+m.b.client.Token)
		req.Header.Set("Accept", m.b.o.accept)
		req.Header.Set("User-Agent", "kube-apicache-bench")
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		d := time.Since(start)
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("%s: HTTP %d", bc.path, resp.StatusCode)
		}
		return d, err
	}
}

// measure runs the warm-up, then the measured requests of bc along one
// path, and what they cost kube-apiserver.
func (m *measurer) measure(ctx context.Context, bc benchCase, viaAgent bool) (result, error) {
	get := m.requester(bc, viaAgent)
	for range m.b.o.warmup {
		if _, err := get(ctx); err != nil {
			return result{}, fmt.Errorf("warm-up of %s: %w", bc.name, err)
		}
	}

	auditStart, err := fileSize(m.b.c.AuditLog)
	if err != nil {
		return result{}, err
	}
	apiBefore, agentBefore := m.cpu(m.apiserverPIDs...), m.cpu(m.agentPID)

	n := m.b.o.requests
	inflight := m.b.o.inflight
	if bc.inflight > 0 {
		inflight = bc.inflight
	}
	durations, errs, lastEr := sendAll(ctx, get, n, inflight)
	if ctx.Err() != nil {
		return result{}, ctx.Err()
	}
	res := result{requests: n, errors: errs}
	res.apiserverS = m.cpu(m.apiserverPIDs...) - apiBefore
	res.agentS = m.cpu(m.agentPID) - agentBefore
	if len(durations) == 0 {
		return res, fmt.Errorf("%s: every request failed: %v", bc.name, lastEr)
	}
	sort.Slice(durations, func(i, j int) bool { return durations[i] < durations[j] })
	res.samples = durations
	res.p50 = durations[len(durations)*50/100].Round(10 * time.Microsecond)
	res.p99 = durations[len(durations)*99/100].Round(10 * time.Microsecond)

	// The audit log is written before each response (blocking mode); a
	// moment's wait covers the agent's own requests still in flight.
	time.Sleep(500 * time.Millisecond)
	byKind, total, err := m.upstream(auditStart)
	if err != nil {
		return res, err
	}
	res.upstream = total
	if viaAgent && total > 0 {
		res.upstreamDet = byKind
	}
	return res, nil
}

// upstream counts the requests kube-apiserver received from the client or
// the agent since offset in the audit log, and describes them.
func (m *measurer) upstream(offset int64) (string, int, error) {
	f, err := os.Open(m.b.c.AuditLog)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return "", 0, err
	}
	seen := map[string]bool{}
	kinds := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
	for sc.Scan() {
		var ev auditv1.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			continue // a line still being written
		}
		if !m.users[ev.User.Username] || seen[string(ev.AuditID)] {
			continue
		}
		seen[string(ev.AuditID)] = true
		who := "client"
		if ev.User.Username == sandbox.AgentUsername() {
			who = "agent"
		}
		res := ""
		if ev.ObjectRef != nil {
			res = ev.ObjectRef.Resource
		}
		kinds[who+" "+ev.Verb+" "+res]++
	}
	var parts []string
	for k, v := range kinds {
		parts = append(parts, fmt.Sprintf("%s: %d", k, v))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", "), len(seen), sc.Err()
}

// cpu returns the user+system CPU-seconds the processes have used.
func (m *measurer) cpu(pids ...int) float64 {
	var total float64
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// Fields after the command name, which is in parentheses and may
		// hold spaces: state is field 3, utime 14, stime 15.
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) < 13 {
			continue
		}
		utime, _ := strconv.ParseFloat(fields[11], 64)
		stime, _ := strconv.ParseFloat(fields[12], 64)
		total += (utime + stime) / m.clockTicksPerS
	}
	return total
}

func fileSize(path string) (int64, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

// sendAll sends n requests with get, inflight at a time, and returns the
// latencies of those that succeeded, the errors and the last of them.
func sendAll(ctx context.Context, get func(context.Context) (time.Duration, error), n, inflight int) ([]time.Duration, int, error) {
	return sendEach(ctx, func(ctx context.Context, _ int) (time.Duration, error) { return get(ctx) }, n, inflight)
}

// sendEach sends request i of n with send, inflight at a time, until ctx
// ends, and returns the latencies of those that succeeded, the errors and
// the last of them.
func sendEach(ctx context.Context, send func(ctx context.Context, i int) (time.Duration, error), n, inflight int) ([]time.Duration, int, error) {
	var (
		mu      sync.Mutex // protects the fields below
		durs    = make([]time.Duration, 0, n)
		errs    int
		lastErr error
		wg      sync.WaitGroup
	)
	next := make(chan int)
	for range inflight {
		wg.Go(func() {
			for i := range next {
				d, err := send(ctx, i)
				mu.Lock()
				if err != nil {
					errs++
					lastErr = err
				} else {
					durs = append(durs, d)
				}
				mu.Unlock()
			}
		})
	}
	for i := 0; i < n && ctx.Err() == nil; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	return durs, errs, lastErr
}
