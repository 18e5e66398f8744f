package interception

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	fcache "k8s.io/client-go/tools/cache/testing"
)

// TestExcludePodLabel: given this node's pods followed for detect-local,
// when a pod carries kube-apicache.io/exclude=true, then its IPs are not
// among the local pods (so never in the PodIPs set) and it is counted as
// excluded; removing the label brings its IPs back, and other values of
// the label change nothing.
func TestExcludePodLabel(t *testing.T) {
	a := newTestAgent(newTestEndpoint(t, ok))
	cfg := validConfig()
	cfg.DetectLocalMode = DetectLocalPodIPs
	wireTestAgent(t, a, cfg, newFakeKernel(t))

	pod := func(name, ip string, labels map[string]string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Labels: labels},
			Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: ip}}},
		}
	}
	src := fcache.NewFakeControllerSource()
	src.Add(pod("in", "10.244.1.5", map[string]string{"app": "x"}))
	src.Add(pod("out", "10.244.1.6", map[string]string{ExcludePodLabel: "true", "app": "y"}))
	src.Add(pod("other-value", "10.244.1.7", map[string]string{ExcludePodLabel: "false"}))

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.icpt.watchLocalPods(ctx, src)
	}()
	defer func() { cancel(); <-done }()

	waitIPs := func(want []string, excluded int) {
		t.Helper()
		var wantIPs []netip.Addr
		for _, s := range want {
			wantIPs = append(wantIPs, netip.MustParseAddr(s))
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			ips, listed := a.icpt.local.podIPs()
			if listed && slices.Equal(ips, wantIPs) && a.icpt.local.excludedCount() == excluded {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("local pods %v (%d excluded), want %v (%d excluded)", ips, a.icpt.local.excludedCount(), wantIPs, excluded)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitIPs([]string{"10.244.1.5", "10.244.1.7"}, 1)

	src.Modify(pod("out", "10.244.1.6", map[string]string{"app": "y"}))
	waitIPs([]string{"10.244.1.5", "10.244.1.6", "10.244.1.7"}, 0)

	src.Modify(pod("in", "10.244.1.5", map[string]string{ExcludePodLabel: "true"}))
	waitIPs([]string{"10.244.1.6", "10.244.1.7"}, 1)

	src.Delete(pod("in", "10.244.1.5", map[string]string{ExcludePodLabel: "true"}))
	waitIPs([]string{"10.244.1.6", "10.244.1.7"}, 0)
}
