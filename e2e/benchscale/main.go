// Command benchscale (make bench-scale) measures kube-apiserver's cost
// against the number of nodes, with the agent on every node and without
// it (package scale), prints a table and the fitted per-node cost model,
// and writes the results (JSON) and charts (PNG) under -out.
//
// It asserts nothing and is not part of make test; the e2e suite runs a
// small variant (TestScaleHarness).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/kube-apicache/kube-apicache/e2e/benchplot"
	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
	"github.com/kube-apicache/kube-apicache/e2e/scale"
)

func main() {
	var o scale.Options
	nodes := flag.String("nodes", "1,2,5,10", "node counts to measure, increasing (at most 250)")
	flag.StringVar(&o.BinDir, "bin-dir", sandbox.DefaultBinDir(), "directory holding etcd, kube-apiserver and kube-controller-manager")
	flag.IntVar(&o.PodsPerNode, "pods-per-node", 110, "pods bound to each node")
	flag.IntVar(&o.Clients, "clients", 3, "informer processes per node (pods typed and metadata-only, services, EndpointSlices; half with watch-list)")
	flag.IntVar(&o.Services, "services", 200, "services in the cluster")
	flag.DurationVar(&o.ChurnTime, "churn-time", 30*time.Second, "how long the steady churn phase runs per point")
	flag.Float64Var(&o.PodChurn, "pod-churn", 2, "pod updates per second per node during churn")
	flag.Float64Var(&o.ServiceChurn, "service-churn", 5, "service updates per second during churn")
	flag.BoolVar(&o.Recovery, "recovery", true, "restart kube-apiserver after the churn of each point")
	out := flag.String("out", benchplot.DefaultDir, "directory for the results (JSON) and charts (PNG)")
	flag.Parse()
	for _, s := range strings.Split(*nodes, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench-scale: -nodes %q: %v\n", *nodes, err)
			os.Exit(2)
		}
		o.Nodes = append(o.Nodes, k)
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench-scale: needs root for the sandbox's network namespaces")
		os.Exit(2)
	}
	o.Logf = func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "%s bench-scale: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	res, err := scale.Run(ctx, o)
	if res != nil && len(res.Points) > 0 {
		Print(os.Stdout, res)
		files, werr := scale.WriteFiles(benchplot.Dir(*out), res)
		for _, f := range files {
			fmt.Println("wrote", f)
		}
		if werr != nil {
			fmt.Fprintf(os.Stderr, "bench-scale: %v\n", werr)
		}
	}
	fmt.Printf("bench-scale took %v\n", time.Since(start).Round(time.Second))
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench-scale: %v\n", err)
		os.Exit(1)
	}
}

// Print writes the measured points and the model.
func Print(w *os.File, res *scale.Results) {
	fmt.Fprintf(w, "\nkube-apicache bench-scale, %s, commit %s, %s\n", res.Date, res.Commit, res.Machine)
	o := res.Options
	fmt.Fprintf(w, "%d pods and %d informer processes per node, %d services; churn %v at %.1f pod updates/s per node and %.1f service updates/s\n\n",
		o.PodsPerNode, o.Clients, o.Services, o.ChurnTime, o.PodChurn, o.ServiceChurn)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "nodes\tpath\tstorm s\tstorm CPU-s\tstorm MB\tstorm requests\tchurn CPU-s\tchurn MB\twatches\tRSS MiB\trecovery s\trecovery CPU-s\trecovery MB\tetcd requests (storm)\t")
	for _, p := range res.Points {
		rs, rc, rb := "-", "-", "-"
		if p.Recovery != nil {
			rs, rc, rb = fmt.Sprintf("%.1f", p.Recovery.Seconds), fmt.Sprintf("%.2f", p.Recovery.CPUSeconds), fmt.Sprintf("%.1f", p.Recovery.BytesSent/1e6)
		}
		fmt.Fprintf(tw, "%d\t%s\t%.1f\t%.2f\t%.1f\t%.0f\t%.2f\t%.1f\t%.0f\t%.0f\t%s\t%s\t%s\t%.0f\t\n", p.Nodes, p.Mode,
			p.Storm.Seconds, p.Storm.CPUSeconds, p.Storm.BytesSent/1e6, total(p.Storm.Requests),
			p.Churn.CPUSeconds, p.Churn.BytesSent/1e6, p.Churn.Watches, p.Churn.RSSBytes/(1<<20), rs, rc, rb, p.Storm.EtcdRequests)
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "\nrequests by verb (storm), per point:")
	for _, p := range res.Points {
		fmt.Fprintf(w, "  %d nodes, %s: %s\n", p.Nodes, p.Mode, verbs(p.Storm.Requests))
	}
	fmt.Fprintln(w, "\nwatches kube-apiserver holds, with agents: base (no agent, no client) -> agents idle -> clients synced; the agents' cache watches")
	for _, p := range res.Points {
		if p.Mode == "agent" {
			fmt.Fprintf(w, "  %d nodes: %.0f -> %.0f -> %.0f; cache watches %.0f (%.1f per node)\n", p.Nodes, p.BaseWatches, p.IdleWatches, p.Storm.Watches, p.CacheWatches, p.CacheWatches/float64(p.Nodes))
		}
	}
	fmt.Fprintf(w, "\ncost model (least squares against the node count; per node = slope):\n%s", scale.Model(res.Fits))
	if res.Limit != "" {
		fmt.Fprintf(w, "stopped at: %s\n", res.Limit)
	}
}

func total(m map[string]float64) float64 {
	var t float64
	for _, v := range m {
		t += v
	}
	return t
}

func verbs(m map[string]float64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %.0f", k, m[k])
	}
	return strings.Join(parts, ", ")
}
