package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// clientRun records what one pass of exerciseClients observed.
type clientRun struct {
	execStderr string
	noAuthCode int
	noAuthBody string
}

// exerciseClients runs unmodified kubectl and client-go from pod against the
// kubernetes Service VIP: get, create, apply, delete, get -w, a CRUD cycle
// and an informer. suffix keeps object names apart between runs.
func exerciseClients(t *testing.T, ctx context.Context, c *sandbox.Cluster, pod *sandbox.Pod, suffix string) clientRun {
	ns := pod.Spec.Namespace
	var run clientRun

	// Given a pod with only its ServiceAccount volume, when it runs kubectl,
	// then get, create, apply and delete work.
	mustKubectl(t, ctx, pod, "get", "configmaps")
	mustKubectl(t, ctx, pod, "create", "configmap", "created-"+suffix, "--from-literal=k=v")
	manifest := filepath.Join(pod.Dir, "home", "applied-"+suffix+".yaml")
	if err := os.WriteFile(manifest, []byte(fmt.Sprintf("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: applied-%s\ndata:\n  k: v\n", suffix)), 0o644); err != nil {
		t.Fatal(err)
	}
	mustKubectl(t, ctx, pod, "apply", "-f", manifest)
	mustKubectl(t, ctx, pod, "apply", "-f", manifest) // unchanged: a patch-free no-op
	for _, name := range []string{"created-" + suffix, "applied-" + suffix} {
		if _, err := c.Admin.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Errorf("configmap %s not in the apiserver: %v", name, err)
		}
	}

	// When kubectl watches, then an event arrives while the watch is open.
	watchCtx, stopWatch := context.WithCancel(ctx)
	watch := pod.Command(watchCtx, "kubectl", "get", "configmaps", "--watch-only", "-o", "name")
	waitLine := lineReader(t, watch)
	time.Sleep(time.Second) // let the watch open before the event
	createConfigMap(t, ctx, c, ns, "watched-"+suffix)
	// On a busy machine kubectl may list only after the create, which a
	// --watch-only watch then rightly does not report: make the event
	// again (delete, create) until one is seen.
	var watchErr error
	for attempt := range 3 {
		if attempt > 0 {
			if err := c.Admin.CoreV1().ConfigMaps(ns).Delete(ctx, "watched-"+suffix, metav1.DeleteOptions{}); err != nil {
				t.Fatalf("deleting configmap watched-%s: %v", suffix, err)
			}
			createConfigMap(t, ctx, c, ns, "watched-"+suffix)
		}
		if watchErr = waitLine("configmap/watched-"+suffix, 10*time.Second); watchErr == nil {
			break
		}
	}
	if watchErr != nil {
		t.Errorf("kubectl get -w: %v", watchErr)
	}
	stopWatch()
	_ = watch.Wait()

	// When a client-go program does a CRUD cycle, then every step works.
	out, err := pod.Command(ctx, podclientBin, "crud", "--name", "crud-"+suffix).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "deleted crud-"+suffix) {
		t.Errorf("client-go crud: %v\n%s", err, out)
	}

	// When a client-go informer runs, then it syncs and sees new objects.
	infCtx, stopInf := context.WithCancel(ctx)
	inf := pod.Command(infCtx, podclientBin, "informer")
	waitInf := lineReader(t, inf)
	if err := waitInf("SYNCED", 30*time.Second); err != nil {
		t.Errorf("informer: %v", err)
	}
	createConfigMap(t, ctx, c, ns, "informed-"+suffix)
	if err := waitInf("ADDED informed-"+suffix, 30*time.Second); err != nil {
		t.Errorf("informer: %v", err)
	}
	stopInf()
	_ = inf.Wait()

	mustKubectl(t, ctx, pod, "delete", "configmap", "created-"+suffix, "applied-"+suffix, "watched-"+suffix, "informed-"+suffix)

	// When kubectl exec asks for an upgrade that upstream refuses (the
	// sandbox node has no kubelet), then the error comes back.
	_, stderr, err := kubectl(ctx, pod, "exec", pod.Spec.Name, "--", "true")
	if err == nil {
		t.Errorf("kubectl exec succeeded without a kubelet")
	}
	run.execStderr = stderr

	// When a request carries no credentials, then it gets what anonymous
	// requests get.
	resp, err := vipClient(t, pod, false).Get(vipURL("/api/v1/namespaces/" + ns + "/configmaps"))
	if err != nil {
		t.Fatalf("anonymous request: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	run.noAuthCode, run.noAuthBody = resp.StatusCode, string(body)
	return run
}

func createConfigMap(t *testing.T, ctx context.Context, c *sandbox.Cluster, ns, name string) {
	t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := c.Admin.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating configmap %s: %v", name, err)
	}
}

// TestPassThrough is the pass-through agent's end-to-end scenario: the same
// clients work directly through kube-proxy's path and through the agent; the
// agent proves it handled the second run; upstream sees the pod as the
// caller; and SIGTERM hands the VIP back cleanly.
func TestPassThrough(t *testing.T) {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	pod := newClientPod(t, ctx, c, "e2e-passthrough", "client")

	// (a) Through the simulated kube-proxy alone.
	direct := exerciseClients(t, ctx, c, pod, "direct")

	// (b) Through the agent.
	agent := startAgent(t, ctx, c)
	before := agentRequests(t, ctx, agent)
	viaAgent := exerciseClients(t, ctx, c, pod, "agent")

	t.Run("agent handled the requests", func(t *testing.T) {
		// Requests are counted when they end; the relayed watches end a
		// moment after their clients went away.
		var after map[string]float64
		deadline := time.Now().Add(15 * time.Second)
		for {
			after = agentRequests(t, ctx, agent)
			missing := []string{}
			for _, verb := range []string{"get", "list", "create", "update", "delete", "watch"} {
				if after[verb] <= before[verb] {
					missing = append(missing, verb)
				}
			}
			if len(missing) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("agent counted no %v requests (before %v, after %v)", missing, before, after)
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		t.Logf("requests through the agent by verb: %v", after)
	})

	t.Run("failed upgrade is relayed", func(t *testing.T) {
		if direct.execStderr != viaAgent.execStderr || !strings.Contains(direct.execStderr, ":10250") {
			t.Errorf("kubectl exec errors differ or are not the kubelet dial error:\ndirect: %q\nagent:  %q", direct.execStderr, viaAgent.execStderr)
		}
	})

	t.Run("no credentials gets the same answer", func(t *testing.T) {
		if viaAgent.noAuthCode != direct.noAuthCode || viaAgent.noAuthBody != direct.noAuthBody {
			t.Errorf("through the agent: %d %s\ndirect: %d %s", viaAgent.noAuthCode, viaAgent.noAuthBody, direct.noAuthCode, direct.noAuthBody)
		}
		if direct.noAuthCode != http.StatusUnauthorized && direct.noAuthCode != http.StatusForbidden {
			t.Errorf("anonymous request got %d, want 401 or 403", direct.noAuthCode)
		}
	})

	t.Run("audit shows the pod as the user", func(t *testing.T) {
		// Requests relayed by the agent arrive from the node with the
		// pod's address in X-Forwarded-For. (The agent's own requests, for
		// its cache, reviews and endpoints, come from the node alone, as
		// the agent.)
		relayed := auditEvents(t, c, func(ev *auditv1.Event) bool {
			return slices.Contains(ev.SourceIPs, pod.IP) && slices.Contains(ev.SourceIPs, sandbox.NodeIP)
		})
		verbs := map[string]int{}
		for _, ev := range relayed {
			if ev.User.Username == sandbox.AgentUsername() {
				t.Errorf("relayed request audited as the agent: %s %s", ev.Verb, ev.RequestURI)
			}
			verbs[ev.Verb]++
			if ev.User.Username != pod.Username() && ev.User.Username != "system:anonymous" {
				t.Errorf("forwarded %s %s audited as %q, want %q", ev.Verb, ev.RequestURI, ev.User.Username, pod.Username())
			}
		}
		for _, verb := range []string{"get", "list", "create", "patch", "update", "delete", "watch"} {
			if verbs[verb] == 0 && verb != "patch" {
				t.Errorf("no forwarded %s request in the audit log (saw %v)", verb, verbs)
			}
		}
		t.Logf("forwarded requests in the audit log by verb: %v", verbs)
	})

	t.Run("SIGTERM removes everything and hands back the VIP", func(t *testing.T) {
		nat, addrs, err := c.NodeNetState(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(nat, sandbox.AgentChain) || !strings.Contains(addrs, sandbox.AgentListenIP) {
			t.Fatalf("agent state missing while it runs:\n%s\n%s", nat, addrs)
		}
		if err := agent.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := waitExit(t, agent.Process, 45*time.Second); code != 0 {
			t.Errorf("agent exited %d after SIGTERM, want 0", code)
		}
		assertNoAgentState(t, ctx, c)
		// The pod reaches the apiserver through kube-proxy's path at once.
		quick, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		mustKubectl(t, quick, pod, "get", "configmaps")
	})
}

// assertNoAgentState fails if any rule, chain or address of the agent is
// left on the node.
func assertNoAgentState(t *testing.T, ctx context.Context, c *sandbox.Cluster) {
	t.Helper()
	nat, addrs, err := c.NodeNetState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(nat, sandbox.AgentChain) || strings.Contains(nat, "kube-apicache") {
		t.Errorf("agent rules left in the node's nat table:\n%s", nat)
	}
	if strings.Contains(addrs, sandbox.AgentListenIP) || strings.Contains(addrs, "kube-apicache") {
		t.Errorf("agent address left on the node:\n%s", addrs)
	}
	sets, err := c.NodeSets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(sets, sandbox.AgentLivenessSet) {
		t.Errorf("agent liveness set left on the node:\n%s", sets)
	}
	if st := readNFTState(t, ctx, c); st.Tables > 0 {
		t.Errorf("agent nftables table left on the node: %+v", st)
	}
}
