package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The "staleness" case: the admin patches a pod on the agent's node
// straight at kube-apiserver; from the write's answer, how long until
// (a) a read with resourceVersion=0, polled from the client pod, sees it
// through the agent and directly (both polled at once), and (b) a
// watch-list of the node's pods, as an informer holds it, sees it through
// the agent and directly: the "watch event latency" case's sightings,
// timed from the write's answer (the case runs here if it did not run).
var stalenessN = flag.Int("staleness-samples", 200, "writes the \""+stalenessCase+"\" case times until a resourceVersion=0 read sees them, along both paths (0 skips it)")

const (
	stalenessCase       = "staleness"
	stalenessAnnotation = "bench.kube-apicache.io/staleness"
)

// stalenessResult holds, for each timed write, how long after its answer
// a polled resourceVersion=0 get of the pod saw it, through the agent and
// direct (sorted); and the watch sightings.
type stalenessResult struct {
	pod           string
	agent, direct []time.Duration
	// staleAgent and staleDirect count the reads that still returned the
	// pod as it was before the write.
	staleAgent, staleDirect int
	missed                  int
	watch                   *latencyResult
}

// staleness runs the staleness case; latency is the "watch event
// latency" case's result if it ran.
func (b *bench) staleness(ctx context.Context, m *measurer, latency *latencyResult) (*stalenessResult, error) {
	n := *stalenessN
	if n <= 0 || !b.o.cases.MatchString(stalenessCase) {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	cs, err := b.fastAdmin()
	if err != nil {
		return nil, err
	}
	logf("%s: %d writes, each polled with resourceVersion=0 reads through the agent and direct", stalenessCase, n)
	r := &stalenessResult{pod: b.firstNodePod}
	path := "/api/v1/namespaces/" + benchNS + "/pods/" + r.pod + "?resourceVersion=0"
	// poll reads the pod along one path until its annotation is want,
	// and returns when the answer that had it arrived, and how many
	// answers did not.
	poll := func(ctx context.Context, viaAgent bool, want string) (time.Time, int, error) {
		client, base := m.directClient, m.directBase
		if viaAgent {
			client, base = m.agentClient, m.agentBase
		}
		stale := 0
		for {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
			if err != nil {
				return time.Time{}, stale, err
			}
			req.Header.Set("Authorization", "Bearer "+m.b.client.Token)
			req.Header.Set("Accept", "application/json")
			req.Header.Set("User-Agent", "kube-apicache-bench")
			resp, err := client.Do(req)
			if err != nil {
				return time.Time{}, stale, err
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			at := time.Now()
			if err != nil {
				return time.Time{}, stale, err
			}
			if resp.StatusCode != http.StatusOK {
				return time.Time{}, stale, fmt.Errorf("GET %s: HTTP %d", path, resp.StatusCode)
			}
			var obj struct {
				Metadata metav1.ObjectMeta `json:"metadata"`
			}
			if err := json.Unmarshal(body, &obj); err != nil {
				return time.Time{}, stale, err
			}
			if obj.Metadata.Annotations[stalenessAnnotation] == want {
				return at, stale, nil
			}
			stale++
		}
	}
	nonce := time.Now().UnixNano()
	for seq := 1; seq <= n; seq++ {
		want := fmt.Sprintf("%d-%d", nonce, seq)
		patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, stalenessAnnotation, want)
		if _, err := cs.CoreV1().Pods(benchNS).Patch(ctx, r.pod, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return nil, err
		}
		acked := time.Now()
		var (
			wg     sync.WaitGroup
			seen   [2]time.Time
			stale  [2]int
			errs   [2]error
			pollCx context.Context
		)
		pollCx, stop := context.WithTimeout(ctx, 5*time.Second)
		for i, via := range []bool{true, false} {
			wg.Go(func() { seen[i], stale[i], errs[i] = poll(pollCx, via, want) })
		}
		wg.Wait()
		stop()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if errs[0] != nil || errs[1] != nil {
			if pollCx.Err() == nil {
				return nil, fmt.Errorf("polling: agent %v, direct %v", errs[0], errs[1])
			}
			if r.missed++; r.missed == 5 {
				return nil, fmt.Errorf("5 writes not seen within 5s (agent %v, direct %v)", errs[0], errs[1])
			}
			continue
		}
		r.agent = append(r.agent, seen[0].Sub(acked))
		r.direct = append(r.direct, seen[1].Sub(acked))
		r.staleAgent += stale[0]
		r.staleDirect += stale[1]
		time.Sleep(10 * time.Millisecond)
	}
	slices.Sort(r.agent)
	slices.Sort(r.direct)
	if len(r.agent) == 0 {
		return nil, fmt.Errorf("no write was seen along both paths")
	}

	r.watch = latency
	if r.watch == nil {
		if err := b.grantPodsAndServices(ctx, "bench-informers", "get", "list", "watch"); err != nil {
			return nil, err
		}
		logf("%s: %d writes, each seen by a watch-list through the agent and direct", stalenessCase, n)
		if r.watch, err = b.watchLatency(ctx, m, n); err != nil {
			return nil, fmt.Errorf("%s: %w", stalenessCase, err)
		}
	}
	return r, nil
}

func (r *stalenessResult) print() {
	pct := func(s []time.Duration, p int) time.Duration {
		return s[min(len(s)*p/100, len(s)-1)].Round(10 * time.Microsecond)
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%+.2fms", float64(d)/float64(time.Millisecond)) }
	fmt.Printf("\n%s: a merge patch of pod %s/%s by the admin straight at kube-apiserver, then from its answer the time until the client pod sees it (%d writes, %d not seen within 5s)\n",
		stalenessCase, benchNS, r.pod, len(r.agent)+r.missed, r.missed)
	line := func(what string, agent, direct []time.Duration) {
		a50, d50, a99, d99 := pct(agent, 50), pct(direct, 50), pct(agent, 99), pct(direct, 99)
		fmt.Printf("  %-36s agent p50 %v p99 %v; direct p50 %v p99 %v; agent/direct p50 %s p99 %s; agent minus direct p50 %s p99 %s\n",
			what, a50, a99, d50, d99, ratioText(a50, d50), ratioText(a99, d99), ms(a50-d50), ms(a99-d99))
	}
	line("get with resourceVersion=0, polled:", r.agent, r.direct)
	fmt.Printf("  %-36s %.2f stale reads per write through the agent, %.2f direct\n", "",
		float64(r.staleAgent)/float64(len(r.agent)), float64(r.staleDirect)/float64(len(r.direct)))
	if w := r.watch; w != nil {
		line("watch-list (informer):", w.agentAck, w.directAck)
	}
	fmt.Printf("%s: resourceVersion=0 read, agent/direct p50 %s, p99 %s\n", stalenessCase,
		ratioText(pct(r.agent, 50), pct(r.direct, 50)), ratioText(pct(r.agent, 99), pct(r.direct, 99)))
	if w := r.watch; w != nil {
		fmt.Printf("%s: informer, agent/direct p50 %s, p99 %s (an event that arrived before the write's answer counts as 0)\n", stalenessCase,
			ratioText(pct(w.agentAck, 50), pct(w.directAck, 50)), ratioText(pct(w.agentAck, 99), pct(w.directAck, 99)))
	}
}

// ratioText is agent/direct to three places, or "n/a" when direct is 0.
func ratioText(agent, direct time.Duration) string {
	if direct == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.3f", ratio(agent, direct))
}
