package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/kube-apicache/kube-apicache/e2e/benchplot"
	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
	"github.com/kube-apicache/kube-apicache/e2e/scale"
)

// TestScaleHarness runs make bench-scale's harness small (2 simulated
// nodes, 2 informer processes each) in a sandbox of its own: every phase
// completes along both paths, and with agents kube-apiserver holds one
// watch per cached resource per node whatever the clients on the node
// watch, while without them it holds every client's.
func TestScaleHarness(t *testing.T) {
	requireBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const nodes, clients = 2, 2
	res, err := scale.Run(ctx, scale.Options{
		BinDir: binDir, Binaries: sandbox.Binaries{Agent: agentBin, PodClient: podclientBin},
		Nodes: []int{nodes}, PodsPerNode: 20, Clients: clients, Services: 50,
		ChurnTime: 10 * time.Second, PodChurn: 2, ServiceChurn: 5, Recovery: true,
		Logf: t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Points) != 2 {
		t.Fatalf("%d points, want direct and agent", len(res.Points))
	}
	for _, p := range res.Points {
		if p.Storm.Synced != nodes*clients || p.Storm.Failed != 0 || p.Recovery == nil {
			t.Errorf("%s: %d clients synced, %d failed, recovery %v; want %d, 0 and a recovery", p.Mode, p.Storm.Synced, p.Storm.Failed, p.Recovery, nodes*clients)
		}
		if p.Churn.Requests["PATCH"] == 0 || p.Storm.CPUSeconds <= 0 {
			t.Errorf("%s: churn requests %v, storm CPU %v: nothing measured", p.Mode, p.Churn.Requests, p.Storm.CPUSeconds)
		}
		added := p.Storm.Watches - p.IdleWatches
		switch p.Mode {
		case "agent":
			// Each node's agent holds one watch per cached resource;
			// its clients' watches are served from its cache.
			if want := float64(nodes * len(scale.CachedResources)); p.CacheWatches != want {
				t.Errorf("agents' cache watches %v, want %v (nodes x cached resources)", p.CacheWatches, want)
			}
			if added != 0 {
				t.Errorf("with agents the clients added %v watches at kube-apiserver, want 0", added)
			}
		case "direct":
			// Each client holds its four informers' watches.
			if want := float64(nodes * clients * 4); added != want {
				t.Errorf("direct, the clients added %v watches at kube-apiserver, want %v", added, want)
			}
		}
		if p.Recovery == nil {
			continue
		}
		figuref(t, "%d nodes, %s: storm %.1fs, %.2f CPU-s, %.2f MB; churn %.2f CPU-s, %.2f MB; watches %v -> %v -> %v; recovery %.1fs, %.2f CPU-s",
			p.Nodes, p.Mode, p.Storm.Seconds, p.Storm.CPUSeconds, p.Storm.BytesSent/1e6, p.Churn.CPUSeconds, p.Churn.BytesSent/1e6,
			p.BaseWatches, p.IdleWatches, p.Storm.Watches, p.Recovery.Seconds, p.Recovery.CPUSeconds)
	}
	files, err := scale.WriteFiles(benchplot.Dir(t.TempDir()), res)
	if err != nil || len(files) != 9 {
		t.Errorf("wrote %v: %v; want the results and 8 charts", files, err)
	}
}
