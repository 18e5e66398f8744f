package interception

import (
	"context"
	"encoding/json"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
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
	defer a.icpt.RemoveStale()
	a.icpt.syncOrStepAside(ctx)
	if err := a.Intercepting(); err != nil {
		t.Fatalf("Intercepting() before the switch = %v", err)
	}
	a.SetInterception(false, "interception.enabled: false in test.yaml")
	a.icpt.syncOrStepAside(ctx)
	err := a.Intercepting()
	if err == nil || !strings.Contains(err.Error(), "interception turned off (interception.enabled: false in test.yaml)") ||
		strings.Contains(err.Error(), "unhealthy") {
		t.Errorf("Intercepting() with the switch off = %v, want the switch's reason", err)
	}
	if err := a.Ready(); err != nil {
		t.Errorf("Ready() with the switch off = %v, want ready (stepped aside on purpose)", err)
	}
	a.SetInterception(true, "interception.enabled: true in test.yaml")
	a.icpt.syncOrStepAside(ctx)
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
	defer a.icpt.RemoveStale()
	a.cfg.ServiceVIPs, a.cfg.ServicePort = []netip.Addr{ip("10.96.0.10")}, 443
	a.icpt.checkService(klog.Background(), svc)
	a.icpt.syncOrStepAside(ctx)
	if err := a.Ready(); err == nil || !strings.Contains(err.Error(), "10.96.0.10 is not a cluster IP") {
		t.Errorf("Ready() with a wrong VIP = %v, want the mismatch", err)
	}
	if err := a.Intercepting(); err == nil || !strings.Contains(err.Error(), "10.96.0.10 is not a cluster IP") {
		t.Errorf("Intercepting() with a wrong VIP = %v, want the mismatch", err)
	}
	a.cfg.ServiceVIPs = []netip.Addr{ip("10.96.0.1")}
	a.icpt.checkService(klog.Background(), svc)
	if err := a.Ready(); err != nil {
		t.Errorf("Ready() once the VIP matches = %v", err)
	}
}

// kubernetesServiceAPI serves the list and watch of the default/kubernetes
// Service by name, as kube-apiserver does for the agent's informer:
// *answer says what the list gets ("forbidden", "missing", or "serve" for
// *svc). Watches stay open without events; a watch-list request is
// refused, so the informer falls back to a list.
func kubernetesServiceAPI(t *testing.T, answer *atomic.Value, svc *corev1.Service) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if r.URL.Path != "/api/v1/namespaces/default/services" || q.Get("fieldSelector") != "metadata.name=kubernetes" {
			t.Errorf("unexpected request %s", r.URL)
			http.NotFound(w, r)
			return
		}
		status := func(code int, reason metav1.StatusReason, msg string) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			_ = json.NewEncoder(w).Encode(&metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
				Status: metav1.StatusFailure, Reason: reason, Message: msg, Code: int32(code)})
		}
		switch {
		case q.Get("watch") == "true" && q.Get("sendInitialEvents") == "true":
			status(http.StatusBadRequest, metav1.StatusReasonBadRequest, "watch-list not supported here")
			return
		case q.Get("watch") == "true":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		}
		list := &corev1.ServiceList{TypeMeta: metav1.TypeMeta{Kind: "ServiceList", APIVersion: "v1"},
			ListMeta: metav1.ListMeta{ResourceVersion: "7"}}
		switch answer.Load().(string) {
		case "forbidden":
			status(http.StatusForbidden, metav1.StatusReasonForbidden,
				`services "kubernetes" is forbidden: User "system:serviceaccount:kube-apicache:kube-apicache" cannot list resource "services" in API group "" in the namespace "default"`)
			return
		case "serve":
			list.Items = []corev1.Service{*svc}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(list)
	}
}

// TestServiceCheck: the agent intercepts only once it has read the
// kubernetes Service and found the configured VIPs and port in it; until
// then, or while they differ, it stands aside and is not ready, with the
// reason on /intercepting and /readyz, and it keeps retrying a Service it
// cannot read.
func TestServiceCheck(t *testing.T) {
	for name, tc := range map[string]struct {
		// answer is what the list of the Service gets; "" starts no watch.
		answer string
		// wrongVIP serves a Service without the configured VIP.
		wrongVIP bool
		// want is in the reasons of Intercepting() and Ready(); "": the
		// agent intercepts and is ready.
		want string
		// mismatch is the expected kube_apicache_service_mismatch.
		mismatch float64
	}{
		// Given an agent that has not read the Service yet (the informer
		// is still listing), then it does not intercept and is not ready.
		"not read yet": {want: "the Service VIPs 127.0.0.1 and port %d are not verified against Service default/kubernetes yet: waiting for its first read"},
		// Given RBAC that forbids reading the Service, then the reason
		// says so; once it is allowed, the retried list (TestServiceCheck
		// "forbidden, then allowed") makes the agent intercept.
		"forbidden": {answer: "forbidden", want: `not verified against Service default/kubernetes: cannot read it (retrying): failed to list *v1.Service: services "kubernetes" is forbidden`},
		// Given no default/kubernetes Service, then the reason says so.
		"missing": {answer: "missing", want: "not verified against Service default/kubernetes: it does not exist (watching for it)"},
		// Given a Service without the configured VIP, then it is a
		// mismatch, which the metric shows.
		"wrong VIP": {answer: "serve", wrongVIP: true, want: "--service-vip 127.0.0.1 is not a cluster IP of Service default/kubernetes (10.96.0.1)", mismatch: 1},
		// Given a Service with the configured VIP and port, then the agent
		// intercepts and is ready.
		"match": {answer: "serve"},
	} {
		t.Run(name, func(t *testing.T) {
			a, _, _ := newServiceCheckAgent(t, tc.answer, tc.wrongVIP)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			defer a.icpt.RemoveStale()
			if tc.answer != "" {
				done := make(chan struct{})
				go func() { defer close(done); a.icpt.watchService(ctx) }()
				defer func() { cancel(); <-done }()
				waitForService(t, a, func(c *serviceCheck) bool { return c != nil })
			}
			want := strings.ReplaceAll(tc.want, "%d", strconv.Itoa(int(a.cfg.ServicePort)))
			a.icpt.syncOrStepAside(ctx)
			checkReasons(t, a, want)
			if got := testutil.ToFloat64(a.icpt.serviceMismatchCollector()); got != tc.mismatch {
				t.Errorf("kube_apicache_service_mismatch = %v, want %v", got, tc.mismatch)
			}
		})
	}

	// Given RBAC that forbids reading the Service, when it is allowed,
	// then the informer's retry reads it and the agent intercepts; a
	// watch that fails after that changes nothing.
	t.Run("forbidden, then allowed", func(t *testing.T) {
		a, _, answer := newServiceCheckAgent(t, "forbidden", false)
		ctx, cancel := context.WithCancel(context.Background())
		defer a.icpt.RemoveStale()
		done := make(chan struct{})
		go func() { defer close(done); a.icpt.watchService(ctx) }()
		defer func() { cancel(); <-done }()
		waitForService(t, a, func(c *serviceCheck) bool { return c != nil && strings.Contains(c.unread, "forbidden") })
		a.icpt.syncOrStepAside(ctx)
		checkReasons(t, a, "is forbidden")
		select {
		case <-a.icpt.syncNow:
		default:
			t.Errorf("the failed read requested no sync")
		}
		answer.Store("serve")
		waitForService(t, a, func(c *serviceCheck) bool { return c != nil && c.read })
		a.icpt.syncOrStepAside(ctx)
		checkReasons(t, a, "")
		a.icpt.serviceNotRead(klog.Background(), "cannot read it: connection refused")
		a.icpt.syncOrStepAside(ctx)
		checkReasons(t, a, "")
	})
}

// newServiceCheckAgent returns a test agent that has not read the
// kubernetes Service, whose upstream serves that Service as answer says
// (kubernetesServiceAPI), and the Service: the configured VIP and port,
// or another VIP with wrongVIP.
func newServiceCheckAgent(t *testing.T, answer string, wrongVIP bool) (*testAgent, *corev1.Service, *atomic.Value) {
	t.Helper()
	var ans atomic.Value
	ans.Store(answer)
	svc := &corev1.Service{}
	k := newFakeKernel(t)
	ep := newTestEndpoint(t, kubernetesServiceAPI(t, &ans, svc))
	a, vip := newSyncTestAgent(t, k, ep)
	a.cfg.LivenessTimeout = time.Second
	a.icpt.service.Store(nil)
	ip := vip.Addr().String()
	if wrongVIP {
		ip = "10.96.0.1"
	}
	*svc = corev1.Service{
		TypeMeta:   metav1.TypeMeta{Kind: "Service", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "kubernetes", ResourceVersion: "7"},
		Spec: corev1.ServiceSpec{ClusterIP: ip, ClusterIPs: []string{ip},
			Ports: []corev1.ServicePort{{Name: "https", Port: int32(vip.Port()), Protocol: corev1.ProtocolTCP}}},
	}
	return a, svc, &ans
}

// waitForService waits up to 10 seconds (the informer retries a failed
// list after about a second) for the agent's Service check to satisfy
// cond.
func waitForService(t *testing.T, a *testAgent, cond func(*serviceCheck) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond(a.icpt.service.Load()) {
		if time.Now().After(deadline) {
			t.Fatalf("Service check %+v after 10s", a.icpt.service.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkReasons checks that the agent intercepts and is ready when want is
// "", and otherwise that it neither intercepts (no family active, no
// "unhealthy": it stood aside on purpose) nor is ready, with want in both
// reasons.
func checkReasons(t *testing.T, a *testAgent, want string) {
	t.Helper()
	icpt, ready := a.Intercepting(), a.Ready()
	if want == "" {
		if icpt != nil || ready != nil || !a.icpt.anyActive() {
			t.Errorf("Intercepting() = %v, Ready() = %v, redirect installed %t; want intercepting and ready", icpt, ready, a.icpt.anyActive())
		}
		return
	}
	if icpt == nil || !strings.Contains(icpt.Error(), want) || strings.Contains(icpt.Error(), "unhealthy") {
		t.Errorf("Intercepting() = %v, want the reason %q", icpt, want)
	}
	if ready == nil || !strings.Contains(ready.Error(), want) {
		t.Errorf("Ready() = %v, want not ready with %q", ready, want)
	}
	if a.icpt.anyActive() {
		t.Errorf("the redirect is installed")
	}
}
