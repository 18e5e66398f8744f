package interception

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
)

// Refusals as kube-apiserver words them (the node's as observed in the e2e
// sandbox, see internal/nodeimpersonation).
var (
	errNoBinding = forbidden(`pods is forbidden: User "system:serviceaccount:kube-apicache:kube-apicache" cannot impersonate-on:associated-node:list resource "pods" in API group "" at the cluster scope`)
	errNoGate    = forbidden(`users "system:node:node-a" is forbidden: User "system:serviceaccount:kube-apicache:kube-apicache" cannot impersonate resource "users" in API group "" at the cluster scope`)
	errNoRBAC    = forbidden(`pods is forbidden: User "system:serviceaccount:kube-apicache:kube-apicache" cannot list resource "pods" in API group "" at the cluster scope`)
	errDown      = apierrors.NewServiceUnavailable("etcd is down")
)

func forbidden(msg string) error {
	return &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: http.StatusForbidden,
		Reason: metav1.StatusReasonForbidden, Message: msg}}
}

// scriptedSource answers every list and watch with its err of the moment
// (nil: an empty list) and counts the calls.
type scriptedSource struct {
	mu    sync.Mutex
	err   error
	calls int
}

func (s *scriptedSource) set(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.err = err
}

func (s *scriptedSource) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

func (s *scriptedSource) answer() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	return s.err
}

func (s *scriptedSource) ListWithContext(context.Context, metav1.ListOptions) (runtime.Object, error) {
	if err := s.answer(); err != nil {
		return nil, err
	}
	return &metav1.List{}, nil
}

func (s *scriptedSource) WatchWithContext(context.Context, metav1.ListOptions) (watch.Interface, error) {
	if err := s.answer(); err != nil {
		return nil, err
	}
	return watch.NewEmptyWatch(), nil
}

// step is one list (or watch) by the reflector, then what the source
// must report.
type step struct {
	// before sets the sources' answers and advances the clock.
	node, agent error
	advance     time.Duration
	watch       bool
	// wantErr: the call fails; wantSource, wantReason: the state after it
	// (the reason holds the phrase); wantNodeCalls, wantAgentCalls: the
	// requests each identity has had so far.
	wantErr                       bool
	wantSource, wantReason        string
	wantNodeCalls, wantAgentCalls int
}

// TestPodsSource drives the choice of identity for this node's pods
// through the refusals kube-apiserver answers.
func TestPodsSource(t *testing.T) {
	for _, tc := range []struct {
		name string
		// impersonate: the local configuration impersonates the node.
		impersonate bool
		steps       []step
	}{{
		// The node impersonation works: the agent's identity is never
		// used.
		name: "as the node", impersonate: true,
		steps: []step{
			{wantSource: PodsSourceNode, wantNodeCalls: 1},
			{watch: true, wantSource: PodsSourceNode, wantNodeCalls: 2},
		},
	}, {
		// The binding is missing and the agent may list pods: the
		// fallback says why, the node is not asked again until its
		// retry period has passed, and once the binding is fixed the
		// node is the source again.
		name: "fallback to the agent and back", impersonate: true,
		steps: []step{
			{node: errNoBinding, wantSource: PodsSourceAgent, wantReason: "kube-apicache:node-impersonation", wantNodeCalls: 1, wantAgentCalls: 1},
			{node: errNoBinding, watch: true, advance: time.Minute, wantSource: PodsSourceAgent, wantNodeCalls: 1, wantAgentCalls: 2},
			{node: errNoBinding, watch: true, advance: podsNodeRetryPeriod, wantSource: PodsSourceAgent, wantNodeCalls: 2, wantAgentCalls: 3},
			{watch: true, advance: time.Minute, wantSource: PodsSourceAgent, wantNodeCalls: 2, wantAgentCalls: 4},
			{watch: true, advance: podsNodeRetryPeriod, wantSource: PodsSourceNode, wantNodeCalls: 3, wantAgentCalls: 4},
		},
	}, {
		// Neither identity may: none, with both reasons; no request is
		// made before the backoff has passed; once the agent is allowed,
		// it is the source.
		name: "refused both, backing off", impersonate: true,
		steps: []step{
			{node: errNoGate, agent: errNoRBAC, wantErr: true, wantSource: PodsSourceNone, wantReason: "ConstrainedImpersonation", wantNodeCalls: 1, wantAgentCalls: 1},
			{node: errNoGate, agent: errNoRBAC, watch: true, advance: time.Second, wantErr: true, wantSource: PodsSourceNone, wantReason: "as the agent", wantNodeCalls: 1, wantAgentCalls: 1},
			{node: errNoGate, advance: podsRefusedMaxWait * 2, wantSource: PodsSourceAgent, wantReason: "ConstrainedImpersonation", wantNodeCalls: 2, wantAgentCalls: 2},
		},
	}, {
		// An unreachable or failing kube-apiserver is no refusal: no
		// fallback, and the source stays.
		name: "not a refusal", impersonate: true,
		steps: []step{
			{node: errDown, wantErr: true, wantSource: PodsSourceNone, wantReason: "etcd is down", wantNodeCalls: 1},
			{wantSource: PodsSourceNode, wantNodeCalls: 2},
			{node: errDown, watch: true, wantErr: true, wantSource: PodsSourceNode, wantNodeCalls: 3},
		},
	}, {
		// --cache-as-node=false: the agent's identity only.
		name: "without impersonation",
		steps: []step{
			{wantSource: PodsSourceAgent, wantAgentCalls: 1},
			{agent: errNoRBAC, watch: true, wantErr: true, wantSource: PodsSourceNone, wantReason: "as the agent", wantAgentCalls: 2},
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
			node, agent := &scriptedSource{}, &scriptedSource{}
			var asNode toolscache.ListerWatcherWithContext
			if tc.impersonate {
				asNode = node
			}
			gauge := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "source"}, []string{"source"})
			s := newPodsSource(asNode, agent, "system:node:node-a", func() time.Time { return now }, gauge)
			if src, reason := s.state(); src != PodsSourceNone || reason != podsNotListedYet {
				t.Fatalf("before the first list: %s (%s), want none (not listed yet)", src, reason)
			}
			for i, st := range tc.steps {
				now = now.Add(st.advance)
				node.set(st.node)
				agent.set(st.agent)
				var err error
				if st.watch {
					_, err = s.WatchWithContext(context.Background(), metav1.ListOptions{})
				} else {
					_, err = s.ListWithContext(context.Background(), metav1.ListOptions{})
				}
				if (err != nil) != st.wantErr {
					t.Errorf("step %d: error %v, want one: %v", i, err, st.wantErr)
				}
				src, reason := s.state()
				if src != st.wantSource || !strings.Contains(reason, st.wantReason) {
					t.Errorf("step %d: source %s (%s), want %s with %q", i, src, reason, st.wantSource, st.wantReason)
				}
				if (st.wantSource == PodsSourceNode || !tc.impersonate && st.wantSource == PodsSourceAgent) && reason != "" {
					t.Errorf("step %d: %s by choice, with a reason: %s", i, st.wantSource, reason)
				}
				if got := node.count(); got != st.wantNodeCalls {
					t.Errorf("step %d: %d requests as the node, want %d", i, got, st.wantNodeCalls)
				}
				if got := agent.count(); got != st.wantAgentCalls {
					t.Errorf("step %d: %d requests as the agent, want %d", i, got, st.wantAgentCalls)
				}
				for _, each := range PodsSources {
					want := 0.0
					if each == st.wantSource {
						want = 1
					}
					if got := testutil.ToFloat64(gauge.WithLabelValues(each)); got != want {
						t.Errorf("step %d: gauge{source=%q} = %v, want %v", i, each, got, want)
					}
				}
			}
		})
	}
}

// TestLocalPods: LocalPods reports the source only where the agent
// follows this node's pods, and in PodIPs mode that only host-network
// traffic is intercepted until their first list arrives.
func TestLocalPods(t *testing.T) {
	for _, tc := range []struct {
		mode string
		// want before and after the first list.
		wantBefore, wantAfter LocalPods
	}{{
		mode:       DetectLocalPodIPs,
		wantBefore: LocalPods{Source: PodsSourceNone, Reason: podsNotListedYet, HostNetworkOnly: true},
		wantAfter:  LocalPods{Source: PodsSourceNone, Reason: podsNotListedYet + "; the pod IPs of the last list are kept"},
	}, {
		mode: DetectLocalNone,
	}} {
		t.Run(tc.mode, func(t *testing.T) {
			ep := newTestEndpoint(t, ok)
			a := newTestAgent(ep)
			cfg := validConfig()
			cfg.DetectLocalMode = tc.mode
			wireTestAgent(t, a, cfg, newFakeKernel(t))
			if got := a.icpt.LocalPods(); got != tc.wantBefore {
				t.Errorf("before the first list: %+v, want %+v", got, tc.wantBefore)
			}
			a.icpt.local.set("default/a", []netip.Addr{netip.MustParseAddr("10.244.1.5")}, false)
			if got := a.icpt.LocalPods(); got != tc.wantAfter {
				t.Errorf("after the first list: %+v, want %+v", got, tc.wantAfter)
			}
			gathered, err := testutil.GatherAndCount(a.metrics.registry, "kube_apicache_local_pods_source")
			if err != nil {
				t.Fatal(err)
			}
			if want := map[bool]int{true: len(PodsSources)}[tc.wantBefore.Source != ""]; gathered != want {
				t.Errorf("%d series of kube_apicache_local_pods_source, want %d", gathered, want)
			}
		})
	}
}

// TestWatchLocalPodsFallback: against a kube-apiserver that refuses the
// node impersonation (no constrained impersonation) but lets the agent
// list pods, the pods set is filled through the agent's identity, and the
// impersonated requests carried only Impersonate-User.
func TestWatchLocalPodsFallback(t *testing.T) {
	const pod = `{"kind":"Pod","apiVersion":"v1","metadata":{"name":"a","namespace":"default","resourceVersion":"5"},` +
		`"spec":{"nodeName":"node-a"},"status":{"phase":"Running","podIPs":[{"ip":"10.244.1.5"}]}}`
	var mu sync.Mutex
	var impersonated []http.Header
	ep := newTestEndpoint(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/pods" || r.URL.Query().Get("fieldSelector") != "spec.nodeName=node-a" {
			http.Error(w, "unexpected "+r.URL.String(), http.StatusBadRequest)
			return
		}
		if user := r.Header.Get("Impersonate-User"); user != "" {
			mu.Lock()
			impersonated = append(impersonated, r.Header.Clone())
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			_, _ = fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":403,"message":%q}`,
				`users "`+user+`" is forbidden: User "system:serviceaccount:kube-apicache:kube-apicache" cannot impersonate resource "users" in API group "" at the cluster scope`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		q := r.URL.Query()
		switch {
		case q.Get("watch") != "true":
			_, _ = w.Write([]byte(`{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"5"},"items":[` + pod + `]}`))
		case q.Get("sendInitialEvents") == "true":
			_, _ = w.Write([]byte(`{"type":"ADDED","object":` + pod + "}\n"))
			_, _ = w.Write([]byte(`{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"5",` +
				`"annotations":{"k8s.io/initial-events-end":"true"}}}}` + "\n"))
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		default:
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}
	})
	a := newTestAgent(ep)
	cfg := validConfig()
	cfg.DetectLocalMode = DetectLocalPodIPs
	wireTestAgent(t, a, cfg, newFakeKernel(t))
	local := a.restConfig()
	local.Impersonate = rest.ImpersonationConfig{UserName: "system:node:node-a"}
	src, err := a.icpt.newPodsSource(local)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.icpt.watchLocalPods(ctx, src)
	}()
	defer func() { cancel(); <-done }()

	deadline := time.Now().Add(10 * time.Second)
	for {
		if ips, listed := a.icpt.local.podIPs(); listed && len(ips) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pods set was not filled: %+v", a.icpt.LocalPods())
		}
		time.Sleep(10 * time.Millisecond)
	}
	got := a.icpt.LocalPods()
	if got.Source != PodsSourceAgent || got.HostNetworkOnly || !strings.Contains(got.Reason, "ConstrainedImpersonation") {
		t.Errorf("LocalPods = %+v, want the agent as the source, saying why the node was refused", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(impersonated) == 0 {
		t.Fatal("the node was never tried")
	}
	for _, h := range impersonated {
		for k := range h {
			if strings.HasPrefix(k, "Impersonate-") && k != "Impersonate-User" {
				t.Errorf("impersonated request carried %s", k)
			}
		}
	}
}
