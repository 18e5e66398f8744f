package serving

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/agent/upstream"
	apicache "github.com/kube-apicache/kube-apicache/cache"

	"github.com/kube-apicache/kube-apicache/agent/internal/apihttp"
)

// BenchmarkForwardWrite measures a forwarded write through the serving
// stack the agent runs: the connection limiter, the server of newServer
// and the handler of buildHandler, with a cache of pods and services in
// front of the forwarder (the written ConfigMaps are not cached, as in the
// "writes" case of make bench). Client and upstream speak HTTP/2 over TLS,
// in process. The "direct" sub-benchmarks send the same requests to the
// upstream without the agent: what the client and the upstream cost. The
// "floor" sub-benchmarks send them through the least a forwarding agent
// can be, in Go: an HTTPS server with HTTP/2 (and, as the agent's here,
// httptest's certificate), whose handler is an httputil.ReverseProxy that only sets the upstream's
// URL, over a transport like the agent's (newFloorProxy). floor − direct
// is what a second HTTP/2 hop costs any such agent; agent − floor is the
// agent's own share per request.
//
//	go test ./agent/serving -run '^$' -bench ForwardWrite -benchmem
func BenchmarkForwardWrite(b *testing.B) {
	payload := strings.Repeat("x", 1024)
	object := func(gen int) []byte {
		return fmt.Appendf(nil, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm","labels":{"app.kubernetes.io/part-of":"bench"}},"data":{"generation":"%d","payload":%q}}`, gen, payload)
	}
	// The answer kube-apiserver gives a write of the ConfigMap.
	answer := fmt.Appendf(nil, `{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"cm","namespace":"bench","uid":"0b4c1d1e-8d0c-4c1e-9a7e-4b5e0f0a1b2c","resourceVersion":"12345","creationTimestamp":"2026-01-01T00:00:00Z","labels":{"app.kubernetes.io/part-of":"bench"}},"data":{"generation":"1","payload":%q}}`, payload)
	upstream := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Audit-Id", "7c0b5f0e-2b9e-4b8e-9c3a-1f2e3d4c5b6a")
		if r.Method == http.MethodPost {
			w.WriteHeader(http.StatusCreated)
		}
		_, _ = w.Write(answer)
	}))
	upstream.EnableHTTP2 = true
	upstream.StartTLS()
	defer upstream.Close()

	a := newBenchAgent(b, upstream)
	front := httptest.NewUnstartedServer(nil)
	front.Config = newServer(a.handler, benchCert{upstream.TLS}.GetCertificate, a.limits)
	front.Config.ErrorLog = apihttp.ServerErrorLog(klog.Background())
	front.Config.ConnState = a.metrics.trackConn
	front.Listener = newConnLimiter(a.limits, a.metrics, klog.Background()).listener(front.Listener)
	front.EnableHTTP2 = true
	front.StartTLS()
	defer front.Close()

	floor := httptest.NewUnstartedServer(newFloorProxy(upstream))
	floor.EnableHTTP2 = true
	floor.StartTLS()
	defer floor.Close()

	for _, path := range []struct {
		name   string
		base   string
		client *http.Client
	}{
		{"agent", front.URL, front.Client()},
		{"floor", floor.URL, floor.Client()},
		{"direct", upstream.URL, upstream.Client()},
	} {
		coll := path.base + "/api/v1/namespaces/bench/configmaps"
		for _, verb := range []struct {
			name, method, url, contentType string
			body                           []byte
		}{
			{"create", http.MethodPost, coll, "application/json", object(1)},
			{"update", http.MethodPut, coll + "/cm", "application/json", object(2)},
			{"patch", http.MethodPatch, coll + "/cm", "application/merge-patch+json", []byte(`{"data":{"generation":"3"}}`)},
			{"delete", http.MethodDelete, coll + "/cm", "", nil},
		} {
			b.Run(path.name+"/"+verb.name, func(b *testing.B) {
				do := func() {
					req, err := http.NewRequestWithContext(context.Background(), verb.method, verb.url, bytes.NewReader(verb.body))
					if err != nil {
						b.Fatal(err)
					}
					req.Header.Set("Authorization", "Bearer bench-token")
					req.Header.Set("Accept", "application/json")
					if verb.contentType != "" {
						req.Header.Set("Content-Type", verb.contentType)
					}
					resp, err := path.client.Do(req)
					if err != nil {
						b.Fatal(err)
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode >= 300 || resp.ProtoMajor != 2 {
						b.Fatalf("%s %s: %s over %s", verb.method, verb.url, resp.Status, resp.Proto)
					}
				}
				do() // the connections are open before the measurement
				b.ReportAllocs()
				for b.Loop() {
					do()
				}
			})
		}
	}
}

// newFloorProxy returns the cheapest forwarding handler to srv over HTTP/2:
// an httputil.ReverseProxy that sets the upstream's URL and nothing else,
// over newBenchTransport, with the agent's pool of copy buffers (without
// one, httputil.ReverseProxy allocates 32 KiB per request, which no agent
// needs to pay). No limits, metrics, authentication, cache or retries.
func newFloorProxy(srv *httptest.Server) http.Handler {
	u, _ := url.Parse(srv.URL)
	return &httputil.ReverseProxy{
		Rewrite:    func(pr *httputil.ProxyRequest) { pr.SetURL(u) },
		Transport:  newBenchTransport(srv),
		BufferPool: copyBuffers,
	}
}

// newBenchTransport returns a transport to srv with the settings
// upstream.New gives the agent's (HTTP/2, idle connections, receive
// buffer per stream), trusting srv's certificate.
func newBenchTransport(srv *httptest.Server) *http.Transport {
	t := srv.Client().Transport.(*http.Transport).Clone()
	t.ForceAttemptHTTP2 = true
	t.MaxIdleConns, t.MaxIdleConnsPerHost = 1000, 100
	t.HTTP2 = &http.HTTP2Config{MaxReceiveBufferPerStream: DefaultHTTP2MaxUpstreamStreamBuffer}
	return t
}

// newBenchAgent returns an agent, with a cache of pods and services and
// the default limits, that forwards to upstream over HTTP/2 with the
// transport settings of upstream.New.
func newBenchAgent(b *testing.B, srv *httptest.Server) *Server {
	b.Helper()
	u, _ := url.Parse(srv.URL)
	up := upstream.NewWithTransport(newBenchTransport(srv), upstream.Config{Endpoints: []*url.URL{u}, MaxBufferedBodyBytes: DefaultMaxBufferedBodyBytes})
	drain, startDrain := context.WithCancel(context.Background())
	b.Cleanup(startDrain)
	reg := prometheus.NewRegistry()
	specs, err := apicache.ParseResources("pods,services")
	if err != nil {
		b.Fatal(err)
	}
	c, err := apicache.New(apicache.Config{NodeName: "node-a", Resources: specs, RESTConfig: &rest.Config{Host: srv.URL},
		OnDemand: true, MaxInFlightPerSource: apicache.DefaultMaxInFlightPerSource, Registerer: reg})
	if err != nil {
		b.Fatal(err)
	}
	return New(Options{Limits: DefaultLimits(), Upstream: up, Cache: c, Degraded: func() bool { return false }, Drain: drain, Registry: reg,
		SkipSource: func(netip.Addr) (bool, error) { return false, nil }, IsNodeAddress: func(netip.Addr) bool { return false }})
}

// benchCert serves the test server's certificate.
type benchCert struct{ tls *tls.Config }

func (c benchCert) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return &c.tls.Certificates[0], nil
}
func (benchCert) Ready() error            { return nil }
func (benchCert) Run(ctx context.Context) {}
