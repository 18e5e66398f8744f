package agent

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
)

// Given an intercepting agent, when the kill switch turns interception
// off, then the next sync stops intercepting with the switch's reason and
// the agent stays ready; turned on again, it intercepts again.
func TestKillSwitch(t *testing.T) {
	_, _, a := newLivenessTestAgent(t)
	ctx := context.Background()
	defer a.removeStale()
	a.syncOrStepAside(ctx)
	if err := a.Intercepting(); err != nil {
		t.Fatalf("Intercepting() before the switch = %v", err)
	}
	a.SetInterception(false, "interception.enabled: false in test.yaml")
	a.syncOrStepAside(ctx)
	err := a.Intercepting()
	if err == nil || !strings.Contains(err.Error(), "interception turned off (interception.enabled: false in test.yaml)") ||
		strings.Contains(err.Error(), "unhealthy") {
		t.Errorf("Intercepting() with the switch off = %v, want the switch's reason", err)
	}
	if err := a.Ready(); err != nil {
		t.Errorf("Ready() with the switch off = %v, want ready (stepped aside on purpose)", err)
	}
	a.SetInterception(true, "interception.enabled: true in test.yaml")
	a.syncOrStepAside(ctx)
	if err := a.Intercepting(); err != nil {
		t.Errorf("Intercepting() with the switch on again = %v", err)
	}
}

// Given the kubernetes Service, when the configured VIPs and port are
// compared with it, then only a VIP or port it lacks is a mismatch, which
// makes the agent not ready and not intercepting until it is fixed.
func TestServiceMismatch(t *testing.T) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "kubernetes"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.1", ClusterIPs: []string{"10.96.0.1", "fd00:10:96::1"},
			Ports: []corev1.ServicePort{{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP}}},
	}
	ip := netip.MustParseAddr
	for name, tc := range map[string]struct {
		vips []netip.Addr
		port uint16
		want string
	}{
		"match":            {vips: []netip.Addr{ip("10.96.0.1")}, port: 443},
		"dual-stack, one":  {vips: []netip.Addr{ip("fd00:10:96::1")}, port: 443},
		"dual-stack, both": {vips: []netip.Addr{ip("10.96.0.1"), ip("fd00:10:96::1")}, port: 443},
		"wrong VIP":        {vips: []netip.Addr{ip("10.96.0.10")}, port: 443, want: "--service-vip 10.96.0.10 is not a cluster IP of Service default/kubernetes (10.96.0.1, fd00:10:96::1)"},
		"wrong port":       {vips: []netip.Addr{ip("10.96.0.1")}, port: 6443, want: "--service-port 6443 is not a port of Service default/kubernetes (443)"},
		"one of two wrong": {vips: []netip.Addr{ip("10.96.0.1"), ip("fd00::1")}, port: 443, want: "--service-vip fd00::1 is not"},
	} {
		t.Run(name, func(t *testing.T) {
			got := serviceMismatch(tc.vips, tc.port, svc)
			if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
				t.Errorf("serviceMismatch = %q, want %q", got, tc.want)
			}
		})
	}

	_, _, a := newLivenessTestAgent(t)
	ctx := context.Background()
	defer a.removeStale()
	a.cfg.ServiceVIPs, a.cfg.ServicePort = []netip.Addr{ip("10.96.0.10")}, 443
	a.checkService(klog.Background(), svc)
	a.syncOrStepAside(ctx)
	if err := a.Ready(); err == nil || !strings.Contains(err.Error(), "10.96.0.10 is not a cluster IP") {
		t.Errorf("Ready() with a wrong VIP = %v, want the mismatch", err)
	}
	if err := a.Intercepting(); err == nil || !strings.Contains(err.Error(), "10.96.0.10 is not a cluster IP") {
		t.Errorf("Intercepting() with a wrong VIP = %v, want the mismatch", err)
	}
	a.cfg.ServiceVIPs = []netip.Addr{ip("10.96.0.1")}
	a.checkService(klog.Background(), svc)
	if err := a.Ready(); err != nil {
		t.Errorf("Ready() once the VIP matches = %v", err)
	}
}
