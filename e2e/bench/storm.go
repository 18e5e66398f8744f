package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/url"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// stormResult is one informer start-up storm along one path.
type stormResult struct {
	synced     time.Duration // until every informer process had synced
	apiserverS float64       // kube-apiserver CPU-seconds
	idleS      float64       // of those, what it uses idle over the same time
	bytes      float64       // bytes kube-apiserver sent: responses and watch events
	failed     int           // processes that did not sync
	// syncs are the times after the start each process synced, sorted.
	syncs []time.Duration
	// outcomes are the agent's cache outcomes for watches during the
	// storm (agent path only), e.g. "hit" or "forwarded/review-error".
	outcomes map[string]float64
}

// storm starts n informer processes at once in one pod, as a DaemonSet
// rollout does on a node: each runs client-go's default (watch-list)
// informers for this node's pods (typed and metadata-only) and the
// cluster's services. It measures the storm through the agent, then
// straight at kube-apiserver.
func (b *bench) storm(ctx context.Context, m *measurer, n int) (agent, direct stormResult, err error) {
	// The bench client may watch pods and services too.
	if err := b.grantPodsAndServices(ctx, "bench-informers", "get", "list", "watch"); err != nil {
		return agent, direct, err
	}
	env, err := b.directEnv()
	if err != nil {
		return agent, direct, err
	}
	before, err := b.watchOutcomes(ctx)
	if err != nil {
		return agent, direct, err
	}
	if agent, err = b.stormOnce(ctx, m, n, nil); err != nil {
		return agent, direct, err
	}
	after, err := b.watchOutcomes(ctx)
	if err != nil {
		return agent, direct, err
	}
	agent.outcomes = map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			agent.outcomes[k] = d
		}
	}
	direct, err = b.stormOnce(ctx, m, n, env)
	return agent, direct, err
}

func (b *bench) stormOnce(ctx context.Context, m *measurer, n int, env []string) (stormResult, error) {
	var res stormResult
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	// kube-apiserver's own background work (leases, controllers' writes)
	// costs CPU without any client: measure its rate while idle.
	const idle = 5 * time.Second
	time.Sleep(time.Second) // let earlier work settle
	idle0 := m.cpu(m.apiserverPIDs...)
	time.Sleep(idle)
	idleRate := (m.cpu(m.apiserverPIDs...) - idle0) / idle.Seconds()
	bytes0, err := b.apiserverBytes(ctx)
	if err != nil {
		return res, err
	}
	cpu0 := m.cpu(m.apiserverPIDs...)
	start := time.Now()
	procs, err := b.startInformers(ctx, n, 3*time.Minute, env)
	if err != nil {
		return res, err
	}
	res.synced, res.failed = procs.wait()
	res.syncs = procs.syncTimes()
	procs.stop()
	time.Sleep(time.Second) // let kube-apiserver account for the closed watches
	res.apiserverS = m.cpu(m.apiserverPIDs...) - cpu0
	res.idleS = idleRate * time.Since(start).Seconds()
	bytes1, err := b.apiserverBytes(ctx)
	if err != nil {
		return res, err
	}
	res.bytes = bytes1 - bytes0
	return res, nil
}

// directEnv points in-pod clients straight at kube-apiserver instead of
// the Service VIP (the agent).
func (b *bench) directEnv() ([]string, error) {
	u, err := url.Parse(b.c.APIServers()[0].URL)
	if err != nil {
		return nil, err
	}
	return []string{"KUBERNETES_SERVICE_HOST=" + u.Hostname(), "KUBERNETES_SERVICE_PORT=" + u.Port()}, nil
}

// informerProcs are podclient informer processes in the bench client pod,
// each with client-go's default (watch-list) protobuf informers for the
// node's pods (typed and metadata-only) and all services, over a
// connection of its own, as separate programs on a node have them.
type informerProcs struct {
	cmds []*exec.Cmd
	// stdin keeps each process running: it exits when its stdin closes.
	stdin []io.WriteCloser
	start time.Time
	// wg tracks the readers of the processes' output; settled counts
	// the processes that have not yet synced or exited.
	wg, settled sync.WaitGroup

	mu     sync.Mutex // protects the fields below
	synced time.Duration
	syncs  []time.Duration
	failed int
}

// startInformers starts n informer processes at once, each ending by
// itself after timeout; env is added to their environment (directEnv
// for kube-apiserver, nothing for the agent).
func (b *bench) startInformers(ctx context.Context, n int, timeout time.Duration, env []string) (*informerProcs, error) {
	p := &informerProcs{start: time.Now()}
	for range n {
		cmd := b.client.Command(ctx, b.podclient, "informers", "--timeout="+timeout.String(), "--protobuf")
		cmd.Env = append(cmd.Env, env...)
		in, err := cmd.StdinPipe()
		if err != nil {
			p.stop()
			return nil, err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			p.stop()
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			p.stop()
			return nil, err
		}
		p.cmds, p.stdin = append(p.cmds, cmd), append(p.stdin, in)
		p.settled.Add(1)
		p.wg.Go(func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if strings.HasPrefix(sc.Text(), "SYNCED") {
					p.mu.Lock()
					at := time.Since(p.start)
					p.synced = max(p.synced, at)
					p.syncs = append(p.syncs, at)
					p.mu.Unlock()
					p.settled.Done()
					// Read on, so that the process never blocks on its
					// output.
					_, _ = io.Copy(io.Discard, out)
					return
				}
			}
			p.mu.Lock()
			p.failed++
			p.mu.Unlock()
			p.settled.Done()
		})
	}
	return p, nil
}

// wait returns once every process has synced or exited: how long after
// the start the last one synced, and how many exited without syncing.
func (p *informerProcs) wait() (time.Duration, int) {
	p.settled.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.synced, p.failed
}

// syncTimes returns when each process that synced did, after the start,
// sorted.
func (p *informerProcs) syncTimes() []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Sorted(slices.Values(p.syncs))
}

// stop kills the processes and waits for them.
func (p *informerProcs) stop() {
	for _, cmd := range p.cmds {
		_ = cmd.Process.Kill()
	}
	p.wg.Wait() // their output ends with them
	for _, cmd := range p.cmds {
		_ = cmd.Wait()
	}
}

// apiserverBytes sums what kube-apiserver has sent: response bodies
// (apiserver_response_sizes) and watch events (apiserver_watch_events_sizes).
func (b *bench) apiserverBytes(ctx context.Context) (float64, error) {
	raw, err := b.c.Admin.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return 0, fmt.Errorf("reading kube-apiserver metrics: %w", err)
	}
	var sum float64
	for _, v := range scrape(string(raw), "apiserver_response_sizes_sum", "apiserver_watch_events_sizes_sum") {
		sum += v
	}
	return sum, nil
}

// watchOutcomes reads the agent's cache outcomes of watch requests, by
// outcome and reason.
func (b *bench) watchOutcomes(ctx context.Context) (map[string]float64, error) {
	text, err := b.agent.Metrics(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for key, v := range scrape(text, "kube_apicache_cache_requests_total") {
		if !strings.Contains(key, `verb="watch"`) {
			continue
		}
		outcome, reason := labelValue(key, "outcome"), labelValue(key, "reason")
		if reason != "" {
			outcome += "/" + reason
		}
		out[outcome] += v
	}
	return out, nil
}

// labelValue returns a label's value in a Prometheus sample key.
func labelValue(key, name string) string {
	_, rest, ok := strings.Cut(key, name+`="`)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(rest, `"`)
	return v
}

// stormCPUTarget is the most kube-apiserver CPU-seconds a storm through
// the agent may cost, as a fraction of the same storm sent directly.
const stormCPUTarget = 0.02

// verdict compares agent/direct with a target ratio: "0.013× (target at
// most 0.02×): meets".
func verdict(agent, direct, target float64) string {
	if direct <= 0 {
		return "no direct cost measured"
	}
	r := agent / direct
	word := "meets"
	if r > target {
		word = "misses"
	}
	return fmt.Sprintf("%.3f× (target at most %g×): %s", r, target, word)
}

// printStorm prints the storm's figures side by side.
func printStorm(n int, agent, direct stormResult) {
	ratio := func(a, d float64) string {
		if a == 0 {
			return "∞"
		}
		return fmt.Sprintf("%.1f×", d/a)
	}
	fmt.Printf("\ninformer start-up storm: %d processes at once on %s, each with watch-list informers for the node's pods (typed and metadata-only) and all services\n", n, sandbox.NodeName)
	fmt.Printf("  all synced after:          agent %v, direct %v\n", agent.synced.Round(time.Millisecond), direct.synced.Round(time.Millisecond))
	fmt.Printf("  kube-apiserver bytes sent: agent %.0f, direct %.0f (direct/agent %s)\n", agent.bytes, direct.bytes, ratio(agent.bytes, direct.bytes))
	fmt.Printf("  kube-apiserver CPU-s:      agent %.2f, direct %.2f (direct/agent %s)\n", agent.apiserverS, direct.apiserverS, ratio(agent.apiserverS, direct.apiserverS))
	an, dn := max(agent.apiserverS-agent.idleS, 0), max(direct.apiserverS-direct.idleS, 0)
	fmt.Printf("  ... above its idle rate:   agent %.2f, direct %.2f (direct/agent %s; idle %.2f and %.2f over the same times)\n", an, dn, ratio(an, dn), agent.idleS, direct.idleS)
	fmt.Printf("  kube-apiserver CPU-s agent/direct: %s\n", verdict(agent.apiserverS, direct.apiserverS, stormCPUTarget))
	fmt.Printf("  the agent's watch outcomes: %v\n", agent.outcomes)
	if agent.failed+direct.failed > 0 {
		fmt.Printf("  processes that did not sync: agent %d, direct %d\n", agent.failed, direct.failed)
	}
}
