// Package scale measures what kube-apiserver pays per node, with the agent
// on every node and without it: K simulated nodes (sandbox.SimNode), each
// with its own Node, its pods, its agent and M informer processes of a
// DaemonSet-like workload (this node's pods, typed and metadata-only, the
// cluster's services and EndpointSlices; half with watch-list, half with
// list and watch), against one sandbox control plane. For each K it runs
// three phases along both paths: a start-up storm (every node's clients at
// once), steady churn (pod updates on every node, service updates), and a
// kube-apiserver restart; it reads kube-apiserver's CPU and RSS from /proc
// and its watches, bytes, requests by verb and etcd requests from its
// /metrics, then fits a line to each figure against K (model.go).
//
// make bench-scale runs it (e2e/benchscale); the e2e suite runs a small
// variant (TestScaleHarness).
package scale

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// Namespace holds the harness's pods, services and clients.
const Namespace = "scale"

// CachedResources are the resources the clients read and the agents pin:
// the cache's upstream watches per node.
var CachedResources = []string{"pods", "services", "endpointslices.discovery.k8s.io"}

// Options shape a run.
type Options struct {
	// BinDir holds the control-plane binaries.
	BinDir string `json:"-"`
	// Binaries are the agent and the pod client; built when empty.
	Binaries sandbox.Binaries `json:"-"`
	// Nodes are the node counts measured, in increasing order.
	Nodes []int
	// PodsPerNode are the pods bound to each node.
	PodsPerNode int
	// Clients are the informer processes per node.
	Clients int
	// Services are the services in the cluster (churned in phase b).
	Services int
	// ChurnTime is how long phase b runs; PodChurn its pod updates per
	// second per node, ServiceChurn its service updates per second.
	ChurnTime              time.Duration
	PodChurn, ServiceChurn float64
	// Recovery runs phase c (a kube-apiserver restart).
	Recovery bool
	// Logf receives progress; nil discards it.
	Logf func(format string, args ...any) `json:"-"`
}

// Phase is what kube-apiserver spent in one phase.
type Phase struct {
	Seconds    float64 `json:"seconds"`
	CPUSeconds float64 `json:"apiserverCPUSeconds"`
	// BytesSent are response bodies and watch events.
	BytesSent    float64            `json:"apiserverBytesSent"`
	Requests     map[string]float64 `json:"requestsByVerb"`
	EtcdRequests float64            `json:"etcdRequests"`
	// Watches are those kube-apiserver holds at the phase's end.
	Watches  float64 `json:"watchesHeld"`
	RSSBytes float64 `json:"apiserverRSSBytes"`
	// Synced and Failed count the storm's clients; SyncedAt is when each
	// synced, in seconds from the start.
	Synced int `json:"synced,omitempty"`
	// WindowSeconds is how long the recovery phase was counted.
	WindowSeconds float64   `json:"windowSeconds,omitempty"`
	Failed        int       `json:"failed,omitempty"`
	SyncedAt      []float64 `json:"syncedAtSeconds,omitempty"`
}

// Point is one node count along one path.
type Point struct {
	Nodes int `json:"nodes"`
	// Mode is "agent" (every node runs the agent) or "direct".
	Mode string `json:"mode"`
	// BaseWatches: kube-apiserver's watches with no agent and no client;
	// IdleWatches: with the agents (if any) running, before the clients.
	BaseWatches float64 `json:"baseWatches"`
	IdleWatches float64 `json:"idleWatches"`
	// CacheWatches sums the agents' kube_apicache_cache_upstream_watches.
	CacheWatches float64 `json:"cacheWatches,omitempty"`
	Storm        Phase   `json:"storm"`
	Churn        Phase   `json:"churn"`
	Recovery     *Phase  `json:"recovery,omitempty"`
}

// Results are a whole run.
type Results struct {
	Date    string  `json:"date"`
	Commit  string  `json:"commit"`
	Machine string  `json:"machine"`
	Options Options `json:"options"`
	Points  []Point `json:"points"`
	Fits    []Fit   `json:"fits"`
	// Limit says why larger node counts were not measured.
	Limit string `json:"limit,omitempty"`
}

// harness is one run's state.
type harness struct {
	o         Options
	c         *sandbox.Cluster
	bins      sandbox.Binaries
	nodes     []*simNode
	admin     kubernetes.Interface
	apiserver *sandbox.APIServer
}

type simNode struct {
	*sandbox.SimNode
	agentPod, client *sandbox.Pod
	cert, key        string
	agent            *sandbox.Agent
	pods             []string
}

func (h *harness) logf(format string, args ...any) {
	if h.o.Logf != nil {
		h.o.Logf(format, args...)
	}
}

// Run starts a sandbox, measures every node count along both paths and
// returns the results; the caller prints and charts them.
func Run(ctx context.Context, o Options) (*Results, error) {
	if len(o.Nodes) == 0 || !slices.IsSorted(o.Nodes) || o.Nodes[0] < 1 || o.Nodes[len(o.Nodes)-1] > sandbox.MaxSimNodes {
		return nil, fmt.Errorf("node counts %v: need increasing counts from 1 to %d", o.Nodes, sandbox.MaxSimNodes)
	}
	if o.Clients < 1 || o.PodsPerNode < 0 || o.Services < 1 || o.ChurnTime <= 0 {
		return nil, errors.New("need at least one client per node, one service and a positive churn time")
	}
	tmp, err := os.MkdirTemp("", "kube-apicache-scale-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	h := &harness{o: o, bins: o.Binaries}
	if h.bins.Agent == "" || h.bins.PodClient == "" {
		if h.bins, err = sandbox.BuildBinaries(tmp); err != nil {
			return nil, err
		}
	}
	startCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	h.logf("starting the sandbox")
	if h.c, err = sandbox.Start(startCtx, sandbox.Options{BinDir: o.BinDir, APIServers: 1, Logf: h.logf}); err != nil {
		return nil, err
	}
	defer func() {
		h.stopAgents()
		if err := h.c.Stop(); err != nil {
			h.logf("teardown: %v", err)
		}
	}()
	h.apiserver = h.c.APIServers()[0]
	cfg := rest.CopyConfig(h.c.AdminConfig)
	cfg.QPS, cfg.Burst = 500, 1000
	if h.admin, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, err
	}
	if err := h.setUp(ctx); err != nil {
		return nil, err
	}
	res := &Results{Date: time.Now().UTC().Format(time.RFC3339), Commit: commit(), Machine: machine(), Options: o}
	for _, k := range o.Nodes {
		if err := h.addNodes(ctx, k); err != nil {
			res.Limit = fmt.Sprintf("adding node %d: %v", len(h.nodes)+1, err)
			return res, err
		}
		for _, mode := range []string{"direct", "agent"} {
			h.logf("%d nodes, %s", k, mode)
			p, err := h.point(ctx, mode)
			if err != nil {
				return res, fmt.Errorf("%d nodes, %s: %w", k, mode, err)
			}
			res.Points = append(res.Points, p)
		}
	}
	res.Fits = Fits(res.Points)
	return res, nil
}

// setUp creates the namespace, the clients' RBAC and the services.
func (h *harness) setUp(ctx context.Context) error {
	if err := h.c.EnsureNamespace(ctx, Namespace); err != nil {
		return err
	}
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "scale-client"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods", "services"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch"}},
		},
	}
	if _, err := h.admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "scale-client"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "scale-client", Namespace: Namespace}},
	}
	if _, err := h.admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return parallel(ctx, h.o.Services, func(ctx context.Context, i int) error {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("svc-%d", i), Namespace: Namespace},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}
		_, err := h.admin.CoreV1().Services(Namespace).Create(ctx, svc, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			err = nil
		}
		return err
	})
}

// addNodes adds simulated nodes, each with its pods, its agent's pod and
// its clients' pod, until there are k.
func (h *harness) addNodes(ctx context.Context, k int) error {
	for len(h.nodes) < k {
		i := len(h.nodes) + 1
		sn, err := h.c.AddSimNode(ctx, i)
		if err != nil {
			return err
		}
		n := &simNode{SimNode: sn}
		if n.agentPod, n.cert, n.key, err = h.c.NewSimAgentPod(ctx, fmt.Sprintf("kube-apicache-%s", sn.Name), sn); err != nil {
			return err
		}
		if n.client, err = h.c.NewPod(ctx, sandbox.PodSpec{Name: "clients-" + sn.Name, Namespace: Namespace, ServiceAccount: "scale-client", HostNetwork: true, Node: sn}); err != nil {
			return err
		}
		n.pods = make([]string, h.o.PodsPerNode)
		err = parallel(ctx, h.o.PodsPerNode, func(ctx context.Context, j int) error {
			name := fmt.Sprintf("%s-pod-%d", sn.Name, j)
			n.pods[j] = name
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace, Labels: map[string]string{"app": "scale", "node": sn.Name}},
				Spec: corev1.PodSpec{NodeName: sn.Name, Containers: []corev1.Container{{Name: "main", Image: "sandbox.invalid/scale:latest",
					Env: []corev1.EnvVar{{Name: "INDEX", Value: strconv.Itoa(j)}}}}},
			}
			if _, err := h.admin.CoreV1().Pods(Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				return err
			}
			return nil
		})
		if err != nil {
			return err
		}
		h.nodes = append(h.nodes, n)
	}
	return nil
}

// point measures the current node count along one path.
func (h *harness) point(ctx context.Context, mode string) (Point, error) {
	p := Point{Nodes: len(h.nodes), Mode: mode}
	var err error
	settle(2 * time.Second)
	if p.BaseWatches, err = h.watches(ctx); err != nil {
		return p, err
	}
	if mode == "agent" {
		if err := h.startAgents(ctx); err != nil {
			return p, err
		}
		defer h.stopAgents()
		settle(3 * time.Second)
	}
	if p.IdleWatches, err = h.watches(ctx); err != nil {
		return p, err
	}
	clients, storm, err := h.storm(ctx)
	defer clients.stop()
	if err != nil {
		return p, err
	}
	p.Storm = storm
	if p.Churn, err = h.churn(ctx); err != nil {
		return p, err
	}
	if mode == "agent" {
		if p.CacheWatches, err = h.cacheWatches(ctx); err != nil {
			return p, err
		}
	}
	if h.o.Recovery {
		rec, err := h.recovery(ctx)
		if err != nil {
			return p, err
		}
		p.Recovery = &rec
	}
	return p, nil
}

// agentArgs runs the agent as shipped but for what the sandbox needs, with
// the clients' resources pinned: a DaemonSet's informers find a warm cache,
// as on nodes where the agent was there first.
func (h *harness) agentArgs(n *simNode) []string {
	return h.c.AgentArgs(n.cert, n.key, "--node-name="+n.Name, "--cache-pinned-resources="+strings.Join(CachedResources, ","), "-v=1")
}

func (h *harness) startAgents(ctx context.Context) error {
	return parallel(ctx, len(h.nodes), func(ctx context.Context, i int) error {
		n := h.nodes[i]
		a, err := h.c.StartAgent(ctx, n.agentPod, h.bins.Agent, h.agentArgs(n)...)
		if err != nil {
			return fmt.Errorf("agent on %s: %w", n.Name, err)
		}
		n.agent = a
		return nil
	})
}

func (h *harness) stopAgents() {
	var wg sync.WaitGroup
	for _, n := range h.nodes {
		if a := n.agent; a != nil {
			n.agent = nil
			wg.Go(func() { a.Process.Stop(30 * time.Second) })
		}
	}
	wg.Wait()
}

// cacheWatches sums the agents' upstream cache watches.
func (h *harness) cacheWatches(ctx context.Context) (float64, error) {
	var total float64
	for _, n := range h.nodes {
		text, err := n.agent.Metrics(ctx)
		if err != nil {
			return 0, err
		}
		for name, v := range scrape(text, "kube_apicache_cache_upstream_watches") {
			if strings.HasPrefix(name, "kube_apicache_cache_upstream_watches{") {
				total += v
			}
		}
	}
	return total, nil
}

// clients are the informer processes of every node.
type clients struct {
	cmds  []*exec.Cmd
	stdin []io.WriteCloser
	wg    sync.WaitGroup
}

func (c *clients) stop() {
	if c == nil {
		return
	}
	for _, in := range c.stdin {
		_ = in.Close()
	}
	for _, cmd := range c.cmds {
		if cmd.Process != nil {
			_ = cmd.Process.Kill()
		}
	}
	c.wg.Wait()
	for _, cmd := range c.cmds {
		_ = cmd.Wait()
	}
}

// storm starts every node's clients at once and waits until all have
// synced (or failed).
func (h *harness) storm(ctx context.Context) (*clients, Phase, error) {
	before, err := h.snapshot(ctx)
	if err != nil {
		return nil, Phase{}, err
	}
	cs := &clients{}
	var mu sync.Mutex
	var syncedAt []float64
	failed := 0
	start := time.Now()
	for _, n := range h.nodes {
		for j := range h.o.Clients {
			// Half the clients start with a watch-list, half with a list
			// and a watch.
			cmd := n.client.Command(ctx, h.bins.PodClient, "informers", "--protobuf", "--endpointslices", "--timeout=30m")
			cmd.Env = append(cmd.Env, fmt.Sprintf("KUBE_FEATURE_WatchListClient=%t", j%2 == 0))
			in, err := cmd.StdinPipe()
			if err != nil {
				return cs, Phase{}, err
			}
			out, err := cmd.StdoutPipe()
			if err != nil {
				return cs, Phase{}, err
			}
			if err := cmd.Start(); err != nil {
				return cs, Phase{}, err
			}
			cs.cmds, cs.stdin = append(cs.cmds, cmd), append(cs.stdin, in)
			cs.wg.Go(func() {
				sc := bufio.NewScanner(out)
				ok := false
				for sc.Scan() {
					if !ok && strings.HasPrefix(sc.Text(), "SYNCED") {
						ok = true
						mu.Lock()
						syncedAt = append(syncedAt, time.Since(start).Seconds())
						mu.Unlock()
					}
				}
				if !ok {
					mu.Lock()
					failed++
					mu.Unlock()
				}
			})
		}
	}
	total := len(cs.cmds)
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 5*time.Minute, true, func(context.Context) (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return len(syncedAt)+failed >= total, nil
	})
	elapsed := time.Since(start)
	if err != nil {
		return cs, Phase{}, fmt.Errorf("storm: %d of %d clients synced in %v", len(syncedAt), total, elapsed)
	}
	settle(2 * time.Second) // the watches that follow the lists open
	after, err := h.snapshot(ctx)
	if err != nil {
		return cs, Phase{}, err
	}
	ph := after.since(before)
	ph.Seconds = elapsed.Seconds()
	mu.Lock()
	ph.Synced, ph.Failed, ph.SyncedAt = len(syncedAt), failed, slices.Sorted(slices.Values(syncedAt))
	mu.Unlock()
	if ph.Failed > 0 {
		return cs, ph, fmt.Errorf("storm: %d of %d clients failed", ph.Failed, total)
	}
	return cs, ph, nil
}

// churn updates pods on every node and services for ChurnTime, in loops
// that end by themselves.
func (h *harness) churn(ctx context.Context) (Phase, error) {
	before, err := h.snapshot(ctx)
	if err != nil {
		return Phase{}, err
	}
	start := time.Now()
	// The loops stop at the deadline; a write under way finishes.
	churning, cancel := context.WithTimeout(ctx, h.o.ChurnTime)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	loop := func(rate float64, write func(ctx context.Context, i int) error) {
		if rate <= 0 {
			return
		}
		wg.Go(func() {
			t := time.NewTicker(time.Duration(float64(time.Second) / rate))
			defer t.Stop()
			for i := 0; ; i++ {
				select {
				case <-churning.Done():
					return
				case <-t.C:
				}
				if err := write(ctx, i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
			}
		})
	}
	patch := func(i int) []byte { return fmt.Appendf(nil, `{"metadata":{"annotations":{"scale/churn":"%d"}}}`, i) }
	for _, n := range h.nodes {
		if len(n.pods) == 0 {
			continue
		}
		loop(h.o.PodChurn, func(ctx context.Context, i int) error {
			_, err := h.admin.CoreV1().Pods(Namespace).Patch(ctx, n.pods[i%len(n.pods)], types.MergePatchType, patch(i), metav1.PatchOptions{})
			return err
		})
	}
	loop(h.o.ServiceChurn, func(ctx context.Context, i int) error {
		_, err := h.admin.CoreV1().Services(Namespace).Patch(ctx, fmt.Sprintf("svc-%d", i%h.o.Services), types.MergePatchType, patch(i), metav1.PatchOptions{})
		return err
	})
	wg.Wait()
	if len(errs) > 0 {
		return Phase{}, fmt.Errorf("churn: %w", errors.Join(errs...))
	}
	settle(time.Second)
	after, err := h.snapshot(ctx)
	if err != nil {
		return Phase{}, err
	}
	ph := after.since(before)
	ph.Seconds = time.Since(start).Seconds()
	return ph, nil
}

// recoveryWindow is how long after a restart kube-apiserver's work is
// counted, the same along both paths so that the figures compare; longer
// only if the watches take longer to come back.
const recoveryWindow = 45 * time.Second

// recovery restarts kube-apiserver and measures the new process over
// recoveryWindow from its start (its counters start at zero). Seconds is
// how long until it held as many watches of pods, services and
// EndpointSlices (the clients' and the agents') as before; the other
// resources' watches are kube-controller-manager's, whose client-go
// back-off alone decides when they return.
func (h *harness) recovery(ctx context.Context) (Phase, error) {
	before, err := h.snapshot(ctx)
	if err != nil {
		return Phase{}, err
	}
	tracked := []string{"pods", "services", "endpointslices"}
	h.c.StopAPIServer(h.apiserver)
	settle(2 * time.Second)
	start := time.Now()
	if err := h.c.StartAPIServer(ctx, h.apiserver); err != nil {
		return Phase{}, err
	}
	var now snapshot
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		if now, err = h.snapshot(ctx); err != nil {
			return false, nil
		}
		for _, r := range tracked {
			if now.watchesBy[r] < before.watchesBy[r] {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return Phase{}, fmt.Errorf("recovery: watches missing after %v: %v", time.Since(start).Round(time.Second), missing(before.watchesBy, now.watchesBy))
	}
	converged := time.Since(start)
	settle(max(recoveryWindow-converged, 5*time.Second))
	snap, err := h.snapshot(ctx)
	if err != nil {
		return Phase{}, err
	}
	ph := snap.since(snapshot{requests: map[string]float64{}})
	ph.Seconds = converged.Seconds()
	ph.WindowSeconds = time.Since(start).Seconds()
	return ph, nil
}

func settle(d time.Duration) { time.Sleep(d) }

// missing returns the watches by resource that now has fewer of than
// before.
func missing(before, now map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for r, n := range before {
		if d := n - now[r]; d > 0 {
			out[r] = d
		}
	}
	return out
}

// parallel runs fn for 0..n-1, 16 at a time, and returns the first error.
func parallel(ctx context.Context, n int, fn func(context.Context, int) error) error {
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := fn(ctx, i); err != nil {
				once.Do(func() { first = err })
			}
		})
	}
	wg.Wait()
	return first
}
