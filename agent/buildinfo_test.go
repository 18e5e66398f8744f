package agent

import (
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kube-apicache/kube-apicache/agent/serving"
	"github.com/kube-apicache/kube-apicache/agent/version"
	"github.com/kube-apicache/kube-apicache/cache"
)

// newAgentFromNew returns an agent built by New over the fake kernel, as
// the command builds it with its defaults: CSR mode, the default cached
// resources, the metrics server and the pod-path check. Nothing runs.
func newAgentFromNew(t *testing.T) *Agent {
	t.Helper()
	k := newFakeKernel(t)
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	t.Cleanup(srv.Close)
	ca := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := dataplaneConfig()
	u, _ := url.Parse(srv.URL)
	cfg.Upstreams = []*url.URL{u}
	cfg.TLSCertFile, cfg.TLSKeyFile = "", ""
	cfg.UpstreamCAFile, cfg.PodCAFile = ca, ca
	cfg.MetricsBindAddress = DefaultMetricsBindAddress
	cfg.PodPathCheckInterval, cfg.BypassDuration = DefaultPodPathCheckInterval, DefaultBypassDuration
	cfg.CacheWaitTimeout, cfg.CacheIdleTimeout = cache.DefaultWaitTimeout, cache.DefaultIdleTimeout
	cfg.CacheHistoryEvents, cfg.CacheHistoryBytes = cache.DefaultHistoryEvents, cache.DefaultHistoryBytes
	cfg.Limits = serving.DefaultLimits()
	var err error
	if cfg.CacheResources, err = cache.ParseResources(cache.DefaultResources); err != nil {
		t.Fatal(err)
	}
	a, err := New(cfg, k.kernel())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.icpt.RemoveStale)
	return a
}

// descName is the fully-qualified name in a prometheus.Desc's String().
var descName = regexp.MustCompile(`fqName: "([^"]+)"`)

// registeredNames returns the name of every metric registered in reg,
// including vectors that have no series yet (which Gather leaves out).
func registeredNames(t *testing.T, reg *prometheus.Registry) map[string]bool {
	t.Helper()
	ch := make(chan *prometheus.Desc)
	go func() {
		reg.Describe(ch)
		close(ch)
	}()
	names := map[string]bool{}
	for d := range ch {
		m := descName.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("no name in %s", d)
		}
		names[m[1]] = true
	}
	return names
}

// TestBuildInfo: the agent's registry exports kube_apicache_build_info,
// 1, labelled with the provenance version.Get() reports, which `version`
// and --version print too.
func TestBuildInfo(t *testing.T) {
	a := newAgentFromNew(t)
	families, err := a.metrics.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	v := version.Get()
	want := map[string]string{
		"git_version": v.GitVersion,
		"git_commit":  v.GitCommit,
		"build_date":  v.BuildDate,
		"go_version":  v.GoVersion,
		"platform":    v.Platform,
	}
	found := false
	for _, f := range families {
		if f.GetName() != "kube_apicache_build_info" {
			continue
		}
		found = true
		if len(f.GetMetric()) != 1 {
			t.Fatalf("kube_apicache_build_info has %d series, want 1", len(f.GetMetric()))
		}
		m := f.GetMetric()[0]
		if got := m.GetGauge().GetValue(); got != 1 {
			t.Errorf("kube_apicache_build_info = %v, want 1", got)
		}
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		if len(got) != len(want) {
			t.Errorf("labels %v, want exactly %v", got, want)
		}
		for name, value := range want {
			if got[name] != value {
				t.Errorf("label %s = %q, want %q (version.Get())", name, got[name], value)
			}
		}
	}
	if !found {
		t.Fatal("the agent's registry has no kube_apicache_build_info")
	}
	if v.GitVersion == "" || v.GoVersion == "" {
		t.Errorf("version.Get() = %+v: no version or Go version", v)
	}
}
