package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// natSyncResult is what the agent's rule sync cost on the node, measured
// over a window of syncs, with kube-proxy-shaped nat rules for some number
// of Services.
type natSyncResult struct {
	services, rules int
	syncs           float64
	// childCPU is the CPU time of the iptables processes the agent ran,
	// per sync.
	childCPU time.Duration
	// syncTime is the mean wall time of one sync.
	syncTime time.Duration
	// refreshes and lateRefreshes count liveness refreshes in the window,
	// and those more than twice the refresh interval after the previous
	// one; maxGap is the upper bound of the largest gap's bucket.
	refreshes, lateRefreshes float64
	maxGap                   string
}

// natSyncCost measures the cost of the agent's periodic rule sync on a node
// with an empty nat table (only the sandbox's own Service rules) and with
// kube-proxy's iptables-mode rules for services Services of
// endpointsPerService endpoints each. The bench's agent is replaced by one
// that syncs every second and caches nothing, so that its iptables children
// are the sync's alone. It returns both results and what one listing of the
// whole table (what the sync did in earlier releases) costs.
func (b *bench) natSyncCost(ctx context.Context, agentBin string, services, endpointsPerService int, window time.Duration) (empty, full natSyncResult, dump string, err error) {
	c := b.c
	if err := b.replaceAgent(ctx, agentBin, "--sync-period=1s", "--cache-resources="); err != nil {
		return empty, full, "", err
	}
	if empty, err = b.measureSyncs(ctx, window); err != nil {
		return empty, full, "", err
	}
	logf("nat sync: loading kube-proxy rules for %d Services x %d endpoints into the node's nat table", services, endpointsPerService)
	start := time.Now()
	// One restore of the whole table with the new rules added: far faster
	// than --noflush, which costs time quadratic in the chains added, and
	// as atomic.
	current, err := c.Node.Output(ctx, "iptables-save", "-t", "nat")
	if err != nil {
		return empty, full, "", err
	}
	rules := withNATRules(current, kubeProxyNATRules(services, endpointsPerService))
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", c.Node.Name(), "iptables-restore")
	cmd.Stdin = bytes.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		return empty, full, "", fmt.Errorf("iptables-restore: %w: %s", err, out)
	}
	logf("nat sync: loaded in %v", time.Since(start).Round(time.Millisecond))
	if full, err = b.measureSyncs(ctx, window); err != nil {
		return empty, full, "", err
	}
	full.services = services
	// What listing the whole table once costs, for comparison.
	cmd = exec.CommandContext(ctx, "ip", "netns", "exec", c.Node.Name(), "iptables", "-w", "-t", "nat", "-S")
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := cmd.Run(); err != nil {
		return empty, full, "", fmt.Errorf("iptables -t nat -S: %w", err)
	}
	full.rules = bytes.Count(out.Bytes(), []byte("\n-A "))
	ru, _ := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if ru != nil {
		cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		dump = fmt.Sprintf("one `iptables -t nat -S` of that table (the whole-table listing earlier releases ran on every sync): %v CPU, %d MiB peak RSS", cpu.Round(time.Millisecond), ru.Maxrss/1024)
	}
	return empty, full, dump, nil
}

// replaceAgent stops the bench's agent and starts another in its pod, with
// its serving certificate and the sandbox's flags, --profiling and extra.
func (b *bench) replaceAgent(ctx context.Context, agentBin string, extra ...string) error {
	c := b.c
	pod, certFile, keyFile := b.agent.Pod, b.agent.CertFile, b.agent.KeyFile
	b.agent.Process.Stop(40 * time.Second)
	agent, err := c.StartAgent(ctx, pod, agentBin, c.AgentArgs(certFile, keyFile, append([]string{"--profiling"}, extra...)...)...)
	if err != nil {
		return err
	}
	agent.CertFile, agent.KeyFile = certFile, keyFile
	b.agent = agent
	return nil
}

// measureSyncs watches the running agent for window and returns what its
// syncs cost: its reaped children's CPU (the agent runs no other children
// once started) per sync, from /proc, and the sync and liveness histograms
// from its metrics.
func (b *bench) measureSyncs(ctx context.Context, window time.Duration) (natSyncResult, error) {
	type sample struct {
		childCPU float64
		metrics  map[string]float64
	}
	take := func() (sample, error) {
		text, err := b.agent.Metrics(ctx)
		if err != nil {
			return sample{}, err
		}
		cpu, err := childCPU(b.agent.Process.Pid())
		return sample{cpu, scrape(text, "kube_apicache_rule_sync_duration_seconds", "kube_apicache_liveness_refresh_gap_seconds")}, err
	}
	before, err := take()
	if err != nil {
		return natSyncResult{}, err
	}
	select {
	case <-ctx.Done():
		return natSyncResult{}, ctx.Err()
	case <-time.After(window):
	}
	after, err := take()
	if err != nil {
		return natSyncResult{}, err
	}
	d := func(k string) float64 { return after.metrics[k] - before.metrics[k] }
	var r natSyncResult
	r.syncs = d("kube_apicache_rule_sync_duration_seconds_count")
	if r.syncs == 0 {
		return r, fmt.Errorf("no rule sync in %v", window)
	}
	r.childCPU = time.Duration((after.childCPU - before.childCPU) / r.syncs * float64(time.Second))
	r.syncTime = time.Duration(d("kube_apicache_rule_sync_duration_seconds_sum") / r.syncs * float64(time.Second))
	r.refreshes = d("kube_apicache_liveness_refresh_gap_seconds_count")
	// The refresh interval is a quarter of --liveness-timeout (1s): 250ms.
	r.lateRefreshes = r.refreshes - d(`kube_apicache_liveness_refresh_gap_seconds_bucket{le="0.5"}`)
	r.maxGap = "> 10s"
	for _, le := range []string{"0.25", "0.3", "0.4", "0.5", "0.75", "1", "1.5", "2", "5", "10"} {
		if d(`kube_apicache_liveness_refresh_gap_seconds_bucket{le="`+le+`"}`) == r.refreshes {
			r.maxGap = "<= " + le + "s"
			break
		}
	}
	return r, nil
}

// childCPU returns the user+system CPU-seconds of pid's reaped children.
func childCPU(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// After the parenthesized command name: cutime is field 16, cstime 17.
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 15 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	cu, _ := strconv.ParseFloat(fields[13], 64)
	cs, _ := strconv.ParseFloat(fields[14], 64)
	return (cu + cs) / 100, nil // USER_HZ
}

// kubeProxyNATRules renders, as iptables-save lines (chain declarations,
// then rules, no table header), the nat rules
// kube-proxy's iptables mode writes for services ClusterIP Services of
// endpoints endpoints each: a KUBE-SERVICES jump, a KUBE-SVC chain with the
// masquerade mark and one probability jump per endpoint, and a KUBE-SEP
// chain per endpoint with its masquerade and DNAT rules, 2+3n rules a
// Service. They hang off a chain of their own, not the sandbox's
// KUBE-SERVICES, which its kube-proxy stand-in rewrites: what the agent's
// sync pays for is the table's size, not the packets' path.
func kubeProxyNATRules(services, endpoints int) []byte {
	var chains, rules bytes.Buffer
	chains.WriteString(":KUBE-BENCH-SERVICES - [0:0]\n:KUBE-BENCH-MARK-MASQ - [0:0]\n")
	hash := func(s string) string {
		h := sha256.Sum256([]byte(s))
		return strings.ToUpper(fmt.Sprintf("%x", h[:8]))
	}
	for s := range services {
		svc := "KUBE-SVC-" + hash("svc"+strconv.Itoa(s))
		vip := fmt.Sprintf("10.%d.%d.%d", 100+s/62500, s/250%250, s%250+1)
		name := fmt.Sprintf("bench/svc-%d:http", s)
		fmt.Fprintf(&chains, ":%s - [0:0]\n", svc)
		fmt.Fprintf(&rules, "-A KUBE-BENCH-SERVICES -d %s/32 -p tcp -m comment --comment \"%s cluster IP\" -m tcp --dport 80 -j %s\n", vip, name, svc)
		fmt.Fprintf(&rules, "-A %s ! -s 10.244.0.0/16 -d %s/32 -p tcp -m comment --comment \"%s cluster IP\" -m tcp --dport 80 -j KUBE-BENCH-MARK-MASQ\n", svc, vip, name)
		for e := range endpoints {
			sep := "KUBE-SEP-" + hash(fmt.Sprintf("sep%d-%d", s, e))
			n := s*endpoints + e
			ip := fmt.Sprintf("10.%d.%d.%d", 200+n/62500, n/250%250, n%250+1)
			fmt.Fprintf(&chains, ":%s - [0:0]\n", sep)
			if e < endpoints-1 {
				fmt.Fprintf(&rules, "-A %s -m comment --comment \"%s -> %s:8080\" -m statistic --mode random --probability %.11f -j %s\n", svc, name, ip, 1/float64(endpoints-e), sep)
			} else {
				fmt.Fprintf(&rules, "-A %s -m comment --comment \"%s -> %s:8080\" -j %s\n", svc, name, ip, sep)
			}
			fmt.Fprintf(&rules, "-A %s -s %s/32 -m comment --comment %s -j KUBE-BENCH-MARK-MASQ\n", sep, ip, name)
			fmt.Fprintf(&rules, "-A %s -p tcp -m comment --comment %s -m tcp -j DNAT --to-destination %s:8080\n", sep, name, ip)
		}
	}
	rules.WriteString("-A KUBE-BENCH-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n")
	chains.Write(rules.Bytes())
	return chains.Bytes()
}

// withNATRules merges saved, the output of iptables-save -t nat, and
// added, a nat table in the same form, into one table for iptables-restore:
// every chain declaration first, then every rule.
func withNATRules(saved string, added []byte) []byte {
	var decls, rules bytes.Buffer
	decls.WriteString("*nat\n")
	for _, text := range []string{saved, string(added)} {
		for _, l := range strings.Split(text, "\n") {
			switch {
			case strings.HasPrefix(l, ":"):
				decls.WriteString(l + "\n")
			case strings.HasPrefix(l, "-A "):
				rules.WriteString(l + "\n")
			}
		}
	}
	decls.Write(rules.Bytes())
	decls.WriteString("COMMIT\n")
	return decls.Bytes()
}

// printNATSync prints the sync cost table.
func printNATSync(empty, full natSyncResult, dump string) {
	fmt.Printf("\nrule sync cost (agent syncing every 1s; per sync: iptables children's CPU, mean wall time; liveness refreshes every 250ms):\n")
	for _, r := range []struct {
		name string
		r    natSyncResult
	}{{"empty nat table", empty}, {fmt.Sprintf("%d Services, %d rules", full.services, full.rules), full}} {
		fmt.Printf("  %-32s %3.0f syncs  child CPU %-8v wall %-8v  refreshes %4.0f, late (>0.5s) %.0f, largest gap %s\n",
			r.name, r.r.syncs, r.r.childCPU.Round(100*time.Microsecond), r.r.syncTime.Round(100*time.Microsecond), r.r.refreshes, r.r.lateRefreshes, r.r.maxGap)
	}
	if empty.childCPU > 0 {
		fmt.Printf("sync CPU ratio, %d Services / empty: %.2f (target <= 1.2)\n", full.services, float64(full.childCPU)/float64(empty.childCPU))
	}
	if dump != "" {
		fmt.Println(dump)
	}
}
