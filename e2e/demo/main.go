// Command demo starts the sandbox cluster and kube-apicache on its node, runs
// a sample pod that uses kubectl and a client-go program through the
// kubernetes Service VIP, and shows what the agent is for: node-local reads
// and watch-list informers answered from its cache, the latency of a read
// through the agent and directly, and the kube-apiserver reads it saved. It
// tears everything down on Ctrl-C, or after --duration.
//
// By default the node is a real one (real.go): containerd, a kubelet and
// kube-proxy, with the DaemonSet installed by `kubectl apply -k` of
// manifests/ and client pods the kubelet runs from the client image.
// --emulated runs it on the sandbox's emulated node instead: pods are
// processes in network namespaces and the agent a process.
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

const (
	demoNS = "demo"
	// readerRole lets the sample pod read pods and services cluster-wide,
	// as a node-local agent (a CNI, a log shipper) would.
	readerRole = "kube-apicache-demo-reader"
	// nodePodsPath is the list a node-local agent makes: this node's pods.
	nodePodsPath = "/api/v1/pods?fieldSelector=spec.nodeName%3D" + sandbox.NodeName
	// latencyRounds is the number of sequential GETs per path and
	// resourceVersion mode.
	latencyRounds = 200
)

func main() {
	duration := flag.Duration("duration", 0, "stop after this long (0: run until Ctrl-C)")
	binDir := flag.String("bin-dir", sandbox.DefaultBinDir(), "directory holding etcd, kube-apiserver and kube-controller-manager")
	emulated := flag.Bool("emulated", false, "run on the sandbox's emulated node (pods are processes in network namespaces, the agent a process) instead of a real kubelet with the DaemonSet")
	imagesDir := flag.String("images-dir", sandbox.RealNodeImagesDir(), "directory holding the OCI image archives of make image e2e-images (real node)")
	flag.Parse()
	var err error
	if *emulated {
		err = runEmulated(*duration, *binDir)
	} else {
		err = runReal(*duration, *binDir, *imagesDir)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		os.Exit(1)
	}
}

func runEmulated(duration time.Duration, binDir string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	tmp, err := os.MkdirTemp("", "kube-apicache-demo-bin-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	step("Building kube-apicache and the sample client")
	bins, err := sandbox.BuildBinaries(tmp)
	if err != nil {
		return err
	}

	step("Starting etcd, kube-apiserver and kube-controller-manager in network namespaces")
	c, err := sandbox.Start(ctx, sandbox.Options{BinDir: binDir, Logf: func(f string, a ...any) { fmt.Printf("   "+f+"\n", a...) }})
	if err != nil {
		return err
	}
	defer func() {
		step("Tearing down the sandbox")
		if err := c.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "demo: teardown: %v\n", err)
		}
	}()

	step("Starting kube-apicache on the node (hostNetwork pod with its own ServiceAccount)")
	agentPod, certFile, keyFile, err := c.NewAgentPod(ctx, "kube-apicache-demo")
	if err != nil {
		return err
	}
	agent, err := c.StartAgent(ctx, agentPod, bins.Agent, c.AgentArgs(certFile, keyFile)...)
	if err != nil {
		return err
	}
	defer agent.Process.Stop(40 * time.Second)
	nat, _, err := c.NodeNetState(ctx)
	if err != nil {
		return err
	}
	fmt.Println("   node nat rules now:")
	for _, l := range strings.Split(nat, "\n") {
		if strings.HasPrefix(l, "-A") {
			fmt.Println("     " + l)
		}
	}

	step("Creating a sample pod (namespace demo) with only its ServiceAccount volume")
	pod, err := c.NewPod(ctx, sandbox.PodSpec{Name: "sample", Namespace: demoNS, ServiceAccount: "sample"})
	if err != nil {
		return err
	}
	if err := pod.Grant(ctx, "edit"); err != nil {
		return err
	}
	if err := pod.WaitAllowed(ctx, "create", "configmaps"); err != nil {
		return err
	}
	for _, args := range [][]string{
		{"kubectl", "create", "configmap", "hello", "--from-literal=greeting=hi"},
		{"kubectl", "get", "configmaps"},
		{"kubectl", "delete", "configmap", "hello"},
		{bins.PodClient, "crud", "--name", "from-client-go"},
	} {
		printCommand(args, "")
		out, err := pod.Command(ctx, args[0], args[1:]...).CombinedOutput()
		printIndented(string(out))
		if err != nil {
			return fmt.Errorf("%s: %w", args[0], err)
		}
	}
	infCtx, stopInf := context.WithTimeout(ctx, 3*time.Second)
	fmt.Println("   pod$ podclient informer (3s)")
	out, _ := pod.Command(infCtx, bins.PodClient, "informer").CombinedOutput()
	stopInf()
	printIndented(string(out))

	step("Creating node-local objects: 3 pods bound to " + sandbox.NodeName + " (nothing runs them), 3 services")
	written, err := createNodeObjects(ctx, c, pod)
	if err != nil {
		return err
	}
	if err := waitCacheCaughtUp(ctx, agent.Metrics, written); err != nil {
		return err
	}
	fmt.Printf("   granted %s/%s ClusterRole %s (get, list, watch pods and services); cache has caught up\n",
		demoNS, pod.Spec.ServiceAccount, readerRole)

	step("A node-local list, answered from the cache")
	for _, cmd := range []struct {
		args []string
		note string
		show func(string) string
	}{
		{args: []string{"kubectl", "get", "--raw", nodePodsPath}, show: summarizeList},
		{args: []string{"kubectl", "get", "pods", "-A", "--field-selector=spec.nodeName=" + sandbox.NodeName, "-o", "name"}},
		{args: []string{"kubectl", "get", "pods", "-A", "--field-selector=spec.nodeName=" + sandbox.NodeName},
			note: "a Table of a built-in type: forwarded by design, the agent has no kube-apiserver printers"},
	} {
		before, err := cacheOutcomes(ctx, agent.Metrics)
		if err != nil {
			return err
		}
		printCommand(cmd.args, cmd.note)
		out, err := pod.Command(ctx, cmd.args[0], cmd.args[1:]...).CombinedOutput()
		if err != nil {
			printIndented(string(out))
			return fmt.Errorf("%s: %w", cmd.args[0], err)
		}
		if cmd.show != nil {
			printIndented(cmd.show(string(out)))
		} else {
			printIndented(string(out))
		}
		after, err := cacheOutcomes(ctx, agent.Metrics)
		if err != nil {
			return err
		}
		fmt.Println("     -> agent: " + describeDelta(before, after))
	}

	step("A watch-list informer, answered from the cache (podclient informers)")
	before, err := cacheOutcomes(ctx, agent.Metrics)
	if err != nil {
		return err
	}
	if err := runInformers(ctx, pod, bins.PodClient); err != nil {
		return err
	}
	after, err := cacheOutcomes(ctx, agent.Metrics)
	if err != nil {
		return err
	}
	fmt.Println("     -> agent: " + describeDelta(before, after))

	step(fmt.Sprintf("Latency from the pod: %d sequential GETs of this node's pods, through the agent and directly", latencyRounds))
	if err := compareLatency(ctx, c, pod, agent); err != nil {
		return err
	}

	text, err := agent.Metrics(ctx)
	if err != nil {
		return err
	}
	families, err := parseMetrics(text)
	if err != nil {
		return err
	}
	step("Requests the agent handled (kube_apicache_requests_total)")
	printRequests(os.Stdout, families)
	fmt.Println("   (a watch-list the cache answered also counts as a forwarded watch: the plain watch it continues with upstream)")
	step("What the cache did with them (kube_apicache_cache_requests_total)")
	printCacheOutcomes(os.Stdout, families)
	step("kube-apiserver reads saved")
	printSaved(os.Stdout, families)

	if duration > 0 {
		step(fmt.Sprintf("Running for %s (sandbox in %s)", duration, c.Dir))
		select {
		case <-ctx.Done():
		case <-time.After(duration):
		}
	} else {
		step("Sandbox running in " + c.Dir + "; press Ctrl-C to tear down")
		<-ctx.Done()
	}
	return nil
}

func step(s string) { fmt.Printf("==> %s\n", s) }

func shortName(p string) string {
	if i := strings.LastIndex(p, "/"); i >= 0 {
		return p[i+1:]
	}
	return p
}

// printCommand prints args as typed in the pod, with an optional note.
func printCommand(args []string, note string) {
	words := []string{shortName(args[0])}
	for _, a := range args[1:] {
		if strings.ContainsAny(a, "?&*' ") {
			a = "'" + a + "'"
		}
		words = append(words, a)
	}
	fmt.Println("   pod$ " + strings.Join(words, " "))
	if note != "" {
		fmt.Println("     (" + note + ")")
	}
}

func printIndented(s string) {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return
	}
	for _, l := range strings.Split(s, "\n") {
		fmt.Println("     " + l)
	}
}

// createNodeObjects creates pods bound to the sandbox node and services in
// the demo namespace, and lets pod read pods and services cluster-wide.
// It returns the resourceVersion of the last pod and service written.
func createNodeObjects(ctx context.Context, c *sandbox.Cluster, pod *sandbox.Pod) (map[string]float64, error) {
	written := map[string]float64{}
	wrote := func(res string, obj metav1.Object) error {
		rv, err := strconv.ParseFloat(obj.GetResourceVersion(), 64)
		if err != nil {
			return fmt.Errorf("resourceVersion of %s %s: %w", res, obj.GetName(), err)
		}
		written[res] = max(written[res], rv)
		return nil
	}
	for _, o := range []struct{ name, app string }{{"web-1", "web"}, {"web-2", "web"}, {"batch-1", "batch"}} {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: o.name, Labels: map[string]string{"app": o.app}},
			Spec: corev1.PodSpec{NodeName: sandbox.NodeName,
				Containers: []corev1.Container{{Name: "main", Image: "sandbox.invalid/none:latest"}}},
		}
		created, err := c.Admin.CoreV1().Pods(demoNS).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("creating pod %s: %w", o.name, err)
		}
		if err := wrote("pods", created); err != nil {
			return nil, err
		}
	}
	for i, name := range []string{"web", "batch", "metrics"} {
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": name},
				Ports: []corev1.ServicePort{{Port: int32(8080 + i)}}},
		}
		created, err := c.Admin.CoreV1().Services(demoNS).Create(ctx, svc, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("creating service %s: %w", name, err)
		}
		if err := wrote("services", created); err != nil {
			return nil, err
		}
	}
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: readerRole},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods", "services"},
			Verbs: []string{"get", "list", "watch"}}},
	}
	if _, err := c.Admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("creating ClusterRole: %w", err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: readerRole},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: readerRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: pod.Spec.ServiceAccount, Namespace: demoNS}},
	}
	if _, err := c.Admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("creating ClusterRoleBinding: %w", err)
	}
	// The binding takes effect asynchronously; wait until it does for every
	// namespace (Pod.WaitAllowed asks for the pod's own, which edit allows).
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, res := range []string{"pods", "services"} {
			sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User:               pod.Username(),
				Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + demoNS, "system:authenticated"},
				ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "watch", Resource: res},
			}}
			got, err := c.Admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
			if err != nil || !got.Status.Allowed {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("waiting for the ClusterRoleBinding to take effect: %w", err)
	}
	return written, nil
}

// waitCacheCaughtUp waits until the agent's pods and services caches have
// synced and reached want, the resourceVersion of the latest write of each
// (the objects were written straight to kube-apiserver, so the agent's
// read-your-writes barrier does not know of them).
func waitCacheCaughtUp(ctx context.Context, metrics func(context.Context) (string, error), want map[string]float64) error {
	var last map[string]float64
	// A wait for the state, not a bound: a cache's first sync can take a
	// while on a machine that is busy with other work.
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		text, err := metrics(ctx)
		if err != nil {
			return false, err
		}
		families, err := parseMetrics(text)
		if err != nil {
			return false, err
		}
		synced := sumBy(families["kube_apicache_cache_synced"], "resource")
		last = sumBy(families["kube_apicache_cache_resource_version"], "resource")
		for res, rv := range want {
			if synced[res] != 1 || last[res] < rv {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("agent cache did not catch up (at %v, want %v): %w", last, want, err)
	}
	return nil
}

// summarizeList shortens a JSON list to its kind, resourceVersion and item
// names.
func summarizeList(out string) string {
	var list struct {
		Kind     string `json:"kind"`
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
		Items []struct {
			Metadata struct {
				Namespace string `json:"namespace"`
				Name      string `json:"name"`
			} `json:"metadata"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		return out
	}
	names := make([]string, 0, len(list.Items))
	for _, it := range list.Items {
		names = append(names, it.Metadata.Namespace+"/"+it.Metadata.Name)
	}
	return fmt.Sprintf("%s at resourceVersion %s, %d items (JSON, %d bytes; summarized):\n  %s",
		list.Kind, list.Metadata.ResourceVersion, len(list.Items), len(out), strings.Join(names, " "))
}

// runInformers runs `podclient informers` with client-go's watch-list
// enabled until its informers (this node's pods, typed and metadata-only,
// and all services) have synced, has it dump their stores once, and stops
// it.
func runInformers(ctx context.Context, pod *sandbox.Pod, podClient string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	fmt.Println("   pod$ KUBE_FEATURE_WatchListClient=true podclient informers")
	cmd := pod.Command(ctx, podClient, "informers", "--timeout=1m")
	cmd.Env = append(cmd.Env, "KUBE_FEATURE_WatchListClient=true")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return err
	}
	objects := map[string]int{}
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 0, 1<<16), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		switch f := strings.Fields(l); {
		case len(f) > 0 && f[0] == "WATCHLIST":
			fmt.Println("     " + l)
		case l == "SYNCED":
			fmt.Printf("     SYNCED (%s after start)\n", time.Since(start).Round(time.Millisecond))
			if _, err := io.WriteString(stdin, "dump\n"); err != nil {
				return err
			}
		case len(f) > 1 && f[0] == "OBJ":
			objects[f[1]]++
		case l == "END":
			// Its informers run until it is told to stop.
			_ = stdin.Close()
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				return err
			}
		}
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("podclient informers: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	var names []string
	for n := range objects {
		names = append(names, n)
	}
	sort.Strings(names)
	var parts []string
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s %d", n, objects[n]))
	}
	fmt.Println("     objects in the informers' stores: " + strings.Join(parts, ", "))
	return nil
}

// compareLatency sends sequential GETs of this node's pods from pod's
// network namespace, alternating between the Service VIP (the agent) and
// the first kube-apiserver, and prints their percentiles.
func compareLatency(ctx context.Context, c *sandbox.Cluster, pod *sandbox.Pod, agent *sandbox.Agent) error {
	ca, err := os.ReadFile(filepath.Join(pod.Dir, "serviceaccount", "ca.crt"))
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return fmt.Errorf("no certificate in the pod's ca.crt")
	}
	return measureLatency(ctx, pod.NetNS.DialContext, pool, pod.Token, c.APIServers()[0].URL, agent.Metrics)
}

// measureLatency sends sequential GETs of this node's pods with token,
// dialled by dial, alternating between the Service VIP (the agent) and
// directURL (a kube-apiserver), and prints their percentiles.
func measureLatency(ctx context.Context, dial func(ctx context.Context, network, addr string) (net.Conn, error),
	pool *x509.CertPool, token, directURL string, metrics func(context.Context) (string, error)) error {
	// One keep-alive client per target, as client-go keeps one.
	newClient := func() *http.Client {
		return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			DialContext: dial, TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true,
		}}
	}
	targets := []struct {
		name string
		base string
		hc   *http.Client
	}{
		{"via agent", fmt.Sprintf("https://%s:%d", sandbox.ServiceVIP, sandbox.ServicePort), newClient()},
		{"direct", directURL, newClient()},
	}
	get := func(hc *http.Client, url string) (time.Duration, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return 0, err
		}
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Accept", "application/json")
		start := time.Now()
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		d := time.Since(start)
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		return d, err
	}
	before, err := cacheOutcomes(ctx, metrics)
	if err != nil {
		return err
	}
	fmt.Printf("   %-22s %-20s %-20s %s\n", "LIST", "VIA AGENT p50/p99", "DIRECT p50/p99", "DIRECT/AGENT p50, p99")
	for _, mode := range []struct{ name, query string }{
		{"resourceVersion=0", "&resourceVersion=0"},
		{"resourceVersion unset", ""},
	} {
		// Warm up connections and the agent's access decisions.
		for _, t := range targets {
			for i := 0; i < 5; i++ {
				if _, err := get(t.hc, t.base+nodePodsPath+mode.query); err != nil {
					return fmt.Errorf("%s: %w", t.name, err)
				}
			}
		}
		lat := make([][]time.Duration, len(targets))
		for i := 0; i < latencyRounds; i++ {
			for j, t := range targets {
				d, err := get(t.hc, t.base+nodePodsPath+mode.query)
				if err != nil {
					return fmt.Errorf("%s: %w", t.name, err)
				}
				lat[j] = append(lat[j], d)
			}
		}
		a50, a99 := percentiles(lat[0])
		d50, d99 := percentiles(lat[1])
		fmt.Printf("   %-22s %-20s %-20s %.1fx, %.1fx\n", mode.name,
			ms(a50)+" / "+ms(a99), ms(d50)+" / "+ms(d99), float64(d50)/float64(a50), float64(d99)/float64(a99))
	}
	after, err := cacheOutcomes(ctx, metrics)
	if err != nil {
		return err
	}
	fmt.Println("     -> agent: " + describeDelta(before, after))
	return nil
}

func percentiles(ds []time.Duration) (p50, p99 time.Duration) {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	// Nearest rank: the smallest value at or above pct percent of samples.
	at := func(pct int) time.Duration {
		i := (pct*len(s)+99)/100 - 1
		return s[max(0, min(i, len(s)-1))]
	}
	return at(50), at(99)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond)) }

// sample is one counter or gauge sample of a metric family.
type sample struct {
	labels map[string]string
	value  float64
}

// parseMetrics parses the agent's metrics text into the counter and gauge
// samples of each family.
func parseMetrics(text string) (map[string][]sample, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("parsing agent metrics: %w", err)
	}
	out := map[string][]sample{}
	for name, f := range families {
		for _, m := range f.GetMetric() {
			var v float64
			switch {
			case m.Counter != nil:
				v = m.GetCounter().GetValue()
			case m.Gauge != nil:
				v = m.GetGauge().GetValue()
			default:
				continue
			}
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			out[name] = append(out[name], sample{labels: l, value: v})
		}
	}
	return out, nil
}

// sumBy sums samples by the value of label.
func sumBy(samples []sample, label string) map[string]float64 {
	out := map[string]float64{}
	for _, s := range samples {
		out[s.labels[label]] += s.value
	}
	return out
}

// outcomeKey is one series of kube_apicache_cache_requests_total.
type outcomeKey struct{ verb, resource, outcome, reason string }

func (k outcomeKey) String() string {
	s := k.verb + " " + k.resource + " " + k.outcome
	if k.reason != "" {
		s += " (" + k.reason + ")"
	}
	return s
}

// cacheOutcomes reads kube_apicache_cache_requests_total from the agent.
func cacheOutcomes(ctx context.Context, metrics func(context.Context) (string, error)) (map[outcomeKey]float64, error) {
	text, err := metrics(ctx)
	if err != nil {
		return nil, err
	}
	families, err := parseMetrics(text)
	if err != nil {
		return nil, err
	}
	return outcomesOf(families), nil
}

func outcomesOf(families map[string][]sample) map[outcomeKey]float64 {
	out := map[outcomeKey]float64{}
	for _, s := range families["kube_apicache_cache_requests_total"] {
		l := s.labels
		out[outcomeKey{l["verb"], l["resource"], l["outcome"], l["reason"]}] += s.value
	}
	return out
}

// describeDelta says what the cache did with the requests made between two
// readings, for the resources it caches (discovery and the like, counted
// as "other", are left out).
func describeDelta(before, after map[outcomeKey]float64) string {
	var parts []string
	for k, v := range after {
		if n := v - before[k]; n > 0 && k.resource != "other" {
			parts = append(parts, fmt.Sprintf("%s x%.0f", k, n))
		}
	}
	if len(parts) == 0 {
		return "no read of a cached resource"
	}
	sort.Strings(parts)
	return strings.Join(parts, "; ")
}

// hits is the number of cache hits for resource between two readings.
func hits(before, after map[outcomeKey]float64, resource string) float64 {
	n := 0.0
	for k, v := range after {
		if k.resource == resource && k.outcome == "hit" {
			n += v - before[k]
		}
	}
	return n
}

func printRequests(w io.Writer, families map[string][]sample) {
	var rows []string
	for _, s := range families["kube_apicache_requests_total"] {
		l := s.labels
		res := l["resource"]
		if res == "" {
			res = "(non-resource)"
		}
		rows = append(rows, fmt.Sprintf("   %-8s %-22s %-8s %-5s %5.0f", l["verb"], res, l["handler"], l["code"], s.value))
	}
	sort.Strings(rows)
	fmt.Fprintf(w, "   %-8s %-22s %-8s %-5s %5s\n", "VERB", "RESOURCE", "HANDLER", "CODE", "N")
	for _, r := range rows {
		fmt.Fprintln(w, r)
	}
}

// printCacheOutcomes prints hits, denials and forwards by reason, with the
// cached resources' share of each.
func printCacheOutcomes(w io.Writer, families map[string][]sample) {
	type row struct {
		outcome, reason string
		n               float64
		by              map[string]float64
	}
	rows := map[[2]string]*row{}
	for k, v := range outcomesOf(families) {
		if v == 0 {
			continue
		}
		key := [2]string{k.outcome, k.reason}
		r := rows[key]
		if r == nil {
			r = &row{outcome: k.outcome, reason: k.reason, by: map[string]float64{}}
			rows[key] = r
		}
		r.n += v
		if k.resource != "other" {
			r.by[k.verb+" "+k.resource] += v
		}
	}
	order := map[string]int{"hit": 0, "denied": 1, "forwarded": 2}
	sorted := make([]*row, 0, len(rows))
	for _, r := range rows {
		sorted = append(sorted, r)
	}
	sort.Slice(sorted, func(i, j int) bool {
		a, b := sorted[i], sorted[j]
		if order[a.outcome] != order[b.outcome] {
			return order[a.outcome] < order[b.outcome]
		}
		if a.n != b.n {
			return a.n > b.n
		}
		return a.reason < b.reason
	})
	fmt.Fprintf(w, "   %-10s %-22s %5s  %s\n", "OUTCOME", "REASON", "N", "CACHED RESOURCES")
	for _, r := range sorted {
		var by []string
		for k, v := range r.by {
			by = append(by, fmt.Sprintf("%s %.0f", k, v))
		}
		sort.Strings(by)
		reason := r.reason
		if reason == "" {
			reason = "-"
		}
		line := fmt.Sprintf("   %-10s %-22s %5.0f  %s", r.outcome, reason, r.n, strings.Join(by, ", "))
		fmt.Fprintln(w, strings.TrimRight(line, " "))
	}
}

// printSaved prints the reads kube-apiserver never saw against the reviews
// the agent sent it to decide them.
func printSaved(w io.Writer, families map[string][]sample) {
	byOutcome := sumBy(families["kube_apicache_cache_requests_total"], "outcome")
	reviews := sumBy(families["kube_apicache_access_reviews_total"], "review")
	hits := byOutcome["hit"]
	sent := reviews["token"] + reviews["access"]
	fmt.Fprintf(w, "   %.0f reads answered on the node for %.0f access reviews sent (TokenReviews: %.0f, SubjectAccessReviews: %.0f)\n",
		hits, sent, reviews["token"], reviews["access"])
	if sent > 0 {
		fmt.Fprintf(w, "   %.1f reads kept off kube-apiserver per review it answered\n", hits/sent)
	}
	fmt.Fprintln(w, "   (review answers are reused for 10s; a watch-list hit serves its initial state from the cache,\n"+
		"    then relays a plain watch it opens upstream with the client's credentials)")
}
