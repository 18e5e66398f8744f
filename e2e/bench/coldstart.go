package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// The "cold start" case: with the cluster full (-pods, -node-pods,
// -services), the bench's agent is stopped and a new agent process starts
// in its pod, as after a rollout or a node reboot; the case times it from
// the process's start until /readyz and /intercepting answer 200, with
// the serving certificate from a file (--tls-cert-file) and through the
// CSR API (approved by `kube-apicache approver`, issued by
// kube-controller-manager), in turn, -cold-start-runs times each. /readyz
// answers once the agent has decided whether to intercept; /intercepting,
// once pods' traffic to the VIP reaches it: the target is judged on that.
var coldStartRuns = flag.Int("cold-start-runs", 3, "agent starts of the \""+coldStartCase+"\" case per serving-certificate source (0 skips it)")

const (
	coldStartCase = "cold start"
	// coldStartTarget is the longest a start to ready may take.
	coldStartTarget = 3 * time.Second
	// coldApproverMetricsAddr is where the case's approver serves its
	// metrics, inside its pod.
	coldApproverMetricsAddr = "127.0.0.1:10447"
)

// coldStartVariant is one serving-certificate source's starts.
type coldStartVariant struct {
	name string
	// ready and intercepting are, per start, the time from the process's
	// start until /readyz, and /intercepting, answered 200 (sorted).
	ready, intercepting []time.Duration
	// csrs counts the CSRs the agent's identity had issued meanwhile.
	csrs int
}

func (v *coldStartVariant) median(s []time.Duration) time.Duration { return s[len(s)/2] }

// coldStart runs the cold start case and leaves the bench's agent running
// again, as it was (its certificate file and --profiling).
func (b *bench) coldStart(ctx context.Context, agentBin string) ([]*coldStartVariant, error) {
	runs := *coldStartRuns
	if runs <= 0 || !b.o.cases.MatchString(coldStartCase) {
		return nil, nil
	}
	c := b.c
	logf("%s: %d agent starts with a certificate file and %d through the CSR API, %d pods (%d on %s), %d services",
		coldStartCase, runs, runs, b.o.pods, b.o.nodePods, sandbox.NodeName, b.o.services)

	pod, certFile, keyFile := b.agent.Pod, b.agent.CertFile, b.agent.KeyFile
	b.agent.Process.Stop(40 * time.Second)
	variants := []*coldStartVariant{{name: "certificate file"}, {name: "CSR API"}}
	args := map[string][]string{
		"certificate file": c.AgentArgs(certFile, keyFile),
		"CSR API":          c.AgentArgs("", ""),
	}
	// The approver, as its Deployment runs it, for the CSR path: started
	// with no agent on the node, it reaches kube-apiserver as a pod does
	// without one.
	approver, runErr := b.startApprover(ctx, agentBin)
	if approver != nil {
		defer approver.Stop(20 * time.Second)
	}
	for i := 0; i < runs && runErr == nil; i++ {
		for _, v := range variants {
			csrs0, err := b.agentCSRsIssued(ctx)
			if err != nil {
				runErr = err
				break
			}
			ready, intercepting, err := b.startOnce(ctx, pod, agentBin, args[v.name])
			if err == nil {
				var csrs1 int
				csrs1, err = b.agentCSRsIssued(ctx)
				v.csrs += csrs1 - csrs0
			}
			if err != nil {
				runErr = fmt.Errorf("%s, %s: %w", coldStartCase, v.name, err)
				break
			}
			logf("%s, %s: ready after %v, intercepting after %v", coldStartCase, v.name, ready.Round(time.Millisecond), intercepting.Round(time.Millisecond))
			v.ready = append(v.ready, ready)
			v.intercepting = append(v.intercepting, intercepting)
		}
	}
	// The bench's agent again, for the cases after this one.
	agent, err := c.StartAgent(ctx, pod, agentBin, c.AgentArgs(certFile, keyFile, "--profiling")...)
	if err != nil {
		return nil, fmt.Errorf("restarting the bench's agent: %w", err)
	}
	agent.CertFile, agent.KeyFile = certFile, keyFile
	b.agent = agent
	if runErr != nil {
		return nil, runErr
	}
	for _, v := range variants {
		slices.Sort(v.ready)
		slices.Sort(v.intercepting)
	}
	return variants, nil
}

// agentCSRsIssued counts the CSRs of the agent's identity that have a
// certificate.
func (b *bench) agentCSRsIssued(ctx context.Context) (int, error) {
	list, err := b.c.Admin.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, csr := range list.Items {
		if csr.Spec.Username == sandbox.AgentUsername() && len(csr.Status.Certificate) > 0 {
			n++
		}
	}
	return n, nil
}

// startApprover runs `kube-apicache approver` in a pod of its own and
// waits until it approves.
func (b *bench) startApprover(ctx context.Context, agentBin string) (*sandbox.Process, error) {
	pod, err := b.c.NewPod(ctx, sandbox.PodSpec{Name: "bench-cold-start-approver", Namespace: sandbox.AgentNamespace, ServiceAccount: "kube-apicache-approver"})
	if err != nil {
		return nil, err
	}
	proc, err := pod.Start(agentBin, "approver", "--metrics-bind-address="+coldApproverMetricsAddr)
	if err != nil {
		return nil, err
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		if done, err := proc.Exited(); done {
			return false, fmt.Errorf("approver exited (%v): %s", err, logTail(proc.Log(), 20))
		}
		return strings.Contains(proc.Log(), "Approving kube-apicache serving certificates"), nil
	})
	if err != nil {
		return proc, fmt.Errorf("approver did not start: %w", err)
	}
	return proc, nil
}

// startOnce starts an agent process in pod with args and returns how long
// after its start /readyz and /intercepting first answered 200, polled
// every 10ms; then it stops the process.
func (b *bench) startOnce(ctx context.Context, pod *sandbox.Pod, agentBin string, args []string) (ready, intercepting time.Duration, err error) {
	start := time.Now()
	proc, err := pod.Start(agentBin, args...)
	if err != nil {
		return 0, 0, err
	}
	defer proc.Stop(40 * time.Second)
	get := func(path string) bool {
		code, _, err := sandbox.AgentGetWithToken(ctx, b.c.Node, sandbox.AgentMetricsAddr, path, "", 2*time.Second)
		return err == nil && code == http.StatusOK
	}
	err = wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		if done, err := proc.Exited(); done {
			return false, fmt.Errorf("agent exited (%v): %s", err, logTail(proc.Log(), 20))
		}
		if ready == 0 && get("/readyz") {
			ready = time.Since(start)
		}
		if intercepting == 0 && get("/intercepting") {
			intercepting = time.Since(start)
		}
		return ready != 0 && intercepting != 0, nil
	})
	return ready, intercepting, err
}

func printColdStart(variants []*coldStartVariant) {
	if len(variants) == 0 {
		return
	}
	fmt.Printf("\n%s: from the agent process's start until /readyz and /intercepting answered 200, %d starts each (target: intercepting within %v)\n",
		coldStartCase, len(variants[0].ready), coldStartTarget)
	for _, v := range variants {
		fmt.Printf("  %-17s ready median %v max %v; intercepting median %v max %v (all %v); %d CSRs issued\n", v.name+":",
			v.median(v.ready).Round(time.Millisecond), v.ready[len(v.ready)-1].Round(time.Millisecond),
			v.median(v.intercepting).Round(time.Millisecond), v.intercepting[len(v.intercepting)-1].Round(time.Millisecond),
			roundAll(v.intercepting), v.csrs)
	}
	for _, v := range variants {
		worst := v.intercepting[len(v.intercepting)-1]
		word := "meets"
		if worst > coldStartTarget {
			word = "misses"
		}
		fmt.Printf("%s, %s: intercepting max %v, median %v (target at most %v): %s\n", coldStartCase, v.name,
			worst.Round(time.Millisecond), v.median(v.intercepting).Round(time.Millisecond), coldStartTarget, word)
	}
}

func roundAll(s []time.Duration) []time.Duration {
	out := make([]time.Duration, len(s))
	for i, d := range s {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}
