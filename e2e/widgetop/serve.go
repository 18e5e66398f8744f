package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// maxReviewBytes bounds the body of a review; the API server sends far
// less.
const maxReviewBytes = 8 << 20

// serve serves the webhooks on addr with the certificate in certFile and
// keyFile until ctx ends. It prints `SERVING <addr>` once it listens and
// `STOPPED` when it has shut down.
func serve(ctx context.Context, addr, certFile, keyFile string) error {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return fmt.Errorf("loading the serving certificate: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /validate", handleValidate)
	mux.HandleFunc("POST /convert", handleConvert)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok"))
	})
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", addr, err)
	}
	sayf("SERVING %s", ln.Addr())

	done := make(chan error, 1)
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		done <- srv.Shutdown(sctx)
	}()
	if err := srv.ServeTLS(ln, "", ""); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving on %s: %w", addr, err)
	}
	if err := <-done; err != nil {
		return fmt.Errorf("shutting down: %w", err)
	}
	say("STOPPED")
	return nil
}

// decodeReview reads a review's JSON body into v.
func decodeReview(w http.ResponseWriter, r *http.Request, v any) error {
	body := http.MaxBytesReader(w, r.Body, maxReviewBytes)
	if err := json.NewDecoder(body).Decode(v); err != nil {
		return fmt.Errorf("decoding the review: %w", err)
	}
	return nil
}

// writeReview answers a review with v as JSON.
func writeReview(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, fmt.Sprintf("encoding the review: %v", err), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}
