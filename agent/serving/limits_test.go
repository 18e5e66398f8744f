package serving

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/agent/h2test"

	"github.com/kube-apicache/kube-apicache/agent/internal/apihttp"
)

// staticCert is a certSource with one self-signed certificate for
// 127.0.0.1.
type staticCert struct {
	pair *tls.Certificate
	pool *x509.CertPool
}

func newStaticCert(t *testing.T) *staticCert {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "test"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return &staticCert{pair: &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool: pool}
}

func (s *staticCert) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return s.pair, nil
}
func (s *staticCert) Ready() error        { return nil }
func (s *staticCert) Run(context.Context) {}

// testServer is newServer on a loopback TLS listener with its connection
// limiter.
type testServer struct {
	addr    string
	cert    *staticCert
	srv     *http.Server
	conns   *metrics
	limiter *connLimiter
}

func startTestServer(t *testing.T, h http.Handler, limits Limits) *testServer {
	t.Helper()
	cert := newStaticCert(t)
	srv := newServer(h, cert.GetCertificate, limits)
	m := newMetrics(prometheus.NewRegistry())
	srv.ConnState = m.trackConn
	srv.ErrorLog = apihttp.ServerErrorLog(klog.Background())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	limiter := newConnLimiter(limits, m, klog.Background())
	go func() { _ = srv.Serve(tls.NewListener(limiter.listener(l), srv.TLSConfig)) }()
	t.Cleanup(func() { _ = srv.Close() })
	return &testServer{addr: l.Addr().String(), cert: cert, srv: srv, conns: m, limiter: limiter}
}

// client returns an HTTP client for the server, over HTTP/2 or HTTP/1.1.
func (s *testServer) client(h2 bool) *http.Client {
	return s.clientFrom("127.0.0.1", h2)
}

// clientFrom is client with connections from the loopback address src:
// another source, as another pod.
func (s *testServer) clientFrom(src string, h2 bool) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: s.cert.pool}, ForceAttemptHTTP2: h2, DialContext: d.DialContext}
	if !h2 {
		tr.TLSClientConfig.NextProtos = []string{"http/1.1"}
	}
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// dial opens a raw TLS connection offering protos.
func (s *testServer) dial(t *testing.T, protos ...string) *tls.Conn {
	t.Helper()
	return s.dialFrom(t, "127.0.0.1", protos...)
}

// dialFrom is dial from the loopback address src.
func (s *testServer) dialFrom(t *testing.T, src string, protos ...string) *tls.Conn {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c, err := tls.DialWithDialer(d, "tcp", s.addr, &tls.Config{RootCAs: s.cert.pool, NextProtos: protos})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestServerTLS checks the TLS floor and the offered protocols.
func TestServerTLS(t *testing.T) {
	s := startTestServer(t, http.NotFoundHandler(), Limits{})
	for _, tc := range []struct {
		name   string
		max    uint16
		protos []string
		want   string // negotiated protocol; "" means the handshake fails
	}{
		// Given a TLS 1.1 client, then the handshake fails.
		{"TLS 1.1 refused", tls.VersionTLS11, nil, ""},
		// Given a TLS 1.2 client offering h2, then h2 is chosen.
		{"TLS 1.2 h2", tls.VersionTLS12, []string{"h2", "http/1.1"}, "h2"},
		// Given a client offering only HTTP/1.1, then HTTP/1.1 is chosen.
		{"TLS 1.3 http/1.1", tls.VersionTLS13, []string{"http/1.1"}, "http/1.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := tls.Dial("tcp", s.addr, &tls.Config{RootCAs: s.cert.pool, MinVersion: tls.VersionTLS10, MaxVersion: tc.max, NextProtos: tc.protos})
			if tc.want == "" {
				if err == nil {
					c.Close()
					t.Fatalf("handshake with max version %x succeeded", tc.max)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if got := c.ConnectionState().NegotiatedProtocol; got != tc.want {
				t.Errorf("negotiated %q, want %q", got, tc.want)
			}
		})
	}
}

// TestServerHeaderLimit checks the header limit. Over HTTP/1.1 headers
// above MaxHeaderBytes get 431. Over HTTP/2 net/http stops reading a header
// block once it is well past the limit and closes the connection
// (CVE-2023-45288's CONTINUATION flood protection): PROTOCOL_ERROR when the
// excess arrives in more frames, COMPRESSION_ERROR for a single field
// longer than the limit; kube-apiserver, on the same server, does the same.
// Either way the agent keeps serving other clients.
func TestServerHeaderLimit(t *testing.T) {
	s := startTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
	}), Limits{})
	for _, tc := range []struct {
		size   int
		want   int
		goaway string // over HTTP/2, in 64 KiB fields
	}{
		{512 << 10, http.StatusOK, ""},
		{2 << 20, http.StatusRequestHeaderFieldsTooLarge, "PROTOCOL_ERROR"},
	} {
		t.Run(fmt.Sprintf("http1/%d", tc.size), func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodGet, "https://"+s.addr+"/api/v1/pods", nil)
			req.Header.Set("X-Big", strings.Repeat("a", tc.size))
			resp, err := s.client(false).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Errorf("%d-byte header: %d, want %d", tc.size, resp.StatusCode, tc.want)
			}
		})
		t.Run(fmt.Sprintf("h2/%d", tc.size), func(t *testing.T) {
			var fields []string
			for left := tc.size; left > 0; left -= 64 << 10 {
				fields = append(fields, strings.Repeat("a", min(left, 64<<10)))
			}
			got, goaway := h2BigHeader(t, s.dial(t, "h2"), s.addr, fields)
			if goaway != tc.goaway || (goaway == "" && got != tc.want) {
				t.Errorf("%d header bytes: status %d, GOAWAY %q; want status %d or GOAWAY %q", tc.size, got, goaway, tc.want, tc.goaway)
			}
		})
	}
	if got, goaway := h2BigHeader(t, s.dial(t, "h2"), s.addr, []string{strings.Repeat("a", 2<<20)}); goaway != "COMPRESSION_ERROR" {
		t.Errorf("one 2 MiB HTTP/2 header field: status %d, GOAWAY %q; want GOAWAY COMPRESSION_ERROR", got, goaway)
	}
	resp, err := s.client(true).Get("https://" + s.addr + "/api/v1/pods")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
}

// h2BigHeader sends one HTTP/2 request with the given x-big-N header values
// on c and returns the response status, or the GOAWAY error code if the
// server closed the connection instead.
func h2BigHeader(t *testing.T, c net.Conn, authority string, values []string) (status int, goaway string) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, hf := range [][2]string{{":method", "GET"}, {":scheme", "https"}, {":authority", authority}, {":path", "/api/v1/pods"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: hf[0], Value: hf[1]})
	}
	for i, v := range values {
		_ = enc.WriteField(hpack.HeaderField{Name: fmt.Sprintf("x-big-%d", i), Value: v})
	}
	// The server may answer before the last fragment, so write from a
	// goroutine.
	go func() {
		block := hb.Bytes()
		const chunk = 16 << 10
		n := min(chunk, len(block))
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block[:n], EndStream: true, EndHeaders: n == len(block)}); err != nil {
			return
		}
		for rest := block[n:]; len(rest) > 0; {
			n := min(chunk, len(rest))
			if err := fr.WriteContinuation(1, n == len(rest), rest[:n]); err != nil {
				return
			}
			rest = rest[n:]
		}
	}()
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("reading the answer: %v", err)
		}
		// SETTINGS are not acknowledged: a Framer must not be written from
		// two goroutines, and the server does not insist.
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			code, _ := strconv.Atoi(f.PseudoValue("status"))
			return code, ""
		case *http2.GoAwayFrame:
			return 0, f.ErrCode.String()
		case *http2.RSTStreamFrame:
			t.Fatalf("RST_STREAM %s instead of an answer", f.ErrCode)
		}
	}
}

// TestServerFraming pins how ambiguous HTTP/1.1 message framing is treated.
// net/http reads a request with both Content-Length and Transfer-Encoding:
// chunked as chunked and drops the Content-Length before any handler runs,
// so the agent cannot see (and does not need to refuse) the combination:
// the forwarder re-frames every body it relays, and bytes past the chunked
// body are parsed as the client's next request on its own connection,
// authenticated as that client. Conflicting Content-Lengths get 400 and
// transfer codings other than chunked 501.
func TestServerFraming(t *testing.T) {
	type seen struct {
		method, path, body string
		contentLength      int64
		clHeader           string
	}
	var mu sync.Mutex
	var got []seen
	upstream := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, seen{r.Method, r.URL.Path, string(b), r.ContentLength, r.Header.Get("Content-Length")})
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	defer upstream.Close()
	a := newTestAgent(t, upstream)
	s := startTestServer(t, a.handler, Limits{})

	for _, tc := range []struct {
		name string
		raw  string
		// want are the status lines the client reads, in order.
		want []string
		// upstream is what the upstream received, in order.
		upstream []seen
	}{{
		// Given Content-Length: 4 and chunked, when the chunked body holds
		// a smuggled request, then the body is read as chunked and the
		// smuggled bytes become the same client's next request.
		name: "content-length and chunked",
		raw: "POST /api/v1/namespaces/a/configmaps HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n" +
			"5\r\nhello\r\n0\r\n\r\n" +
			"GET /api/v1/namespaces/b/secrets HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
		want: []string{"HTTP/1.1 201", "HTTP/1.1 201"},
		upstream: []seen{
			{"POST", "/api/v1/namespaces/a/configmaps", "hello", -1, ""},
			{"GET", "/api/v1/namespaces/b/secrets", "", 0, ""},
		},
	}, {
		// Given two different Content-Lengths, then 400 and nothing relayed.
		name: "conflicting content-lengths",
		raw:  "POST /api/v1/namespaces/a/configmaps HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\nhello",
		want: []string{"HTTP/1.1 400"},
	}, {
		// Given a transfer coding other than chunked, then 501.
		name: "gzip, chunked",
		raw:  "POST /api/v1/namespaces/a/configmaps HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
		want: []string{"HTTP/1.1 501"},
	}, {
		// Given two Transfer-Encoding fields, then 501.
		name: "two transfer-encodings",
		raw:  "POST /api/v1/namespaces/a/configmaps HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		want: []string{"HTTP/1.1 501"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			got = nil
			mu.Unlock()
			c := s.dial(t, "http/1.1")
			if _, err := io.WriteString(c, tc.raw); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			br := bufio.NewReader(c)
			for _, want := range tc.want {
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("reading response: %v", err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if line := fmt.Sprintf("HTTP/1.1 %d", resp.StatusCode); line != want {
					t.Errorf("got %s, want %s", line, want)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if fmt.Sprint(got) != fmt.Sprint(tc.upstream) {
				t.Errorf("upstream received %+v, want %+v", got, tc.upstream)
			}
		})
	}
}

// TestServerSlowloris checks that connections trickling their headers are
// closed at the header timeout while other clients are served.
func TestServerSlowloris(t *testing.T) {
	const timeout = 500 * time.Millisecond
	s := startTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
	}), Limits{ReadHeaderTimeout: timeout})
	const n = 20
	closedAfter := make(chan time.Duration, n)
	for range n {
		c := s.dial(t, "http/1.1")
		go func() {
			start := time.Now()
			msg := "GET /api/v1/pods HTTP/1.1\r\nHost: x\r\nX-Slow: " + strings.Repeat("a", 100)
			for i := 0; i < len(msg); i++ {
				if _, err := c.Write([]byte{msg[i]}); err != nil {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			// The server answers 408 or just closes; either way the read
			// ends.
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, _ = io.Copy(io.Discard, c)
			closedAfter <- time.Since(start)
		}()
	}
	resp, err := s.client(false).Get("https://" + s.addr + "/api/v1/pods")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("legitimate request during slowloris: %v %v", resp, err)
	}
	resp.Body.Close()
	var longest time.Duration
	for range n {
		d := <-closedAfter
		longest = max(longest, d)
	}
	t.Logf("%d slow connections closed; the longest lasted %s (header timeout %s)", n, longest.Round(time.Millisecond), timeout)
	if longest > timeout+2*time.Second {
		t.Errorf("a slow connection lasted %s, header timeout is %s", longest, timeout)
	}
}

// TestServerRapidReset pins net/http's HTTP/2 rapid-reset protection
// (CVE-2023-44487): a client that opens streams and resets them at once
// cannot run more handlers than the stream limit at a time, gets its
// connection closed when it keeps going, and other clients are served.
func TestServerRapidReset(t *testing.T) {
	const maxStreams = 10
	var running, peak, total atomic.Int32
	s := startTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := running.Add(1)
		total.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		// Work that does not notice the reset at once, as a relayed
		// request does not until its upstream answers.
		time.Sleep(20 * time.Millisecond)
		running.Add(-1)
	}), Limits{HTTP2MaxStreams: maxStreams})

	sent, goaway, err := h2test.RapidReset(s.dial(t, "h2"), s.addr, "/api/v1/pods", nil, 5000, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sent %d HEADERS+RST_STREAM pairs; GOAWAY: %s; handlers run: %d, at most %d at once", sent, goaway, total.Load(), peak.Load())
	if peak.Load() > maxStreams {
		t.Errorf("%d handlers ran at once, stream limit is %d", peak.Load(), maxStreams)
	}
	if goaway == "" {
		t.Errorf("the connection survived %d rapid resets", sent)
	}
	resp, err := s.client(true).Get("https://" + s.addr + "/api/v1/pods")
	if err != nil {
		t.Fatalf("request after the rapid reset: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("request after the rapid reset: %s", resp.Status)
	}
}

// TestIdleConnections: connections that send nothing after the TLS
// handshake and the HTTP/2 preface cannot run the agent out of memory nor
// keep another pod from being served. Given the default limits, when one
// source opens 8,000 such connections, then only its share is kept (the
// rest are closed as accepted), the heap and stacks grow by a few MiB, and
// another pod's requests are answered.
func TestIdleConnections(t *testing.T) {
	const attempts = 8000
	upstream := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"kind":"PodList","apiVersion":"v1","items":[]}`)
	}))
	defer upstream.Close()
	limits := DefaultLimits()
	// The bounds alone, before the first-request timeout closes anything.
	limits.FirstRequestTimeout = 5 * time.Minute
	a := newTestAgentWithLimits(t, upstream, limits)
	s := startTestServer(t, a.handler, limits)
	victim := s.clientFrom("127.0.0.2", true)
	get := func() int {
		resp, err := victim.Get("https://" + s.addr + "/api/v1/namespaces/a/pods")
		if err != nil {
			t.Fatalf("another pod's request: %v", err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	get()
	memBefore, goroutinesBefore := memInUse(), runtime.NumGoroutine()

	// Each connection completes its handshake and the HTTP/2 preface, then
	// holds only its TCP socket: the client keeps nothing else, so that the
	// heap measures the agent.
	var (
		mu      sync.Mutex
		open    []net.Conn
		refused int
	)
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	cfg := &tls.Config{RootCAs: s.cert.pool, ServerName: "127.0.0.1", NextProtos: []string{"h2"}}
	work := make(chan struct{})
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range work {
				raw, err := net.DialTimeout("tcp", s.addr, 5*time.Second)
				if err != nil {
					t.Errorf("dialling: %v", err)
					return
				}
				_ = raw.SetDeadline(time.Now().Add(5 * time.Second))
				c := tls.Client(raw, cfg)
				err = c.Handshake()
				if err == nil {
					_, err = io.WriteString(c, http2.ClientPreface)
				}
				if err == nil {
					err = http2.NewFramer(c, nil).WriteSettings()
				}
				if err == nil {
					// A refused connection may complete its handshake
					// before the close reaches it; a byte read tells.
					_ = raw.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
					var b [1]byte
					if _, rerr := c.Read(b[:]); rerr != nil && !errors.Is(rerr, os.ErrDeadlineExceeded) {
						err = rerr
					}
				}
				mu.Lock()
				if err != nil {
					raw.Close()
					refused++
				} else {
					_ = raw.SetDeadline(time.Time{})
					open = append(open, raw)
				}
				mu.Unlock()
			}
		})
	}
	for range attempts {
		work <- struct{}{}
	}
	close(work)
	wg.Wait()
	grown := memInUse() - memBefore
	goroutines := runtime.NumGoroutine() - goroutinesBefore

	code := get()
	perConn := 0.0
	if len(open) > 0 {
		perConn = float64(grown) / float64(len(open)) / 1024
	}
	t.Logf("one source tried %d idle HTTP/2 connections: %d kept, %d closed as accepted (%v by reason per-source); heap and stacks +%.1f MiB (%.1f KiB per kept connection), +%d goroutines; another pod's request: %d",
		attempts, len(open), refused, testutil.ToFloat64(s.conns.closedConns.WithLabelValues("per-source")), float64(grown)/(1<<20), perConn, goroutines, code)
	if len(open) > DefaultMaxConnectionsPerSource {
		t.Errorf("one source holds %d connections, bound is %d", len(open), DefaultMaxConnectionsPerSource)
	}
	// A quarter of the DaemonSet's 256 MiB memory limit.
	if grown > 64<<20 {
		t.Errorf("%d idle connections of one source grew the heap and stacks by %.1f MiB, want under 64 MiB", len(open), float64(grown)/(1<<20))
	}
	if code != http.StatusOK {
		t.Errorf("another pod's request while one source holds %d connections: %d, want 200", len(open), code)
	}
	// Closed connections give their slots back.
	for _, c := range open {
		c.Close()
	}
	open = nil
	waitFor(t, func() bool { return s.limiter.pool.Usage().Held <= 1 }, "the closed connections' slots")
}

// TestConnectionLimits: connections are shared among sources, and a
// connection without a request is closed at the first-request timeout.
func TestConnectionLimits(t *testing.T) {
	const timeout = 2 * time.Second
	s := startTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
	}), Limits{MaxConnections: 4, MaxConnectionsPerSource: 3, GuaranteedConnectionsPerSource: 1, FirstRequestTimeout: timeout})
	// connect completes a handshake from src and reports whether the
	// connection then stays open for a moment.
	connect := func(src string) (net.Conn, bool) {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		c, err := tls.DialWithDialer(d, "tcp", s.addr, &tls.Config{RootCAs: s.cert.pool, NextProtos: []string{"http/1.1"}})
		if err != nil {
			return nil, false
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		var b [1]byte
		if _, err := c.Read(b[:]); !errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, false
		}
		return c, true
	}

	// Given two sources at their bound of 3, which uses up the shared
	// pool of 4 beyond their guaranteed connection each, when a third
	// source connects, then its first connection is kept and its second
	// closed.
	for _, src := range []string{"127.0.0.1", "127.0.0.2"} {
		for i := range 3 {
			if _, ok := connect(src); !ok {
				t.Fatalf("connection %d of %s within its bound was closed", i+1, src)
			}
		}
		if _, ok := connect(src); ok {
			t.Errorf("a fourth connection of %s was kept, bound is 3", src)
		}
	}
	if _, ok := connect("127.0.0.3"); !ok {
		t.Errorf("another source's guaranteed connection was closed")
	}
	if _, ok := connect("127.0.0.3"); ok {
		t.Errorf("another source's second connection was kept with the shared pool used up")
	}
	// The counter moves just after the refused connection is closed, so
	// a client can see the close first: wait for it.
	for reason, want := range map[string]float64{"per-source": 2, "total": 1} {
		waitFor(t, func() bool { return testutil.ToFloat64(s.conns.closedConns.WithLabelValues(reason)) >= want },
			fmt.Sprintf("%v connections closed with reason %s", want, reason))
		if got := testutil.ToFloat64(s.conns.closedConns.WithLabelValues(reason)); got != want {
			t.Errorf("connections closed with reason %s: %v, want %v", reason, got, want)
		}
	}

	// When the first-request timeout passes, then the connections that
	// sent no request are closed and their slots given back; one that did
	// is kept.
	c := s.clientFrom("127.0.0.4", false)
	resp, err := c.Get("https://" + s.addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	waitFor(t, func() bool { return s.limiter.pool.Usage().Held == 1 }, "the connections without a request to close")
	if got := testutil.ToFloat64(s.conns.closedConns.WithLabelValues("first-request-timeout")); got != 7 {
		t.Errorf("connections closed at the first-request timeout: %v, want 7", got)
	}
	var reused bool
	req, _ := http.NewRequest(http.MethodGet, "https://"+s.addr+"/", nil)
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}))
	if resp, err = c.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if !reused {
		t.Errorf("a connection that sent a request was closed at the first-request timeout")
	}
}

// TestMaxInFlight checks the in-flight bounds: over the bound a short
// request gets 429 with Retry-After and is counted, while watches are not
// counted against it.
func TestMaxInFlight(t *testing.T) {
	release := make(chan struct{})
	var arrived sync.WaitGroup
	upstream := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("watch") == "true" {
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			return
		}
		arrived.Done()
		<-release
		w.WriteHeader(http.StatusOK)
	}))
	defer upstream.Close()
	a := newTestAgentWithLimits(t, upstream, Limits{MaxRequestsInFlight: 2, MaxMutatingRequestsInFlight: 1, GuaranteedRequestsInFlightPerSource: -1})
	front := httptest.NewServer(a.handler)
	defer front.Close()

	// Given two lists and one create held by a slow upstream...
	arrived.Add(3)
	results := make(chan int, 3)
	for _, req := range []struct{ method, path string }{
		{http.MethodGet, "/api/v1/namespaces/a/pods"},
		{http.MethodGet, "/api/v1/namespaces/b/pods"},
		{http.MethodPost, "/api/v1/namespaces/a/configmaps"},
	} {
		go func() {
			r, _ := http.NewRequest(req.method, front.URL+req.path, nil)
			resp, err := http.DefaultClient.Do(r)
			if err != nil {
				results <- 0
				return
			}
			resp.Body.Close()
			results <- resp.StatusCode
		}()
	}
	arrived.Wait()

	// ...when a third list and a second create arrive, then both get 429
	// with Retry-After.
	for _, req := range []struct{ method, path, kind string }{
		{http.MethodGet, "/api/v1/namespaces/c/pods", "readOnly"},
		{http.MethodPost, "/api/v1/namespaces/b/configmaps", "mutating"},
	} {
		r, _ := http.NewRequest(req.method, front.URL+req.path, nil)
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "1" {
			t.Errorf("%s %s over the bound: %d Retry-After=%q, want 429 with Retry-After 1", req.method, req.path, resp.StatusCode, resp.Header.Get("Retry-After"))
		}
		if got := testutil.ToFloat64(a.metrics.rejected.WithLabelValues("forward", req.kind, "total")); got != 1 {
			t.Errorf("rejected{kind=%s} = %v, want 1", req.kind, got)
		}
	}

	// ...and a watch is still served.
	resp, err := http.Get(front.URL + "/api/v1/namespaces/a/pods?watch=true")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("watch while the bound is reached: %d, want 200", resp.StatusCode)
	}

	close(release)
	for range 3 {
		if code := <-results; code != http.StatusOK {
			t.Errorf("held request: %d, want 200", code)
		}
	}
}

// TestNeverReadAnswers: a source that never reads its answers cannot make
// another pod's request get 429, and each such answer is ended at the
// request timeout, which frees its slot. Given the default limits, when one
// source sends the node's whole budget of reads whose answers it never
// reads, over HTTP/2 connections that grant no flow-control window, then
// another pod's requests are all answered; the answers that source holds
// are reset at the request timeout, and so are those of a connection that
// does not read at all.
func TestNeverReadAnswers(t *testing.T) {
	const timeout = 2 * time.Second
	answer := bytes.Repeat([]byte("x"), 1<<20)
	for _, tc := range []struct {
		name, path string
		// agent returns an agent with limits and its handler, which counts
		// the requests that reach the answer in served.
		agent func(t *testing.T, limits Limits, served *atomic.Int32) (*Server, http.Handler)
	}{{
		// GET /openapi/v2, which any ServiceAccount token may read, is
		// forwarded; its answer is larger than the upstream window.
		name: "forwarded",
		path: "/openapi/v2",
		agent: func(t *testing.T, limits Limits, served *atomic.Int32) (*Server, http.Handler) {
			upstream := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/openapi/v2" {
					served.Add(1)
					_, _ = w.Write(answer)
					return
				}
				_, _ = io.WriteString(w, `{"kind":"PodList","apiVersion":"v1","items":[]}`)
			}))
			upstream.EnableHTTP2 = true
			upstream.StartTLS()
			t.Cleanup(upstream.Close)
			a := newTestAgentWithLimits(t, upstream, limits)
			return a, a.handler
		},
	}, {
		// A list a tenant with view may read, answered from the cache
		// (here a stand-in writing shared bytes, as the cache writes its
		// encodings).
		name: "cached",
		path: "/api/v1/namespaces/a/configmaps",
		agent: func(t *testing.T, limits Limits, served *atomic.Int32) (*Server, http.Handler) {
			unused := httptest.NewTLSServer(http.NotFoundHandler())
			t.Cleanup(unused.Close)
			a := newTestAgentWithLimits(t, unused, limits)
			return a, a.front(a.cacheHit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/api/v1/namespaces/a/configmaps" {
					served.Add(1)
					_, _ = w.Write(answer)
					return
				}
				_, _ = io.WriteString(w, `{"kind":"PodList","apiVersion":"v1","items":[]}`)
			})))
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			limits := DefaultLimits()
			limits.RequestTimeout = timeout
			var served atomic.Int32
			a, h := tc.agent(t, limits, &served)
			s := startTestServer(t, h, limits)
			victim := s.clientFrom("127.0.0.2", true)
			get := func(c *http.Client) int {
				resp, err := c.Get("https://" + s.addr + "/api/v1/namespaces/a/pods")
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return resp.StatusCode
			}
			get(victim)
			before := memInUse()

			// One source sends the node's whole budget, 100 streams a
			// connection, each connection once the previous one's are all
			// answered.
			token := [][2]string{{"authorization", "Bearer any-service-account"}}
			var attack []*h2test.Stalled
			answered := func(c *h2test.Stalled) int {
				byStatus, _, _ := c.Answers()
				n := 0
				for _, k := range byStatus {
					n += k
				}
				return n
			}
			for range DefaultMaxRequestsInFlight / 100 {
				c, err := h2test.Stall(s.dial(t, "h2"), s.addr, tc.path, token, 100, true)
				if err != nil {
					t.Fatal(err)
				}
				attack = append(attack, c)
				waitFor(t, func() bool { return answered(c) == 100 }, "answers to 100 never-read requests")
			}
			admitted, refused := 0, 0
			for _, c := range attack {
				byStatus, _, _ := c.Answers()
				admitted += byStatus[http.StatusOK]
				refused += byStatus[http.StatusTooManyRequests]
			}
			grown := memInUse() - before

			codes := map[int]int{}
			for range 20 {
				codes[get(victim)]++
			}
			t.Logf("one source holds %d never-read answers of GET %s (%d refused with 429), heap and stacks +%.1f MiB; another pod's 20 requests: %v",
				admitted, tc.path, refused, float64(grown)/(1<<20), codes)
			if codes[http.StatusOK] != 20 {
				t.Errorf("another pod's requests while one source holds %d never-read answers: %v, want 20 of 200", admitted, codes)
			}

			// At the request timeout every held answer is reset, and its
			// slot freed.
			timeouts := func() int { return int(testutil.ToFloat64(a.metrics.requestTimeouts)) }
			inFlight := func() int {
				return int(testutil.ToFloat64(a.metrics.inFlight.WithLabelValues(handlerOf(tc.name), "readOnly")))
			}
			waitFor(t, func() bool { return inFlight() == 0 }, "the never-read answers to end at the request timeout")
			if n := timeouts(); n != admitted {
				t.Errorf("%d answers ended at the request timeout, want the %d held", n, admitted)
			}
			waitFor(t, func() bool {
				for _, c := range attack {
					if byStatus, reset, _ := c.Answers(); reset != byStatus[http.StatusOK] {
						return false
					}
				}
				return true
			}, "the held answers' streams to be reset")
			if code := get(s.client(true)); code != http.StatusOK {
				t.Errorf("the source's request after its answers were ended: %d, want 200", code)
			}

			// A connection that does not read at all stalls the server's
			// writes in TCP; its answers end at the request timeout all the
			// same (the few that fit in the socket buffers end before).
			from := served.Load()
			start := time.Now()
			if _, err := h2test.Stall(s.dialFrom(t, "127.0.0.3", "h2"), s.addr, tc.path, token, 100, false); err != nil {
				t.Fatal(err)
			}
			waitFor(t, func() bool { return served.Load()-from == int32(DefaultMaxRequestsInFlightPerSource) }, "the unread connection's requests answered")
			waitFor(t, func() bool { return inFlight() == 0 }, "the answers of a connection that does not read to end")
			t.Logf("a connection that reads nothing had its %d answers ended within %s (request timeout %s)",
				DefaultMaxRequestsInFlightPerSource, time.Since(start).Round(100*time.Millisecond), timeout)
		})
	}
}

// TestRequestTimeoutSparesWatches: the request timeout does not end a
// watch. Given a request timeout of 500 ms, when an HTTP/1.1 connection
// that served a list (with a write deadline) then carries a watch, then the
// watch streams on past the timeout.
func TestRequestTimeoutSparesWatches(t *testing.T) {
	const timeout = 500 * time.Millisecond
	upstream := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("watch") != "true" {
			_, _ = io.WriteString(w, `{"kind":"PodList","apiVersion":"v1","items":[]}`)
			return
		}
		for i := range 10 {
			if _, err := fmt.Fprintf(w, `{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"%d"}}}`+"\n", i); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			time.Sleep(timeout / 4)
		}
	}))
	defer upstream.Close()
	a := newTestAgentWithLimits(t, upstream, Limits{RequestTimeout: timeout})
	s := startTestServer(t, a.handler, Limits{})
	c := s.client(false)
	c.Transport.(*http.Transport).MaxConnsPerHost = 1
	resp, err := c.Get("https://" + s.addr + "/api/v1/namespaces/a/pods")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	start := time.Now()
	resp, err = c.Get("https://" + s.addr + "/api/v1/namespaces/a/pods?watch=true")
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if n := bytes.Count(b, []byte("\n")); err != nil || n != 10 {
		t.Errorf("a watch on a connection that served a list: %d events in %s, %v; want all 10 over %s", n, time.Since(start).Round(time.Millisecond), err, 10*timeout/4)
	}
}

// TestWatchBodies: the body of a watch is neither held nor forwarded, as
// kube-apiserver never reads it. Given the default limits, when one source
// opens 250 watches over HTTP/2, each with a 256 KiB body, then the heap
// and stacks grow by less than a fifth of the bodies (12.5 MiB) more than
// for 250 watches without bodies, once the client has sent them all, whether the watches are answered from the cache or forwarded
// (to an upstream that never reads the body either, as kube-apiserver);
// the watches are served.
func TestWatchBodies(t *testing.T) {
	const watches = 250
	body := bytes.Repeat([]byte("x"), DefaultHTTP2MaxStreamBuffer)
	// watch streams one event, then holds the watch open until its
	// client leaves, without reading the body; it counts the watches that
	// reach it with a body.
	var withBodies atomic.Int32
	watch := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength != 0 || r.Header.Get("Content-Length") != "" {
			withBodies.Add(1)
		}
		_, _ = io.WriteString(w, `{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"1"}}}`+"\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	for _, tc := range []struct {
		name  string
		agent func(t *testing.T, limits Limits) (*Server, http.Handler)
	}{{
		name: "forwarded",
		agent: func(t *testing.T, limits Limits) (*Server, http.Handler) {
			upstream := httptest.NewUnstartedServer(watch)
			upstream.EnableHTTP2 = true
			upstream.StartTLS()
			t.Cleanup(upstream.Close)
			a := newTestAgentWithLimits(t, upstream, limits)
			return a, a.handler
		},
	}, {
		name: "cached",
		agent: func(t *testing.T, limits Limits) (*Server, http.Handler) {
			unused := httptest.NewTLSServer(http.NotFoundHandler())
			t.Cleanup(unused.Close)
			a := newTestAgentWithLimits(t, unused, limits)
			return a, a.front(a.cacheHit(watch))
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			limits := DefaultLimits()
			a, h := tc.agent(t, limits)
			s := startTestServer(t, h, limits)
			c := s.client(true)
			open := func(withBody bool) (grown int64) {
				open := func() int {
					return int(testutil.ToFloat64(a.metrics.inFlight.WithLabelValues("long-running", "long-running")))
				}
				waitFor(t, func() bool { return open() == 0 }, "the previous watches to end")
				before := memInUse()
				var resps []*http.Response
				var sent atomic.Int32
				for range watches {
					var rd io.Reader
					if withBody {
						rd = &eofCounter{r: bytes.NewReader(body), n: &sent}
					}
					req, _ := http.NewRequest(http.MethodGet, "https://"+s.addr+"/api/v1/namespaces/a/pods?watch=true", rd)
					if withBody {
						req.ContentLength = int64(len(body))
					}
					resp, err := c.Do(req)
					if err != nil {
						t.Fatal(err)
					}
					resps = append(resps, resp)
					if resp.StatusCode != http.StatusOK {
						t.Fatalf("a watch with a body: %d, want 200", resp.StatusCode)
					}
				}
				waitFor(t, func() bool { return open() == watches }, "the watches to be open")
				if withBody {
					// The client's transport holds a frame buffer for each
					// body it is still sending: measured before the bodies
					// are all sent, the client's memory would count as the
					// agent's. The windows fit every body, so a body the
					// agent held would be sent too, and measured.
					waitFor(t, func() bool { return sent.Load() == watches }, "the watches' bodies to be sent")
				}
				// Until what the bodies leave behind has arrived.
				time.Sleep(time.Second)
				grown = memInUse() - before
				for _, resp := range resps {
					line, err := bufio.NewReader(resp.Body).ReadString('\n')
					if err != nil || !strings.Contains(line, "BOOKMARK") {
						t.Errorf("a watch's first event: %q, %v", line, err)
					}
					resp.Body.Close()
				}
				return grown
			}
			without := open(false)
			with := open(true)
			t.Logf("%d watches from one source: heap and stacks +%.1f MiB without bodies, +%.1f MiB with %d KiB bodies: the bodies add %.1f MiB",
				watches, float64(without)/(1<<20), float64(with)/(1<<20), len(body)>>10, float64(with-without)/(1<<20))
			// Held, the bodies would add 62.5 MiB. The client shares the
			// process: its streams that sent a body keep some state
			// (1-3.5 MiB for the 250 here), and a busy machine's heap
			// moves by as much again between the two measurements.
			if limit := int64(watches) * int64(len(body)) / 5; with-without > limit {
				t.Errorf("the bodies of %d watches add %.1f MiB, want under %.1f MiB", watches, float64(with-without)/(1<<20), float64(limit)/(1<<20))
			}
			if n := withBodies.Swap(0); n != 0 {
				t.Errorf("%d watches reached the cache or kube-apiserver with their body", n)
			}
		})
	}
}

// TestBodyIgnored: the requests whose body kube-apiserver never reads.
func TestBodyIgnored(t *testing.T) {
	for _, tc := range []struct {
		method, path string
		want         bool
	}{
		{http.MethodGet, "/api/v1/namespaces/a/pods?watch=true", true},
		{http.MethodGet, "/api/v1/watch/namespaces/a/pods", true},
		{http.MethodGet, "/apis/apps/v1/deployments?watch=1&resourceVersion=5", true},
		{http.MethodGet, "/api/v1/namespaces/a/pods/p/log?follow=true", true},
		{http.MethodGet, "/api/v1/namespaces/a/pods", false},
		{http.MethodPost, "/api/v1/namespaces/a/configmaps", false},
		// A proxied request's body goes to its target.
		{http.MethodGet, "/api/v1/namespaces/a/pods/p/proxy/x", false},
		{http.MethodPost, "/api/v1/namespaces/a/pods/p/exec?command=sh", false},
	} {
		r := httptest.NewRequest(tc.method, tc.path, nil)
		if info, err := apihttp.RequestInfoFactory.NewRequestInfo(r); err == nil {
			r = r.WithContext(request.WithRequestInfo(r.Context(), info))
		}
		if got := bodyIgnored(r); got != tc.want {
			t.Errorf("%s %s: body ignored %v, want %v", tc.method, tc.path, got, tc.want)
		}
	}
}

// handlerOf is the handler label of TestNeverReadAnswers' case name.
func handlerOf(name string) string {
	if name == "cached" {
		return "cache"
	}
	return "forward"
}

// eofCounter reads r and counts, in n, its reader once it reaches the end.
type eofCounter struct {
	r    io.Reader
	n    *atomic.Int32
	done bool
}

func (e *eofCounter) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err == io.EOF && !e.done {
		e.done = true
		e.n.Add(1)
	}
	return n, err
}

// memInUse returns the live heap after a collection plus the goroutine
// stacks: what connections and requests held open cost. (Two collections:
// the first only moves what sync.Pools hold to their victim caches.)
func memInUse() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc + ms.StackInuse)
}

// newTestAgentWithLimits is newTestAgent with limits set.
func newTestAgentWithLimits(t *testing.T, upstream *httptest.Server, limits Limits) *Server {
	t.Helper()
	return newTestAgentWithLimitsAndBodies(t, upstream, limits, 0)
}

// newTestAgentWithLimitsAndBodies is newTestAgentWithLimits whose upstream
// set buffers up to buffered bytes of request bodies for a retry.
func newTestAgentWithLimitsAndBodies(t *testing.T, upstream *httptest.Server, limits Limits, buffered int) *Server {
	t.Helper()
	a := newTestAgentWithUpstreams(t, newTestUpstream(upstream, buffered))
	a.limits = limits
	// As upstream.New sets it; before the transport's first use.
	a.up.Transport().HTTP2 = &http.HTTP2Config{MaxReceiveBufferPerStream: limits.WithDefaults().HTTP2MaxUpstreamStreamBuffer}
	a.handler = a.buildHandler()
	return a
}

// TestLimitsValidate checks the limits' flag validation.
func TestLimitsValidate(t *testing.T) {
	for _, tc := range []struct {
		mutate func(*Limits)
		want   string
	}{
		{func(*Limits) {}, ""},
		{func(l *Limits) { l.ReadHeaderTimeout = -time.Second }, "--read-header-timeout"},
		{func(l *Limits) { l.HTTP2MaxFrameSize = 1000 }, "--http2-max-frame-size"},
		{func(l *Limits) { l.MaxRequestsInFlight = -1 }, "--max-requests-inflight"},
		{func(l *Limits) { l.MaxMutatingRequestsInFlight = -1 }, "--max-mutating-requests-inflight"},
		{func(l *Limits) { l.RequestTimeout = -time.Second }, "--request-timeout"},
		{func(l *Limits) { l.FirstRequestTimeout = -time.Second }, "--first-request-timeout"},
		{func(l *Limits) { l.HTTP2MaxUpstreamStreamBuffer = -1 }, "--http2-max-upstream-stream-buffer"},
	} {
		l := DefaultLimits()
		tc.mutate(&l)
		err := l.Validate()
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("Validate() = %v, want error containing %q", err, tc.want)
		}
	}
}

// TestLongRunningLimit: long-running requests are bounded per source and,
// past a source's guaranteed share, by the shared pool, with 429 and
// Retry-After; short requests are not counted, and slots come back when a
// watch ends.
func TestLongRunningLimit(t *testing.T) {
	release := make(chan struct{})
	upstream := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		if r.URL.Query().Get("watch") == "true" {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
	}))
	defer upstream.Close()
	a := newTestAgentWithLimits(t, upstream, Limits{MaxLongRunningRequests: 1, MaxLongRunningRequestsPerSource: 2, GuaranteedLongRunningRequestsPerSource: 1})
	handler := a.handler
	withSource := func(src string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r.RemoteAddr = src
			handler.ServeHTTP(w, r)
		})
	}
	fronts := map[string]*httptest.Server{}
	for _, src := range []string{"10.0.0.1:1", "10.0.0.2:1"} {
		fronts[src] = httptest.NewServer(withSource(src))
		defer fronts[src].Close()
	}
	var open []*http.Response
	watch := func(src string) int {
		resp, err := http.Get(fronts[src].URL + "/api/v1/namespaces/a/pods?watch=true")
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode == http.StatusOK {
			open = append(open, resp)
		} else {
			resp.Body.Close()
		}
		return resp.StatusCode
	}
	for i := range 2 {
		if code := watch("10.0.0.1:1"); code != http.StatusOK {
			t.Fatalf("watch %d of a source within its bound: %d", i, code)
		}
	}
	if code := watch("10.0.0.1:1"); code != http.StatusTooManyRequests {
		t.Errorf("third watch of one source: %d, want 429", code)
	}
	if code := watch("10.0.0.2:1"); code != http.StatusOK {
		t.Errorf("another source's watch: %d, want 200", code)
	}
	if code := watch("10.0.0.2:1"); code != http.StatusTooManyRequests {
		t.Errorf("a watch past the guaranteed share with the pool used up: %d, want 429", code)
	}
	resp, err := http.Get(fronts["10.0.0.1:1"].URL + "/api/v1/namespaces/a/pods")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("a list while long-running requests are at their bound: %d, want 200", resp.StatusCode)
	}
	for _, reason := range []string{"per-source", "total"} {
		if got := testutil.ToFloat64(a.metrics.rejected.WithLabelValues("long-running", "long-running", reason)); got != 1 {
			t.Errorf("rejected long-running requests counted with reason %s: %v, want 1", reason, got)
		}
	}
	close(release)
	for _, r := range open {
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	waitFor(t, func() bool { return watchStatus(fronts["10.0.0.1:1"].URL) == http.StatusOK }, "a slot after the watches ended")
}

// TestLongRunningFairShare: a few pods that each hold as many watches as
// one source may cannot make another pod's watch get 429. Given the default
// limits, when eight sources open watches until refused, then each of a
// hundred other pods still opens its five.
func TestLongRunningFairShare(t *testing.T) {
	a := &Server{limits: DefaultLimits(), metrics: newMetrics(prometheus.NewRegistry())}
	release := make(chan struct{})
	h := apihttp.WithRequestInfo(a.limitLongRunning(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(r.Context().Value(admittedTestKey{}).(chan struct{}))
		<-release
	})))
	var wg sync.WaitGroup
	defer func() { close(release); wg.Wait() }()
	// watch opens a watch from src and reports whether it was admitted;
	// an admitted one stays open until the test ends.
	watch := func(src string) (admitted bool, code int) {
		req := httptest.NewRequest(http.MethodGet, "/api/v1/namespaces/a/pods?watch=true", nil)
		req.RemoteAddr = src + ":40000"
		in := make(chan struct{})
		req = req.WithContext(context.WithValue(req.Context(), admittedTestKey{}, in))
		rec := httptest.NewRecorder()
		done := make(chan struct{})
		wg.Go(func() { defer close(done); h.ServeHTTP(rec, req) })
		select {
		case <-in:
			return true, http.StatusOK
		case <-done:
			return false, rec.Code
		}
	}
	attackers := 0
	for i := range 8 {
		n := 0
		for {
			ok, code := watch(fmt.Sprintf("10.1.0.%d", i+1))
			if !ok {
				if code != http.StatusTooManyRequests {
					t.Fatalf("an attacker's watch refused with %d, want 429", code)
				}
				break
			}
			n++
		}
		attackers += n
	}
	victims, refused := 0, 0
	for p := range 100 {
		for range 5 {
			if ok, code := watch(fmt.Sprintf("10.2.0.%d", p+1)); ok {
				victims++
			} else {
				refused++
				if refused == 1 {
					t.Errorf("pod %d's watch while 8 sources hold %d: %d, want 200", p+1, attackers, code)
				}
			}
		}
	}
	t.Logf("8 sources hold %d watches (%d each at most); 100 other pods then opened %d of 500, %d refused",
		attackers, DefaultMaxLongRunningRequestsPerSource, victims, refused)
}

// admittedTestKey carries a channel a test handler closes once a request
// reached it.
type admittedTestKey struct{}

func watchStatus(base string) int {
	resp, err := http.Get(base + "/api/v1/namespaces/a/pods?watch=true")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestRequestBodyDeadline: a client that holds back the end of a request
// body has the request failed after RequestBodyTimeout, over HTTP/2 and
// HTTP/1.1; once a body has arrived, a slow answer is not cut by it.
func TestRequestBodyDeadline(t *testing.T) {
	const timeout = 300 * time.Millisecond
	upstream := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		if r.URL.Query().Get("slow") == "1" {
			time.Sleep(3 * timeout)
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer upstream.Close()
	for _, tc := range []struct {
		h2       bool
		buffered int
	}{{true, 0}, {false, 0}, {true, 8 << 20}, {false, 8 << 20}} {
		h2 := tc.h2
		a := newTestAgentWithLimitsAndBodies(t, upstream, Limits{RequestBodyTimeout: timeout}, tc.buffered)
		s := startTestServer(t, a.handler, Limits{})
		t.Run(fmt.Sprintf("h2=%v,buffer=%d", h2, tc.buffered), func(t *testing.T) {
			pr, pw := io.Pipe()
			defer pw.Close()
			req, _ := http.NewRequest(http.MethodPost, "https://"+s.addr+"/api/v1/namespaces/a/configmaps", pr)
			req.ContentLength = 1 << 20
			go func() { _, _ = pw.Write(make([]byte, 1000)) }() // and never the rest
			start := time.Now()
			resp, err := s.client(h2).Do(req)
			if err == nil {
				resp.Body.Close()
			}
			took := time.Since(start)
			if err == nil && resp.StatusCode != http.StatusGatewayTimeout {
				t.Errorf("a request whose body never ended: %d, want 504", resp.StatusCode)
			}
			if took > 5*time.Second {
				t.Errorf("the stalled body held its request for %v", took)
			}

			req, _ = http.NewRequest(http.MethodPost, "https://"+s.addr+"/api/v1/namespaces/a/configmaps?slow=1", strings.NewReader("{}"))
			resp, err = s.client(h2).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				t.Errorf("a write answered after %v: %d, want 201", 3*timeout, resp.StatusCode)
			}
		})
	}
}

// TestRequestBodyDeadlineShortRemainder: a body held back by only a few
// bytes is answered 504 at the deadline too; net/http reads what is left of
// a short body before it answers, so the deadline must still be in force
// then.
func TestRequestBodyDeadlineShortRemainder(t *testing.T) {
	upstream := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			// A truncated body is never created, as by kube-apiserver;
			// answering it would race the agent's own 504.
			panic(http.ErrAbortHandler)
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer upstream.Close()
	for _, buffered := range []int{0, 8 << 20} {
		a := newTestAgentWithLimitsAndBodies(t, upstream, Limits{RequestBodyTimeout: 300 * time.Millisecond}, buffered)
		s := startTestServer(t, a.handler, Limits{})
		conn := s.dial(t, "http/1.1")
		head := fmt.Sprintf("POST /api/v1/namespaces/a/configmaps HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", 1<<20)
		if _, err := conn.Write(append([]byte(head), make([]byte, 1<<20-100)...)); err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("buffer %d: no answer to a body held back by 100 bytes: %v", buffered, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusGatewayTimeout {
			t.Errorf("buffer %d: a body held back by 100 bytes: %d, want 504", buffered, resp.StatusCode)
		}
	}
}

// The limiter knows the connections it holds by client address and port
// (what the agent's shutdown keeps the conntrack flows of), from accept to
// close, and forgets the ones it refused or closed.
func TestConnLimiterHolds(t *testing.T) {
	s := startTestServer(t, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), Limits{})
	c := s.dial(t, "http/1.1")
	local := netip.MustParseAddrPort(c.LocalAddr().String())
	waitFor(t, func() bool { return s.limiter.holds(local) }, "the connection is held")
	if other := netip.AddrPortFrom(local.Addr(), local.Port()+1); s.limiter.holds(other) {
		t.Errorf("holds %s, which never connected", other)
	}
	c.Close()
	waitFor(t, func() bool { return !s.limiter.holds(local) }, "the closed connection is forgotten")
}
