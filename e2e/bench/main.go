// Command bench measures cached reads through kube-apicache against the
// same reads sent straight to kube-apiserver, in one sandbox run (make
// bench). It starts the sandbox and the agent, fills the cluster (pods, most
// of them on other nodes, and services), then, from a sandbox pod with its
// own token, sends the same requests through the Service VIP (the agent) and
// to the apiserver endpoint directly, and prints side by side:
//
//   - p50 and p99 latency and their ratio (agent/direct);
//   - kube-apiserver CPU-seconds per 1,000 requests;
//   - upstream requests per 1,000 client requests (kube-apiserver's audit
//     log: every request of the client or of the agent);
//   - heap per cached pod: the agent's cache against a plain client-go typed
//     informer over the same pods;
//   - the watch cases (watch.go): kube-apiserver's cost of steady churn
//     under many informers, event latency, and the agent's heap per
//     watcher;
//   - forwarded writes (writes.go): create, update, patch and delete
//     through the agent against direct;
//   - staleness (staleness.go): after a write made directly, how long
//     until a resourceVersion=0 read and an informer see it, through the
//     agent against direct;
//   - cold start (coldstart.go): an agent's start to ready with the
//     cluster full, with a certificate file and through the CSR API;
//   - rewrite idle (rewrite.go): what an agent's rewrite profiles cost
//     the callers they do not select, through an agent with a profile
//     against one without.
//
// It asserts nothing: it prints what it measured, and writes every figure
// to a results file (JSON) and latency CDFs and the storm's timeline as
// charts (PNG) under -out (results.go).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"syscall"
	"time"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

type options struct {
	binDir    string
	pods      int
	nodePods  int
	otherNode int
	services  int
	requests  int
	inflight  int
	warmup    int
	copies    int
	accept    string
	// storm is how many informer processes start at once in the storm case.
	storm int
	// cases selects the measured cases by name.
	cases *regexp.Regexp
	// profileDir, when set, receives a CPU profile of the agent per case,
	// each over profileTime.
	profileDir  string
	profileTime time.Duration
	// approverCSRs is how many CSRs the approver case creates (0 skips it).
	approverCSRs int
	// natServices and natEndpoints shape the nat table of the rule sync
	// case, measured over natWindow per table.
	natServices, natEndpoints int
	natWindow                 time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.binDir, "bin-dir", sandbox.DefaultBinDir(), "directory holding etcd, kube-apiserver and kube-controller-manager")
	flag.IntVar(&o.pods, "pods", 5000, "pods in the cluster")
	flag.IntVar(&o.nodePods, "node-pods", 110, "of those, pods on the agent's node")
	flag.IntVar(&o.otherNode, "other-nodes", 50, "nodes the remaining pods are spread over")
	flag.IntVar(&o.services, "services", 1000, "services in the cluster")
	flag.IntVar(&o.requests, "requests", 1000, "measured requests per case and path")
	flag.IntVar(&o.inflight, "inflight", 4, "requests in flight per case")
	flag.IntVar(&o.warmup, "warmup", 20, "unmeasured requests before each case")
	flag.IntVar(&o.copies, "heap-copies", 10, "independent caches built to measure heap per pod (more is steadier)")
	flag.StringVar(&o.accept, "accept", "application/vnd.kubernetes.protobuf, application/json", "Accept header of the measured requests")
	flag.IntVar(&o.storm, "storm-informers", 50, "informer processes started at once in the start-up storm case (0 skips it)")
	flag.IntVar(&o.natServices, "nat-services", 10000, "Services in the kube-proxy-shaped nat table of the rule sync case (\"nat sync\"; 0 skips it)")
	flag.IntVar(&o.natEndpoints, "nat-endpoints", 10, "endpoints per Service in the rule sync case")
	flag.DurationVar(&o.natWindow, "nat-window", 30*time.Second, "how long the rule sync case watches the agent, per nat table")
	flag.IntVar(&o.approverCSRs, "approver-csrs", 1000, "agent-shaped CSRs the approver case (\""+approverCase+"\") has approved; 0 skips it; -cases approver runs it alone")
	cases := flag.String("cases", "", "regular expression selecting the measured cases by name (default all), e.g. 'node pods'")
	flag.StringVar(&o.profileDir, "agent-profile", "", "directory to write a CPU profile of the agent into for each case (<case>.pprof, for go tool pprof), taken over -agent-profile-time of the case's requests after its measured ones; runs the agent with --profiling")
	flag.DurationVar(&o.profileTime, "agent-profile-time", 10*time.Second, "how long each -agent-profile profile runs")
	flag.Parse()
	var err error
	if o.cases, err = regexp.Compile(*cases); err != nil {
		fmt.Fprintf(os.Stderr, "bench: -cases: %v\n", err)
		os.Exit(2)
	}
	if o.profileDir != "" {
		if o.profileTime < time.Second {
			fmt.Fprintln(os.Stderr, "bench: -agent-profile-time must be at least 1s")
			os.Exit(2)
		}
		if err := os.MkdirAll(o.profileDir, 0o755); err != nil {
			fmt.Fprintf(os.Stderr, "bench: -agent-profile: %v\n", err)
			os.Exit(2)
		}
	}
	if o.nodePods > o.pods || o.requests <= 0 || o.inflight <= 0 || o.otherNode <= 0 || o.copies <= 0 {
		fmt.Fprintln(os.Stderr, "bench: need 0 < node-pods <= pods, and positive requests, inflight, other-nodes and heap-copies")
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(1)
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s bench: "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func run(ctx context.Context, o options) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root for the sandbox's network namespaces")
	}
	tmp, err := os.MkdirTemp("", "kube-apicache-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	logf("building the agent")
	bins, err := sandbox.BuildBinaries(tmp)
	if err != nil {
		return err
	}
	startCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	logf("starting the sandbox")
	c, err := sandbox.Start(startCtx, sandbox.Options{BinDir: o.binDir, APIServers: 1, Logf: logf})
	if err != nil {
		return err
	}
	defer func() {
		if err := c.Stop(); err != nil {
			logf("teardown: %v", err)
		}
	}()

	if o.approverCSRs > 0 && o.cases.MatchString(approverCase) {
		if err := benchApprover(ctx, c, bins.Agent, o.approverCSRs); err != nil {
			return err
		}
		if approverOnly(o.cases) {
			return nil
		}
	}
	b := &bench{o: o, c: c, podclient: bins.PodClient, dir: tmp}
	return b.run(ctx, bins.Agent)
}
