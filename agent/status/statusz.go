package status

import (
	"encoding/json"
	"net/http"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/kube-apicache/kube-apicache/agent/version"
)

// StatuszPath serves the agent's Status as JSON, for `kube-apicache status`
// and people. It is readable without credentials, like the health paths:
// kube-apiserver's pods proxy, which the status command goes through,
// forwards no caller identity. It says nothing the health paths and an
// aggregate count do not: no object, no caller, no resource name.
const StatuszPath = "/statusz"

// Status is one agent's state at a glance.
type Status struct {
	Node      string `json:"node"`
	Version   string `json:"version"`
	Dataplane string `json:"dataplane"`
	// Intercepting and Ready, with the reason when false.
	Intercepting       bool   `json:"intercepting"`
	InterceptingReason string `json:"interceptingReason,omitempty"`
	Ready              bool   `json:"ready"`
	ReadyReason        string `json:"readyReason,omitempty"`
	// PodsSource is whose identity lists this node's pods, whose IPs the
	// redirect matches in detect-local PodIPs mode: node, agent (its own
	// ServiceAccount: --cache-as-node=false, or the fallback while the
	// node impersonation is refused) or none; empty where the agent does
	// not follow them. PodsSourceReason says why not the node.
	PodsSource       string `json:"podsSource,omitempty"`
	PodsSourceReason string `json:"podsSourceReason,omitempty"`
	// HostNetworkOnly is set while the agent intercepts host-network
	// traffic only: this node's pods have never been listed, so no pod's
	// traffic is redirected (PodsSourceReason says why).
	HostNetworkOnly bool `json:"hostNetworkOnly,omitempty"`
	// Upstreams are the kube-apiserver endpoints and their health.
	Upstreams []UpstreamStatus `json:"upstreams"`
	// CertificateNotAfter is when the serving certificate expires; zero
	// without one.
	CertificateNotAfter *time.Time `json:"certificateNotAfter,omitempty"`
	// Cache counts the reads the cache considered since start-up, by
	// outcome (hit, forwarded, denied).
	Cache map[string]float64 `json:"cache"`
}

// UpstreamStatus is one kube-apiserver endpoint.
type UpstreamStatus struct {
	Endpoint string `json:"endpoint"`
	Healthy  bool   `json:"healthy"`
	Active   bool   `json:"active"`
}

// Status returns the agent's Status now.
func (srv *Server) Status() Status {
	s := Status{
		Node:      srv.cfg.NodeName,
		Version:   version.Get().GitVersion,
		Dataplane: srv.checks.Dataplane,
		Cache:     map[string]float64{},
	}
	if err := srv.checks.Intercepting(); err != nil {
		s.InterceptingReason = err.Error()
	} else {
		s.Intercepting = true
	}
	lp := srv.checks.localPods()
	s.PodsSource, s.PodsSourceReason = lp.Source, lp.Reason
	s.HostNetworkOnly = s.Intercepting && lp.HostNetworkOnly
	if err := srv.checks.Ready(); err != nil {
		s.ReadyReason = err.Error()
	} else {
		s.Ready = true
	}
	s.Upstreams = srv.checks.Upstreams()
	families, _ := srv.gatherer.Gather()
	for _, f := range families {
		switch f.GetName() {
		case "kube_apicache_cache_requests_total":
			for _, m := range f.GetMetric() {
				s.Cache[label(m, "outcome")] += m.GetCounter().GetValue()
			}
		case "kube_apicache_serving_certificate_expiration_timestamp_seconds":
			for _, m := range f.GetMetric() {
				if v := m.GetGauge().GetValue(); v > 0 {
					t := time.Unix(int64(v), 0).UTC()
					s.CertificateNotAfter = &t
				}
			}
		}
	}
	return s
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// statuszMaxAge is how long one computed Status answers /statusz: anyone
// can ask for it, and computing it gathers every metric.
const statuszMaxAge = time.Second

// statuszHandler serves Status as JSON, computed at most once per
// statuszMaxAge whatever the request rate.
func (srv *Server) statuszHandler() http.Handler {
	var mu sync.Mutex
	var body []byte
	var at time.Time
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		if body == nil || time.Since(at) >= statuszMaxAge {
			body, _ = json.Marshal(srv.Status())
			at = time.Now()
		}
		b := body
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(b)
	})
}

// dataplaneNote is the backend and why it was chosen, for /readyz.
func (c Checks) dataplaneNote() string {
	if c.Dataplane == "" {
		return ""
	}
	return c.Dataplane + " (" + c.DataplaneReason + ")"
}
