package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// profileAgent captures a CPU profile of the agent while the client pod
// sends the case name's requests through it (each call of load sends
// perCall of them), and writes it to the profile directory as <case>.pprof (read it with go
// tool pprof). It runs after the case's measured requests, so the profiler
// does not skew the latencies: the requests keep coming, o.inflight at a
// time, until the agent's /debug/pprof/profile answers after o.profileTime.
func (m *measurer) profileAgent(ctx context.Context, name string, perCall int, load func(context.Context) (time.Duration, error)) error {
	secs := int((m.b.o.profileTime + time.Second - 1) / time.Second)
	client := &http.Client{
		Timeout:   time.Duration(secs)*time.Second + time.Minute,
		Transport: sandbox.AgentMetricsTransport(m.b.c.Node),
	}
	token, err := m.b.c.ScraperToken(ctx)
	if err != nil {
		return err
	}
	profCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		profile []byte
		profErr error
		done    = make(chan struct{})
	)
	go func() {
		defer close(done)
		defer cancel() // stops the load
		url := fmt.Sprintf("https://%s/debug/pprof/profile?seconds=%d", sandbox.AgentMetricsAddr, secs)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err != nil {
			profErr = err
			return
		}
		defer resp.Body.Close()
		profile, profErr = io.ReadAll(resp.Body)
		if profErr == nil && resp.StatusCode != http.StatusOK {
			profErr = fmt.Errorf("%s: HTTP %d: %.200s (is the agent running with --profiling?)", url, resp.StatusCode, profile)
		}
	}()

	get := load
	cpuBefore := m.cpu(m.agentPID)
	start := time.Now()
	var (
		sent, failed atomic.Int64
		lastErr      atomic.Value
		wg           sync.WaitGroup
	)
	for range m.b.o.inflight {
		wg.Go(func() {
			for profCtx.Err() == nil {
				if _, err := get(profCtx); err != nil {
					if profCtx.Err() == nil {
						failed.Add(1)
						lastErr.Store(err)
					}
					continue
				}
				sent.Add(1)
			}
		})
	}
	<-done
	wg.Wait()
	elapsed := time.Since(start)
	cpu := m.cpu(m.agentPID) - cpuBefore
	if profErr != nil {
		return fmt.Errorf("profiling the agent during %s: %w", name, profErr)
	}
	if n := failed.Load(); n > 0 {
		return fmt.Errorf("profiling the agent during %s: %d requests failed, last: %v", name, n, lastErr.Load())
	}
	file := filepath.Join(m.b.o.profileDir, profileName(name)+".pprof")
	if err := os.WriteFile(file, profile, 0o644); err != nil {
		return err
	}
	requests := sent.Load() * int64(perCall)
	perReq := 0.0
	if requests > 0 {
		perReq = cpu * 1000 / float64(requests)
	}
	logf("%s: agent CPU profile in %s (%d requests in %v, %.3f agent CPU-ms per request)",
		name, file, requests, elapsed.Round(time.Millisecond), perReq)
	return nil
}

// profileName turns a case name into a file name: `list node pods,
// RV=""` becomes list-node-pods-rv-unset.
func profileName(name string) string {
	name = strings.ToLower(strings.ReplaceAll(name, `""`, "unset"))
	var b strings.Builder
	dash := false
	for _, r := range name {
		if ('a' <= r && r <= 'z') || ('0' <= r && r <= '9') {
			b.WriteRune(r)
			dash = false
		} else if !dash && b.Len() > 0 {
			b.WriteByte('-')
			dash = true
		}
	}
	return strings.TrimSuffix(b.String(), "-")
}
