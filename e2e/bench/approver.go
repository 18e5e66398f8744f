package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/kube-apicache/kube-apicache/agent/approver"
	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// approverCase names the approver case for -cases.
const approverCase = "approver CSRs"

// approverMetricsAddr is where the bench's approver serves its metrics,
// inside its pod.
const approverMetricsAddr = "127.0.0.1:10446"

// fleetNodes and fleetTarget are what the case extrapolates to: a fleet
// of 5,000 nodes approved within two minutes.
const (
	fleetNodes  = 5000
	fleetTarget = 2 * time.Minute
)

// approverOnly reports whether -cases selects the approver case alone
// (every read case starts with "list" or "get"), so the rest of the bench
// is skipped.
func approverOnly(cases *regexp.Regexp) bool {
	return cases.String() != "" && cases.MatchString(approverCase) && !cases.MatchString("list") && !cases.MatchString("get")
}

// benchApprover is the approver case: given n pending CSRs shaped like the
// agents' (one per node, sent as the agents' ServiceAccount with a token
// bound to that node: the admin impersonates exactly that), it starts
// `kube-apicache approver` with its default flags in a pod, as the
// Deployment runs it, and measures how fast it approves them all, how fast
// kube-controller-manager then issues them, and the approver's memory.
func benchApprover(ctx context.Context, c *sandbox.Cluster, bin string, n int) error {
	const label = "kube-apicache-bench"
	csrs := c.Admin.CertificatesV1().CertificateSigningRequests()
	defer func() {
		_ = csrs.DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: label})
	}()

	// Given n agent-shaped CSRs, pending (a rollout, or an approver that
	// comes back),
	logf("creating %d agent-shaped CSRs", n)
	start := time.Now()
	if err := createAgentCSRs(ctx, c, n, label); err != nil {
		return err
	}
	logf("created %d CSRs in %v", n, time.Since(start).Round(time.Millisecond))

	w, err := csrs.Watch(ctx, metav1.ListOptions{LabelSelector: label})
	if err != nil {
		return err
	}
	defer w.Stop()

	// when the approver starts with its defaults,
	pod, err := c.NewPod(ctx, sandbox.PodSpec{Name: "bench-approver", Namespace: sandbox.AgentNamespace, ServiceAccount: "kube-apicache-approver"})
	if err != nil {
		return err
	}
	started := time.Now()
	proc, err := pod.Start(bin, "approver", "--metrics-bind-address="+approverMetricsAddr)
	if err != nil {
		return err
	}
	defer proc.Stop(20 * time.Second)

	// then every CSR is approved, and issued.
	approved, issued := map[string]time.Time{}, map[string]time.Time{}
	deadline := time.After(10 * time.Minute)
	var peakRSS, peakHeap float64
	sample := time.NewTicker(250 * time.Millisecond)
	defer sample.Stop()
	for len(issued) < n {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return fmt.Errorf("after 10 minutes %d of %d CSRs approved, %d issued; approver log:\n%s", len(approved), n, len(issued), logTail(proc.Log(), 20))
		case <-sample.C:
			if done, err := proc.Exited(); done {
				return fmt.Errorf("approver exited (%v): %s", err, logTail(proc.Log(), 20))
			}
			if m, err := approverMetrics(ctx, c, pod); err == nil {
				peakRSS = max(peakRSS, m["process_resident_memory_bytes"])
				peakHeap = max(peakHeap, m["go_memstats_heap_inuse_bytes"])
			}
		case ev, ok := <-w.ResultChan():
			if !ok {
				if w, err = csrs.Watch(ctx, metav1.ListOptions{LabelSelector: label}); err != nil {
					return err
				}
				continue
			}
			csr, isCSR := ev.Object.(*certificatesv1.CertificateSigningRequest)
			if !isCSR || (ev.Type != watch.Modified && ev.Type != watch.Added) {
				continue
			}
			now := time.Now()
			for _, cond := range csr.Status.Conditions {
				if cond.Type == certificatesv1.CertificateDenied {
					return fmt.Errorf("CSR %s denied: %s: %s", csr.Name, cond.Reason, cond.Message)
				}
				if cond.Type == certificatesv1.CertificateApproved {
					if _, seen := approved[csr.Name]; !seen {
						approved[csr.Name] = now
					}
				}
			}
			if len(csr.Status.Certificate) > 0 {
				if _, seen := issued[csr.Name]; !seen {
					issued[csr.Name] = now
				}
			}
		}
	}
	m, err := approverMetrics(ctx, c, pod)
	if err != nil {
		return err
	}
	peakRSS = max(peakRSS, m["process_resident_memory_bytes"])
	peakHeap = max(peakHeap, m["go_memstats_heap_inuse_bytes"])
	hwm := peakRSSOf(proc.Pid())

	firstA, lastA := timeSpan(approved)
	firstI, lastI := timeSpan(issued)
	rate := float64(n-1) / lastA.Sub(firstA).Seconds()
	issueRate := float64(n-1) / lastI.Sub(firstI).Seconds()
	startup := firstA.Sub(started)
	fleet := startup + time.Duration(float64(fleetNodes)/rate*float64(time.Second))
	verdict := "meets"
	if fleet > fleetTarget {
		verdict = "misses"
	}

	out := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(os.Stdout, "\n%s: %d pending agent-shaped CSRs (one per node), approver with its default flags (--kube-api-qps=%d, --kube-api-burst=%d, --workers=%d, leader election on)\n\n",
		approverCase, n, 100, 200, 10)
	fmt.Fprintln(out, "measure\tvalue\t")
	fmt.Fprintf(out, "approver start to first approval (lease, informer sync)\t%v\t\n", startup.Round(time.Millisecond))
	fmt.Fprintf(out, "first to last approval\t%v\t\n", lastA.Sub(firstA).Round(time.Millisecond))
	fmt.Fprintf(out, "approvals/s\t%.0f\t\n", rate)
	fmt.Fprintf(out, "approver start to all %d approved\t%v\t\n", n, lastA.Sub(started).Round(time.Millisecond))
	fmt.Fprintf(out, "issued/s (kube-controller-manager's signer, its default --kube-api-qps=20)\t%.0f\t\n", issueRate)
	fmt.Fprintf(out, "approver start to all %d issued\t%v\t\n", n, lastI.Sub(started).Round(time.Millisecond))
	fmt.Fprintf(out, "approver RSS, peak (VmHWM)\t%.1f MiB\t\n", hwm/(1<<20))
	fmt.Fprintf(out, "approver RSS, peak of 250ms samples / at the end\t%.1f / %.1f MiB\t\n", peakRSS/(1<<20), m["process_resident_memory_bytes"]/(1<<20))
	fmt.Fprintf(out, "approver Go heap in use, peak of samples / at the end\t%.1f / %.1f MiB\t\n", peakHeap/(1<<20), m["go_memstats_heap_inuse_bytes"]/(1<<20))
	fmt.Fprintf(out, "CSRs in the approver's informer at the end\t%.0f\t\n", m["kube_apicache_approver_cached_csrs"])
	_ = out.Flush()
	fmt.Printf("\n%d nodes at %.0f approvals/s after a %v start: %v approved; target %v: %s\n",
		fleetNodes, rate, startup.Round(time.Millisecond), fleet.Round(time.Second), fleetTarget, verdict)
	fmt.Printf("%d nodes issued at %.0f/s by kube-controller-manager (default --kube-api-qps=20): %v\n",
		fleetNodes, issueRate, time.Duration(float64(fleetNodes)/issueRate*float64(time.Second)).Round(time.Second))
	return nil
}

// createAgentCSRs creates n CSRs for nodes bench-node-0..n-1, each with the
// kubernetes Service names, the VIP and the listen IP, usages digital
// signature and server auth, a lifetime of an hour, a key of its own, and
// the requester an agent on that node would be: the admin impersonates the
// agents' ServiceAccount, its groups, and the node-name extra kube-apiserver
// derives from a Pod-bound token.
func createAgentCSRs(ctx context.Context, c *sandbox.Cluster, n int, label string) error {
	rc := c.Admin.CertificatesV1().RESTClient()
	work := make(chan int)
	errs := make(chan error, 16)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				node := fmt.Sprintf("bench-node-%d", i)
				req, err := agentCSRPEM(node)
				if err != nil {
					errs <- err
					return
				}
				obj := &certificatesv1.CertificateSigningRequest{
					ObjectMeta: metav1.ObjectMeta{GenerateName: "bench-" + node + "-", Labels: map[string]string{label: "approver"}},
					Spec: certificatesv1.CertificateSigningRequestSpec{
						Request:           req,
						SignerName:        certificatesv1.KubeletServingSignerName,
						Usages:            []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth},
						ExpirationSeconds: ptr.To[int32](3600),
					},
				}
				err = rc.Post().Resource("certificatesigningrequests").
					SetHeader("Impersonate-User", sandbox.AgentUsername()).
					SetHeader("Impersonate-Group", "system:serviceaccounts", "system:serviceaccounts:"+sandbox.AgentNamespace).
					SetHeader("Impersonate-Extra-"+strings.ReplaceAll(approver.NodeNameExtra, "/", "%2F"), node).
					Body(obj).Do(ctx).Error()
				if err != nil {
					errs <- fmt.Errorf("creating the CSR of %s: %w", node, err)
					return
				}
			}
		}()
	}
	var err error
feed:
	for i := range n {
		select {
		case work <- i:
		case err = <-errs:
			break feed
		}
	}
	close(work)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errs:
		default:
		}
	}
	return err
}

// agentCSRPEM is the PEM CSR an agent on node sends.
func agentCSRPEM(node string) ([]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject:     pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}},
		DNSNames:    sandbox.KubernetesServiceNames(),
		IPAddresses: []net.IP{net.ParseIP(sandbox.ServiceVIP), net.ParseIP(sandbox.AgentListenIP)},
	}, key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), nil
}

// approverMetrics scrapes the approver's /metrics over HTTPS from inside
// its pod, with the sandbox scraper's token.
func approverMetrics(ctx context.Context, c *sandbox.Cluster, pod *sandbox.Pod) (map[string]float64, error) {
	token, err := c.ScraperToken(ctx)
	if err != nil {
		return nil, err
	}
	code, b, err := sandbox.AgentGetWithToken(ctx, pod.NetNS, approverMetricsAddr, "/metrics", token, 5*time.Second)
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("approver /metrics: %d %.200q", code, b)
	}
	return scrape(string(b), "process_resident_memory_bytes", "go_memstats_heap_inuse_bytes", "kube_apicache_approver_cached_csrs"), nil
}

// peakRSSOf is the process's peak resident set (VmHWM), in bytes; 0 if
// unknown.
func peakRSSOf(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			var kb float64
			if _, err := fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), &kb); err == nil {
				return kb * 1024
			}
		}
	}
	return 0
}

// timeSpan returns the earliest and the latest of times.
func timeSpan(times map[string]time.Time) (first, last time.Time) {
	all := make([]time.Time, 0, len(times))
	for _, t := range times {
		all = append(all, t)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Before(all[j]) })
	return all[0], all[len(all)-1]
}

func logTail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
