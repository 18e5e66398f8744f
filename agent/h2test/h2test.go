// Package h2test writes raw HTTP/2 frames, for tests of how the agent's
// HTTP/2 server bounds abusive clients.
package h2test

import (
	"bytes"
	"io"
	"net"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// RapidReset opens HTTP/2 on c (the TLS connection must have negotiated
// h2) and writes up to n pairs of a HEADERS frame for a GET of path (with
// the extra header fields) and an RST_STREAM cancelling it, as the
// "rapid reset" attack (CVE-2023-44487) does. It returns how many pairs
// it wrote and how the server cut the connection: its GOAWAY error code,
// "connection closed" if it closed the connection before a GOAWAY could
// be read, or "" if it did neither within wait. err is set only if the
// connection preface could not be written.
func RapidReset(c net.Conn, authority, path string, extra [][2]string, n int, wait time.Duration) (sent int, goaway string, err error) {
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		return 0, "", err
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		return 0, "", err
	}
	done := make(chan string, 1)
	go func() {
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				done <- "connection closed"
				return
			}
			// SETTINGS are not acknowledged: a Framer must not be
			// written from two goroutines.
			if g, ok := f.(*http2.GoAwayFrame); ok {
				done <- g.ErrCode.String()
				return
			}
		}
	}()
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	fields := append([][2]string{{":method", "GET"}, {":scheme", "https"}, {":authority", authority}, {":path", path}}, extra...)
	for _, f := range fields {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	block := hb.Bytes()
	for i := range n {
		id := uint32(2*i + 1)
		if fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndStream: true, EndHeaders: true}) != nil ||
			fr.WriteRSTStream(id, http2.ErrCodeCancel) != nil {
			break
		}
		sent++
	}
	select {
	case goaway = <-done:
	case <-time.After(wait):
	}
	return sent, goaway, nil
}
