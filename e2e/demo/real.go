package main

import (
	"bufio"
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// The real-node demo: containerd, a kubelet and kube-proxy run the node,
// kubectl installs the DaemonSet from manifests/, and the client is an
// ordinary pod the kubelet starts from the client image.

const (
	realClientSA  = "sample"
	realClientPod = "sample"
)

func runReal(duration time.Duration, binDir, imagesDir string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	images, err := sandbox.RealNodeImages(imagesDir)
	if err != nil {
		return err
	}
	overlay, err := os.MkdirTemp("", "kube-apicache-demo-overlay-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(overlay)
	if err := sandbox.WriteOverlay(overlay, sandbox.RealAgentImage, ""); err != nil {
		return err
	}

	step("Starting etcd, kube-apiserver, kube-controller-manager in network namespaces (real-node mode)")
	logf := func(f string, a ...any) { fmt.Printf("   "+f+"\n", a...) }
	c, err := sandbox.Start(ctx, sandbox.Options{BinDir: binDir, APIServers: 1, RealNode: true, Logf: logf})
	if err != nil {
		return err
	}
	defer func() {
		step("Tearing down the sandbox (the node's containers, kubelet, containerd and every change to the machine)")
		if err := c.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "demo: teardown: %v\n", err)
		}
	}()

	step("Starting the real node: containerd, kubelet, kube-proxy (iptables), kube-scheduler")
	rn, err := c.StartRealNode(ctx, sandbox.RealNodeOptions{Images: images})
	if err != nil {
		return err
	}

	step("Installing kube-apicache with kubectl, from manifests/ with an image-only overlay")
	k, _ := os.ReadFile(overlay + "/kustomization.yaml")
	fmt.Println("   " + overlay + "/kustomization.yaml:")
	printIndented(string(k))
	fmt.Println("   $ kubectl apply -k " + overlay)
	start := time.Now()
	out, err := c.Kubectl(ctx, "apply", "-k", overlay)
	if err != nil {
		printIndented(out)
		return err
	}
	printIndented(dropWarnings(out))

	if err := waitAgentReady(ctx, c); err != nil {
		out, _ := c.Kubectl(ctx, "get", "pods", "-A", "-o", "wide")
		printIndented(out)
		return err
	}
	fmt.Printf("   agent pod Ready %s after the apply\n", time.Since(start).Round(time.Millisecond))
	// Ready means the agent has decided whether to intercept; the redirect
	// follows once its certificate verifies and its checks pass.
	if err := waitIntercepting(ctx, c); err != nil {
		return err
	}
	fmt.Printf("   agent intercepting (its /intercepting answers 200) %s after the apply\n", time.Since(start).Round(time.Millisecond))
	fmt.Println("   (the shipped configuration pins no resource: the agent starts a resource's cache on its first read)")
	fmt.Println("   $ kubectl get pods -A -o wide")
	out, err = c.Kubectl(ctx, "get", "pods", "-A", "-o", "wide")
	printIndented(out)
	if err != nil {
		return err
	}

	step("The node's nat rules: the agent's redirect ahead of kube-proxy's")
	nat, err := c.Node.Output(ctx, "iptables-save", "-t", "nat")
	if err != nil {
		return err
	}
	for _, l := range strings.Split(nat, "\n") {
		if strings.HasPrefix(l, "-A PREROUTING ") || strings.HasPrefix(l, "-A OUTPUT ") || strings.HasPrefix(l, "-A "+sandbox.AgentChain+" ") {
			fmt.Println("     " + l)
		}
	}
	// On an iptables-nft node the agent's default dataplane is its own nft
	// table, whose base chains come before kube-proxy's at dstnat.
	if table, err := c.Node.Output(ctx, "nft", "list", "table", "ip", "kube-apicache"); err == nil {
		fmt.Println("   $ nft list table ip kube-apicache   (the agent's nftables dataplane; kube-proxy's chains hook at dstnat, -100)")
		for _, l := range strings.Split(table, "\n") {
			if t := strings.TrimSpace(l); strings.HasPrefix(t, "type nat hook") || strings.Contains(t, "dnat") || strings.HasPrefix(t, "chain ") {
				fmt.Println("     " + t)
			}
		}
	}

	step(fmt.Sprintf("A client pod the kubelet runs (namespace %s, ServiceAccount %s, image %s)", demoNS, realClientSA, sandbox.RealClientImage))
	if err := setUpRealClients(ctx, c); err != nil {
		return err
	}
	if _, err := runRealClient(ctx, c, realClientPod, "informers", "--timeout", "30m"); err != nil {
		return err
	}
	// The agent learns a new pod's IP from the node's pods: until then
	// the pod's connections take kube-proxy's path (fail-open), so its
	// informers, which started at once, hold connections straight to
	// kube-apiserver. What the pod opens from then on goes to the agent.
	if err := waitPodIPInSet(ctx, c, demoNS, realClientPod); err != nil {
		return err
	}
	exec := func(args ...string) (string, error) {
		out, err := c.Kubectl(ctx, append([]string{"exec", "-n", demoNS, realClientPod, "--"}, args...)...)
		return dropExecNoise(out), err
	}
	// The first reads of this node's pods and of the services start those
	// caches (the shipped configuration pins none): they are forwarded,
	// and the reads below are answered from the caches once synced.
	fmt.Println("   (the first reads of this node's pods and of the services start the agent's caches for them, and are forwarded)")
	for _, args := range [][]string{
		{"kubectl", "get", "--raw", nodePodsPath},
		{"kubectl", "get", "--raw", "/api/v1/services"},
	} {
		printCommand(args, "")
		out, err := exec(args...)
		if err != nil {
			printIndented(out)
			return err
		}
		printIndented(summarizeList(out))
	}
	if err := waitCacheCaughtUp(ctx, c.DaemonSetAgentMetrics, map[string]float64{"pods": 0, "services": 0}); err != nil {
		out, _ := c.Kubectl(ctx, "logs", "-n", sandbox.AgentNamespace, "daemonset/kube-apicache", "--tail=40")
		fmt.Println("   the agent's last log lines:")
		printIndented(out)
		return err
	}
	for _, args := range [][]string{
		{"kubectl", "create", "configmap", "hello", "--from-literal=greeting=hi"},
		{"kubectl", "get", "configmaps"},
		{"kubectl", "delete", "configmap", "hello"},
		{"/podclient", "crud", "--name", "from-client-go"},
	} {
		printCommand(args, "")
		out, err := exec(args...)
		printIndented(out)
		if err != nil {
			return err
		}
	}

	step("A node-local list, answered from the cache")
	for _, cmd := range []struct {
		args []string
		note string
		show func(string) string
	}{
		{args: []string{"kubectl", "get", "--raw", nodePodsPath}, show: summarizeList},
		{args: []string{"kubectl", "get", "pods", "-A", "--field-selector=spec.nodeName=" + sandbox.NodeName, "-o", "name"}},
	} {
		before, err := cacheOutcomes(ctx, c.DaemonSetAgentMetrics)
		if err != nil {
			return err
		}
		printCommand(cmd.args, cmd.note)
		out, err := exec(cmd.args...)
		if err != nil {
			printIndented(out)
			return err
		}
		if cmd.show != nil {
			out = cmd.show(out)
		}
		printIndented(out)
		after, err := cacheOutcomes(ctx, c.DaemonSetAgentMetrics)
		if err != nil {
			return err
		}
		fmt.Println("     -> agent: " + describeDelta(before, after))
		if hits(before, after, "pods") == 0 {
			return fmt.Errorf("the node-local list %v was not answered from the cache", cmd.args)
		}
	}

	step("Watch-list informers, answered from the cache (a second process in the pod: podclient informers, KUBE_FEATURE_WatchListClient=true)")
	before, err := cacheOutcomes(ctx, c.DaemonSetAgentMetrics)
	if err != nil {
		return err
	}
	fmt.Println("   $ kubectl exec -n " + demoNS + " " + realClientPod + " -- /podclient informers   (this node's pods, typed and metadata-only, and all services)")
	created := time.Now()
	lines, stopInformers, err := execLines(ctx, c, "exec", "-n", demoNS, realClientPod, "--", "/podclient", "informers", "--timeout", "10m")
	if err != nil {
		return err
	}
	defer stopInformers()
	if err := awaitSynced(ctx, lines, created); err != nil {
		return err
	}
	after, err := cacheOutcomes(ctx, c.DaemonSetAgentMetrics)
	if err != nil {
		return err
	}
	fmt.Println("     -> agent: " + describeDelta(before, after))
	if hits(before, after, "pods") == 0 || hits(before, after, "services") == 0 {
		return fmt.Errorf("the watch-list informers' initial state was not answered from the cache")
	}

	step(fmt.Sprintf("Latency: %d sequential GETs of this node's pods, through the agent (VIP) and directly (kube-apiserver)", latencyRounds))
	fmt.Printf("   (measured from the node's network namespace, as a hostNetwork client, with a token of %s/%s;\n"+
		"    the VIP is intercepted in OUTPUT exactly as pods' traffic is in PREROUTING)\n", demoNS, realClientSA)
	tok, err := c.Admin.CoreV1().ServiceAccounts(demoNS).CreateToken(ctx, realClientSA,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("token for %s: %w", realClientSA, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(c.CA.CertPEM) {
		return fmt.Errorf("no certificate in the cluster CA")
	}
	if err := measureLatency(ctx, c.Node.DialContext, pool, tok.Status.Token, c.APIServers()[0].URL, c.DaemonSetAgentMetrics); err != nil {
		return err
	}

	text, err := c.DaemonSetAgentMetrics(ctx)
	if err != nil {
		return err
	}
	families, err := parseMetrics(text)
	if err != nil {
		return err
	}
	step("Requests the agent handled (kube_apicache_requests_total)")
	printRequests(os.Stdout, families)
	step("What the cache did with them, hits by reason (kube_apicache_cache_requests_total)")
	printCacheOutcomes(os.Stdout, families)
	step("kube-apiserver reads saved")
	printSaved(os.Stdout, families)

	if duration > 0 {
		step(fmt.Sprintf("Running for %s (sandbox in %s, node in %s)", duration, c.Dir, rn.Dir))
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

// waitAgentReady waits until the DaemonSet's pod is Ready.
func waitAgentReady(ctx context.Context, c *sandbox.Cluster) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := c.Admin.CoreV1().Pods(sandbox.AgentNamespace).List(ctx, metav1.ListOptions{LabelSelector: sandbox.DaemonSetAgentSelector})
		if err != nil {
			return false, nil
		}
		for _, p := range pods.Items {
			last = p.Name + " " + string(p.Status.Phase)
			for _, cond := range p.Status.Conditions {
				if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue && p.DeletionTimestamp == nil {
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("agent pod not Ready (last: %q): %w", last, err)
	}
	return nil
}

// waitIntercepting waits until the DaemonSet's agent says it intercepts
// the VIP (/intercepting on its metrics port, which needs no token).
func waitIntercepting(ctx context.Context, c *sandbox.Cluster) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		addr, err := c.DaemonSetAgentMetricsAddr(ctx)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		code, b, err := sandbox.AgentGetWithToken(ctx, c.Node, addr, "/intercepting", "", 5*time.Second)
		last = fmt.Sprintf("HTTP %d: %s", code, strings.TrimSpace(string(b)))
		if err != nil {
			last = err.Error()
		}
		return err == nil && code == http.StatusOK, nil
	})
	if err != nil {
		return fmt.Errorf("the agent does not intercept (last /intercepting: %s): %w", last, err)
	}
	return nil
}

// waitPodIPInSet waits until the pod's IP is in the agent's set of this
// node's pods.
func waitPodIPInSet(ctx context.Context, c *sandbox.Cluster, namespace, name string) error {
	p, err := c.Admin.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	start := time.Now()
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		return c.PodIPInAgentSet(ctx, p.Status.PodIP), nil
	})
	if err != nil {
		return fmt.Errorf("pod %s/%s's IP %s never reached the agent's set of this node's pods: %w", namespace, name, p.Status.PodIP, err)
	}
	fmt.Printf("   its IP %s in the agent's set of this node's pods %s later; its connections from then on go to the agent\n",
		p.Status.PodIP, time.Since(start).Round(time.Millisecond))
	return nil
}

// execLines runs kubectl with args as the admin and returns its output's
// lines as they come, and a func that stops it.
func execLines(ctx context.Context, c *sandbox.Cluster, args ...string) (<-chan string, func(), error) {
	ctx, cancel := context.WithCancel(ctx)
	cmd := c.KubectlCommand(ctx, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		cancel()
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		cancel()
		return nil, nil, err
	}
	return streamLines(out), func() { cancel(); _ = cmd.Wait() }, nil
}

// streamLines sends r's lines as they come, dropping those nobody reads,
// and closes the channel (and r) at r's end.
func streamLines(r io.ReadCloser) <-chan string {
	lines := make(chan string, 1024)
	go func() {
		defer close(lines)
		defer r.Close()
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 0, 1<<16), 1<<20)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default: // nobody reads any more
			}
		}
	}()
	return lines
}

// setUpRealClients creates the demo namespace and the client
// ServiceAccount, with edit in the namespace and get/list/watch of pods
// and services cluster-wide, as a node-local agent would have.
func setUpRealClients(ctx context.Context, c *sandbox.Cluster) error {
	if err := c.EnsureNamespace(ctx, demoNS); err != nil {
		return err
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: realClientSA}}
	if _, err := c.Admin.CoreV1().ServiceAccounts(demoNS).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	subjects := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: realClientSA, Namespace: demoNS}}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "sample-edit"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"},
		Subjects:   subjects,
	}
	if _, err := c.Admin.RbacV1().RoleBindings(demoNS).Create(ctx, rb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: readerRole},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods", "services"},
			Verbs: []string{"get", "list", "watch"}}},
	}
	if _, err := c.Admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: readerRole},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: readerRole},
		Subjects:   subjects,
	}
	if _, err := c.Admin.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	user := "system:serviceaccount:" + demoNS + ":" + realClientSA
	for _, a := range []authorizationv1.ResourceAttributes{
		{Namespace: demoNS, Verb: "create", Resource: "configmaps"},
		{Verb: "watch", Resource: "pods"},
		{Verb: "watch", Resource: "services"},
	} {
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User:               user,
				Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + demoNS, "system:authenticated"},
				ResourceAttributes: &a,
			}}
			got, err := c.Admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
			return err == nil && got.Status.Allowed, nil
		})
		if err != nil {
			return fmt.Errorf("%s may not %s %s: %w", user, a.Verb, a.Resource, err)
		}
	}
	fmt.Printf("   %s: edit in %s, %s (get, list, watch pods and services cluster-wide)\n", user, demoNS, readerRole)
	return nil
}

// runRealClient creates a pod of the client image on the real node (the
// scheduler binds it, the kubelet runs it: the ServiceAccount's projected
// token, the standard environment, NODE_NAME from the downward API, and
// client-go's watch-list enabled), waits until it runs, and returns its
// log lines as they come.
func runRealClient(ctx context.Context, c *sandbox.Cluster, name string, args ...string) (<-chan string, error) {
	pods := c.Admin.CoreV1().Pods(demoNS)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			ServiceAccountName:            realClientSA,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr.To[int64](5),
			Containers: []corev1.Container{{
				Name: "client", Image: sandbox.RealClientImage, ImagePullPolicy: corev1.PullNever,
				Args: args,
				Env: []corev1.EnvVar{
					{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
					{Name: "KUBE_FEATURE_WatchListClient", Value: "true"},
				},
			}},
		},
	}
	start := time.Now()
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("creating pod %s: %w", name, err)
	}
	last, err := c.WaitPodRunning(ctx, demoNS, name)
	if err != nil {
		return nil, err
	}
	fmt.Printf("   pod %s/%s Running on %s at %s, %s after its creation\n", demoNS, name, last.Spec.NodeName, last.Status.PodIP,
		time.Since(start).Round(time.Millisecond))
	rc, err := pods.GetLogs(name, &corev1.PodLogOptions{Follow: true}).Stream(ctx)
	if err != nil {
		return nil, fmt.Errorf("log of %s: %w", name, err)
	}
	return streamLines(rc), nil
}

// awaitSynced prints the informers' WATCHLIST lines until SYNCED.
func awaitSynced(ctx context.Context, lines <-chan string, start time.Time) error {
	timeout := time.After(time.Minute)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				return fmt.Errorf("the informers' log ended before SYNCED")
			}
			switch f := strings.Fields(l); {
			case len(f) > 0 && f[0] == "WATCHLIST":
				fmt.Println("     " + l)
			case l == "SYNCED":
				fmt.Printf("     SYNCED (%s after the pod's creation)\n", time.Since(start).Round(time.Millisecond))
				return nil
			}
		case <-timeout:
			return fmt.Errorf("informers not SYNCED within a minute")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// dropWarnings replaces kubectl apply's warnings about objects that exist
// without its last-applied annotation (the sandbox creates the agent's
// RBAC at its start) by their count.
func dropWarnings(out string) string {
	var kept []string
	n := 0
	for _, l := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		if strings.HasPrefix(l, "Warning: resource ") && strings.Contains(l, "last-applied-configuration") {
			n++
			continue
		}
		kept = append(kept, l)
	}
	if n > 0 {
		kept = append(kept, fmt.Sprintf("(%d warnings left out: objects that already existed without kubectl's last-applied annotation)", n))
	}
	return strings.Join(kept, "\n")
}

// dropExecNoise drops the outer kubectl exec's stream messages.
func dropExecNoise(out string) string {
	var kept []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "websocket.go") && strings.Contains(l, "Unknown stream id") {
			continue
		}
		kept = append(kept, l)
	}
	return strings.Join(kept, "\n")
}
