package interception

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// TestSelfCheck: the probe passes only when its handshake reaches the
// agent's own listener. Where something else answers the VIP (as when a
// socket-level load balancer sends the connection straight to
// kube-apiserver), it fails and says so.
func TestSelfCheck(t *testing.T) {
	other := httptest.NewTLSServer(http.NotFoundHandler()) // "kube-apiserver"
	defer other.Close()
	cert := other.TLS.Certificates[0]

	ic := &Interceptor{cfg: &Config{}, probes: NewProbes()}
	own := httptest.NewUnstartedServer(http.NotFoundHandler())
	own.TLS = &tls.Config{GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
		ic.probes.Observe(hello.ServerName)
		return &cert, nil
	}}
	own.StartTLS()
	defer own.Close()

	for _, tc := range []struct {
		name    string
		target  string
		wantErr string
	}{
		{"lands on the agent", own.Listener.Addr().String(), ""},
		{"answered by something else", other.Listener.Addr().String(), "answered by something else"},
		{"nothing listens", closedAddr(t), "connecting to"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ap := netip.MustParseAddrPort(tc.target)
			ic.cfg.ServicePort = ap.Port()
			err := ic.selfCheck(context.Background(), ap.Addr(), 2*time.Second)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("selfCheck = %v, want success", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("selfCheck = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
	// An ordinary client's handshake is not taken for a probe.
	ic.probes.Observe("kubernetes.default.svc")
	if len(ic.probes.seen) != 0 {
		t.Errorf("probes left registered: %v", ic.probes.seen)
	}
}

func closedAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}
