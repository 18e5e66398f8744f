package cache

import (
	"bufio"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/kube-apicache/kube-apicache/cache/store"
)

// watchWriter writes watch events as kube-apiserver frames them, with
// apimachinery's stream serializer and framer for the media type: JSON
// objects one after another, or length-prefixed protobuf WatchEvents.
type watchWriter struct {
	w           http.ResponseWriter
	contentType string
	// buf gathers events between flushes; enc writes to it.
	buf *bufio.Writer
	enc streaming.Encoder
	// ev is the event being encoded, reused for every event.
	ev metav1.WatchEvent
	// out is what buf writes to: w, with a deadline on each write while
	// the initial events are sent.
	out *deadlineWriter
}

// initialEventsWriteTimeout bounds each write of a watch's initial events
// (at most bufio's 32 KiB): a client that reads none of them for this long
// has its stream ended, and with it what the stream holds (its snapshot of
// the cache). Events relayed afterwards come at the upstream's pace and
// have no deadline, as with kube-apiserver.
var initialEventsWriteTimeout = 30 * time.Second

// deadlineWriter bounds each write with a deadline of timeout, and clears
// the deadline once the write is done: the deadline is absolute, and left
// in place it would end a stream that merely has nothing to send for a
// while (an HTTP/2 stream is reset when its write deadline passes, even
// with no write pending).
type deadlineWriter struct {
	w       http.ResponseWriter
	timeout time.Duration
}

func (d *deadlineWriter) Write(b []byte) (int, error) {
	if d.timeout <= 0 {
		return d.w.Write(b)
	}
	// Not every ResponseWriter supports deadlines (a test recorder); then
	// writes simply have none.
	rc := http.NewResponseController(d.w)
	_ = rc.SetWriteDeadline(time.Now().Add(d.timeout))
	n, err := d.w.Write(b)
	if err == nil {
		err = rc.Flush()
	}
	_ = rc.SetWriteDeadline(time.Time{})
	return n, err
}

func newWatchWriter(w http.ResponseWriter, m store.MediaType) (*watchWriter, error) {
	info, ok := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), m.ContentType())
	if !ok || info.StreamSerializer == nil {
		return nil, fmt.Errorf("no stream serializer for %s", m.ContentType())
	}
	ct := m.ContentType()
	if m != store.MediaJSON {
		ct += ";stream=watch"
	}
	out := &deadlineWriter{w: w, timeout: initialEventsWriteTimeout}
	buf := bufio.NewWriterSize(out, 32<<10)
	return &watchWriter{w: w, contentType: ct, buf: buf, out: out,
		enc: streaming.NewEncoder(info.StreamSerializer.Framer.NewFrameWriter(buf), info.StreamSerializer.Serializer)}, nil
}

// start writes the response header and flushes it, as kube-apiserver does
// when a watch begins.
func (ww *watchWriter) start() {
	h := ww.w.Header()
	h.Set("Content-Type", ww.contentType)
	h.Set("Cache-Control", "no-cache, private")
	ww.w.WriteHeader(http.StatusOK)
	ww.flush()
}

// event writes one event whose object is already encoded; it reaches the
// client at the next flush.
func (ww *watchWriter) event(t watch.EventType, object []byte) error {
	ww.ev.Type, ww.ev.Object.Raw = string(t), object
	err := ww.enc.Encode(&ww.ev)
	// The encoder keeps nothing of the event; neither does ww.
	ww.ev.Object.Raw = nil
	return err
}

// flush sends the buffered events on to the client.
func (ww *watchWriter) flush() {
	if ww.buf.Flush() == nil {
		_ = http.NewResponseController(ww.w).Flush()
	}
}

// flushErr is flush that reports a failed write.
func (ww *watchWriter) flushErr() error {
	if err := ww.buf.Flush(); err != nil {
		return err
	}
	return http.NewResponseController(ww.w).Flush()
}

// statusOf is err's Status, as an ERROR event carries it.
func statusOf(err error) *metav1.Status {
	st := apierrors.NewInternalError(err).ErrStatus
	if s, ok := err.(apierrors.APIStatus); ok {
		st = s.Status()
	}
	st.SetGroupVersionKind(metav1.SchemeGroupVersion.WithKind("Status"))
	return &st
}

// isTimeout reports whether err is a write that passed its deadline.
func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &t) && t.Timeout())
}
