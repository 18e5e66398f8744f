package e2e

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// latencyRE matches podclient latency's summary.
var latencyRE = regexp.MustCompile(`LATENCY p50=(\d+)us p99=(\d+)us codes=(map\[[^\]]*\]) errors=(\d+)`)

// victimReads are one round of a victim pod's cached reads.
type victimReads struct {
	p50, p99 time.Duration
	codes    string
	errors   int
}

// rnVictimSamples is the number of reads of one victim round.
const rnVictimSamples = 200

// victimRead runs one round of cached reads of this node's pods
// (resourceVersion=0, answered by the agent alone) in the reader pod.
func (s *dsScenario) victimRead(t *testing.T, ctx context.Context) victimReads {
	t.Helper()
	path := "/api/v1/pods?fieldSelector=spec.nodeName%3D" + s.node.Name + "&resourceVersion=0"
	out := s.exec(t, ctx, s.reader, "/podclient", "latency", "--path", path, "--count", strconv.Itoa(rnVictimSamples), "--timeout", "2m")
	m := latencyRE.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("victim: no LATENCY line in %q", out)
	}
	us := func(s string) time.Duration { v, _ := strconv.Atoi(s); return time.Duration(v) * time.Microsecond }
	errs, _ := strconv.Atoi(m[4])
	return victimReads{p50: us(m[1]), p99: us(m[2]), codes: m[3], errors: errs}
}

// agentCounters scrapes the counters the attacks are judged by.
type agentCounters struct {
	hits, passiveFailures, degraded, rss float64
	probes                               map[string]float64 // by reason
}

func (s *dsScenario) counters(t *testing.T, ctx context.Context) agentCounters {
	t.Helper()
	text, err := s.agentMetrics(ctx)
	if err != nil {
		t.Fatalf("agent metrics: %v", err)
	}
	m := parseMetrics(t, text)
	c := agentCounters{
		hits:            sumWhere(m["kube_apicache_cache_requests_total"], map[string]string{"outcome": "hit"}),
		passiveFailures: sumWhere(m["kube_apicache_upstream_passive_failures_total"], nil),
		degraded:        sumWhere(m["kube_apicache_degraded"], nil),
		rss:             sumWhere(m["process_resident_memory_bytes"], nil),
		probes:          map[string]float64{},
	}
	for _, reason := range []string{"unchecked", "no-recent-success", "suspect", "failing", "failover"} {
		c.probes[reason] = sumWhere(m["kube_apicache_upstream_probes_total"], map[string]string{"reason": reason})
	}
	return c
}

// agentRestarts is the agent container's restart count.
func (s *dsScenario) agentRestarts(t *testing.T, ctx context.Context) int32 {
	t.Helper()
	_, cs := s.agentStatus(t, ctx)
	return cs.RestartCount
}

// tenantAttacks: given the reader pod (the victim) reading its node's
// pods from the cache and a tenant pod with `edit` in its namespace, when
// the tenant runs, one after another, a 60-second loop of pods/proxy
// requests its own pod answers with headers and a closed connection
// (kube-apiserver resets each stream), 8,000 TLS connections that send the HTTP/2 preface
// and nothing more, and 400 GETs of /openapi/v2 whose answers it never
// reads, then during each the victim's reads stay cache hits with no
// error and no 429, their p99 within twice the quiet p99, the agent's
// upstream endpoints keep their health (no probe caused, no passive
// failure, never degraded), and the agent is never restarted.
func (s *dsScenario) tenantAttacks(t *testing.T, ctx context.Context) {
	attacker := s.runClient(t, ctx, "attacker", "resetserver", "--port", "8080", "--timeout", "10m")
	if err := attacker.log.awaitLine("READY", time.Minute); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = s.c.Admin.CoreV1().Pods(dsClientNS).Delete(context.WithoutCancel(ctx), attacker.Pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	}()
	s.waitAllowed(t, ctx, dsClientNS, "get", "pods/proxy")
	restarts := s.agentRestarts(t, ctx)

	quiet := s.victimRead(t, ctx)
	if q2 := s.victimRead(t, ctx); q2.p99 < quiet.p99 {
		quiet = q2
	}
	figuref(t, "realnode/attacks: victim's quiet cached-read p99 %v (p50 %v) over %d reads", quiet.p99, quiet.p50, rnVictimSamples)

	for _, a := range []struct {
		name string
		args []string
		// settle is how long the attack runs before the victim reads.
		settle time.Duration
	}{
		{"proxy-resets", []string{"--mode", "proxyreset", "--concurrency", "10", "--timeout", "60s",
			"--path", "/api/v1/namespaces/" + dsClientNS + "/pods/" + attacker.Pod.Name + ":8080/proxy/"}, 3 * time.Second},
		{"idle-connections", []string{"--mode", "idleconns", "--count", "8000", "--concurrency", "200", "--timeout", "45s"}, 15 * time.Second},
		{"unread-answers", []string{"--mode", "unread", "--count", "400", "--concurrency", "50", "--timeout", "40s",
			"--path", "/openapi/v2"}, 10 * time.Second},
	} {
		t.Run(a.name, func(t *testing.T) {
			before := s.counters(t, ctx)
			type result struct {
				out string
				err error
			}
			done := make(chan result, 1)
			go func() {
				out, err := s.kubectl(ctx, append([]string{"exec", "-n", dsClientNS, attacker.Pod.Name, "--", "/podclient", "attack"}, a.args...)...)
				done <- result{out, err}
			}()
			time.Sleep(a.settle)
			during := s.counters(t, ctx)
			v := s.victimRead(t, ctx)
			if v.p99 > 2*quiet.p99 {
				// One p99 over 200 reads is the third-slowest read: a
				// second round, and the better of the two.
				if v2 := s.victimRead(t, ctx); v2.p99 < v.p99 {
					v = v2
				}
			}
			after := s.counters(t, ctx)
			res := <-done
			if res.err != nil {
				t.Fatalf("attack: %v\n%s", res.err, res.out)
			}
			summary := strings.TrimSpace(res.out)
			figuref(t, "realnode/attacks/%s: tenant %s; victim's cached-read p99 %v (quiet %v, ratio %.2f), answers %s, %d errors, cache hits +%v; agent RSS %.0f MiB during",
				a.name, strings.ReplaceAll(summary, "\n", "; "), v.p99, quiet.p99, float64(v.p99)/float64(quiet.p99), v.codes, v.errors,
				after.hits-during.hits, during.rss/(1<<20))
			if v.codes != fmt.Sprintf("map[200:%d]", rnVictimSamples) || v.errors > 0 {
				t.Errorf("victim's reads: answers %s, %d errors; want %d answers 200", v.codes, v.errors, rnVictimSamples)
			}
			if after.hits-during.hits < rnVictimSamples {
				t.Errorf("victim's reads: %v cache hits for %d reads, want all", after.hits-during.hits, rnVictimSamples)
			}
			if v.p99 > 2*quiet.p99 && v.p99 > 20*time.Millisecond {
				t.Errorf("victim's cached-read p99 %v under the attack, more than twice the quiet %v", v.p99, quiet.p99)
			}
			end := s.counters(t, ctx)
			for _, reason := range []string{"suspect", "failing", "failover"} {
				if d := end.probes[reason] - before.probes[reason]; d > 0 {
					t.Errorf("%v /readyz probes of reason %s during the attack, want none", d, reason)
				}
			}
			if d := end.passiveFailures - before.passiveFailures; d > 0 {
				t.Errorf("%v passive upstream failures during the attack, want none", d)
			}
			if during.degraded+after.degraded+end.degraded > 0 {
				t.Error("the agent entered degraded mode during the attack")
			}
			if r := s.agentRestarts(t, ctx); r != restarts {
				t.Errorf("agent restarted %d times during the attack", r-restarts)
			}
			if !slices.Contains(liveEntries(t, ctx, s.c), sandbox.ServiceVIP) {
				t.Error("the node's liveness set no longer holds the VIP after the attack")
			}
		})
	}
}
