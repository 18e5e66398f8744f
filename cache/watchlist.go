package cache

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"
)

// Reasons a watch is forwarded.
const (
	reasonPlainWatch  = "plain-watch"
	reasonWatchObject = "watch-single-object"
)

// watchParams are the query parameters of a watch-list the cache answers.
var watchParams = map[string]bool{"labelSelector": true, "fieldSelector": true, "resourceVersion": true,
	"resourceVersionMatch": true, "timeoutSeconds": true, "allowWatchBookmarks": true,
	"sendInitialEvents": true, "watch": true, "timeout": true}

// classifyWatch decides whether the cache answers a watch: only a
// watch-list (sendInitialEvents=true, which kube-apiserver's validation
// ties to resourceVersionMatch=NotOlderThan and allowWatchBookmarks=true,
// or a legacy watch from "0" or unset, for which SetListOptionsDefaults
// turns it on) of a collection. Plain watches are forwarded: their events come from
// kube-apiserver anyway, and the cache would add nothing.
//
// The resourceVersion has the list meanings (api-concepts, watch-list):
// unset is a consistent start (the read-your-writes barrier applies), "0"
// any state, N a state not older than N. opts must have passed
// ValidateListOptions.
func (c *Cache) classifyWatch(p *plan, opts *metainternalversion.ListOptions) (*plan, string) {
	if opts.SendInitialEvents == nil || !*opts.SendInitialEvents {
		return nil, reasonPlainWatch
	}
	if p.name != "" {
		return nil, reasonWatchObject
	}
	if opts.TimeoutSeconds != nil {
		p.timeout = time.Duration(*opts.TimeoutSeconds) * time.Second
	}
	p.bookmarks = opts.AllowWatchBookmarks
	return p, ""
}

// serveWatchList answers a watch-list: ADDED events for the cached objects
// p selects at the cache's resourceVersion C, a BOOKMARK at C annotated
// k8s.io/initial-events-end, and then the events of an upstream watch
// from C, opened with the client's own request (and so its own
// credentials) through p.upstream. The stream ends when the client goes
// away, the request's context ends (the agent drains), the timeout
// passes, or the upstream watch ends; an upstream that refuses the watch
// ends the stream with an ERROR event carrying its Status.
func (c *Cache) serveWatchList(w http.ResponseWriter, r *http.Request, p *plan) {
	start := time.Now()
	res := p.res
	objs, rv := res.store.Snapshot(p.pred)
	ww, err := newWatchWriter(w, p.media)
	if err != nil {
		c.encodingFailed(w, r, res, err)
		return
	}
	// Encode every object before writing anything, so an encoding error is
	// still an HTTP error. The encodings are kept with the objects; each
	// event is framed from them only as it is written, so a client that
	// reads slowly holds the snapshot, not a copy of every event.
	for _, o := range objs {
		if err := c.prepareEvent(p, o); err != nil {
			c.encodingFailed(w, r, res, err)
			return
		}
	}
	bookmark, err := c.bookmarkObject(p, rv)
	if err != nil {
		c.encodingFailed(w, r, res, err)
		return
	}
	ww.start()
	for _, o := range objs {
		b, err := c.eventObject(p, o)
		if err != nil {
			return
		}
		if err := ww.event(watch.Added, b); err != nil {
			return
		}
	}
	if p.bookmarks {
		// As kube-apiserver's watch cache: the initial-events-end bookmark
		// only for clients that accept bookmarks. A legacy watch from "0"
		// or "" (sendInitialEvents defaulted to true) without them gets
		// the ADDED events alone.
		if err := ww.event(watch.Bookmark, bookmark); err != nil {
			return
		}
	}
	ww.flush()
	ww.out.stop()
	klog.FromContext(r.Context()).V(4).Info("Sent watch-list initial events from the cache", "resource", res.label, "objects", len(objs), "resourceVersion", rv)
	if p.upstream == nil {
		return
	}
	if p.timeout > 0 {
		left := p.timeout - time.Since(start)
		if left < time.Second {
			return
		}
		p.timeout = left
	}
	c.continueUpstream(ww, r, p, rv)
}

// prepareEvent encodes o as eventObject needs it, and keeps the encoding
// with o.
func (c *Cache) prepareEvent(p *plan, o *Object) error {
	enc := p.res.encoder
	var err error
	switch {
	case p.as == asMetadata:
		_, err = enc.metadataObject(p.media, o)
	case p.media == mediaProtobuf:
		_, err = enc.objectProtobuf(o)
	default:
		_, err = enc.objectJSON(o)
	}
	return err
}

// eventObject is o's embedded form in a watch event of p's encoding.
func (c *Cache) eventObject(p *plan, o *Object) ([]byte, error) {
	enc := p.res.encoder
	if p.as == asMetadata {
		b, err := enc.metadataObject(p.media, o)
		if err != nil {
			return nil, err
		}
		return b.bytes(), nil
	}
	if p.media == mediaProtobuf {
		b, err := enc.object(mediaProtobuf, o)
		if err != nil {
			return nil, err
		}
		return b.bytes(), nil
	}
	return enc.objectJSON(o)
}

// bookmarkObject is the initial-events-end bookmark's object at rv, as
// kube-apiserver's watch cache makes it: an empty object of the resource's
// kind carrying only the resourceVersion and the annotation.
func (c *Cache) bookmarkObject(p *plan, rv uint64) ([]byte, error) {
	res := p.res
	var obj runtime.Object
	if res.builtin {
		o, err := scheme.Scheme.New(res.gvk)
		if err != nil {
			return nil, err
		}
		obj = o
	} else {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(res.gvk)
		obj = u
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil, err
	}
	m.SetResourceVersion(strconv.FormatUint(rv, 10))
	m.SetAnnotations(map[string]string{metav1.InitialEventsAnnotationKey: "true"})
	obj.GetObjectKind().SetGroupVersionKind(res.gvk)
	if p.as == asMetadata {
		pm, err := asPartialObjectMetadata(obj)
		if err != nil {
			return nil, err
		}
		obj = pm
	}
	return embed(p.media, obj, res.encoder)
}

// embed encodes obj as an object embedded in a watch event: JSON with kind
// and apiVersion, or kube-apiserver's protobuf envelope.
func embed(m mediaType, obj runtime.Object, enc *encoder) ([]byte, error) {
	if m == mediaProtobuf {
		raw, err := encodeProtobuf(obj)
		if err != nil {
			return nil, err
		}
		gvk := obj.GetObjectKind().GroupVersionKind()
		return envelope(gvk.GroupVersion().String(), gvk.Kind, &body{parts: [][]byte{raw}}).bytes(), nil
	}
	return enc.encodeJSON(obj)
}

// bytes returns the body as one slice.
func (b *body) bytes() []byte {
	if len(b.parts) == 1 {
		return b.parts[0]
	}
	out := make([]byte, 0, b.size())
	for _, p := range b.parts {
		out = append(out, p...)
	}
	return out
}

// watchWriter writes watch events as kube-apiserver frames them, with
// apimachinery's stream serializer and framer for the media type: JSON
// objects one after another, or length-prefixed protobuf WatchEvents.
type watchWriter struct {
	w           http.ResponseWriter
	contentType string
	// buf gathers events between flushes; enc writes to it.
	buf *bufio.Writer
	enc streaming.Encoder
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

// deadlineWriter sets a write deadline before each write while timeout is
// set; it clears it when timeout is set to zero with stop.
type deadlineWriter struct {
	w       http.ResponseWriter
	timeout time.Duration
}

func (d *deadlineWriter) Write(b []byte) (int, error) {
	if d.timeout > 0 {
		// Not every ResponseWriter supports deadlines (a test recorder);
		// then writes simply have none.
		_ = http.NewResponseController(d.w).SetWriteDeadline(time.Now().Add(d.timeout))
	}
	return d.w.Write(b)
}

func (d *deadlineWriter) stop() {
	if d.timeout > 0 {
		d.timeout = 0
		_ = http.NewResponseController(d.w).SetWriteDeadline(time.Time{})
	}
}

func newWatchWriter(w http.ResponseWriter, m mediaType) (*watchWriter, error) {
	info, ok := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), m.contentType())
	if !ok || info.StreamSerializer == nil {
		return nil, fmt.Errorf("no stream serializer for %s", m.contentType())
	}
	ct := m.contentType()
	if m != mediaJSON {
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
	return ww.enc.Encode(&metav1.WatchEvent{Type: string(t), Object: runtime.RawExtension{Raw: object}})
}

// flush sends the buffered events on to the client.
func (ww *watchWriter) flush() {
	if ww.buf.Flush() == nil {
		_ = http.NewResponseController(ww.w).Flush()
	}
}

// maxUpstreamError bounds how much of a refused upstream watch's body is
// kept to turn into an ERROR event.
const maxUpstreamError = 1 << 20

// continueUpstream relays the events of an upstream watch from rv, made
// from the client's request: same path, headers (so the same credentials)
// and selectors; resourceVersion=rv, no initial events, bookmarks on, the
// negotiated media type. A 200 answer is relayed byte for byte: it is a
// stream of the same framing and encoding, and its ERROR events (410 Gone
// for a compacted rv) reach the client as kube-apiserver sent them. Any
// other answer is a Status, which ends the stream as an ERROR event.
func (c *Cache) continueUpstream(ww *watchWriter, r *http.Request, p *plan, rv uint64) {
	up := r.Clone(r.Context())
	q := up.URL.Query()
	q.Del("sendInitialEvents")
	q.Del("resourceVersionMatch")
	q.Set("resourceVersion", strconv.FormatUint(rv, 10))
	if p.bookmarks {
		q.Set("allowWatchBookmarks", "true")
	} else {
		q.Del("allowWatchBookmarks")
	}
	q.Set("watch", "true")
	if p.timeout > 0 {
		q.Set("timeoutSeconds", strconv.Itoa(int(p.timeout/time.Second)))
	}
	up.URL.RawQuery = q.Encode()
	up.RequestURI = ""
	accept := p.media.contentType()
	if p.as == asMetadata {
		accept += ";as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
	}
	up.Header.Set("Accept", accept)
	cw := &continuation{w: ww.w, header: http.Header{}, want: p.media.contentType()}
	p.upstream.ServeHTTP(cw, up)
	if cw.code == 0 || cw.relaying {
		return
	}
	status := upstreamStatus(cw, p.res.gvr.GroupResource())
	klog.FromContext(r.Context()).V(2).Info("Upstream refused a watch-list continuation", "resource", p.res.label, "code", status.Code, "reason", status.Reason)
	b, err := embed(p.media, status, p.res.encoder)
	if err != nil {
		return
	}
	_ = ww.event(watch.Error, b)
	ww.flush()
}

// upstreamStatus is the Status a refused continuation answered with, or
// one made from its code if the body is not a Status.
func upstreamStatus(cw *continuation, gr schema.GroupResource) *metav1.Status {
	var st metav1.Status
	switch {
	case cw.mismatch != "":
		st = apierrors.NewInternalError(errors.New(cw.mismatch)).ErrStatus
	default:
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(cw.buf.Bytes(), nil, nil)
		if s, ok := obj.(*metav1.Status); err == nil && ok {
			st = *s
		} else {
			st = apierrors.NewGenericServerResponse(cw.code, "watch", gr, "", cw.buf.String(), 0, false).ErrStatus
		}
	}
	st.SetGroupVersionKind(metav1.SchemeGroupVersion.WithKind("Status"))
	return &st
}

// continuation is the ResponseWriter the upstream watch is written to. A
// 200 stream of the expected media type goes straight through to the
// client (whose header is already sent); anything else is kept, to become
// an ERROR event.
type continuation struct {
	w        http.ResponseWriter
	header   http.Header
	want     string
	code     int
	relaying bool
	// mismatch says why a 200 answer is not relayed.
	mismatch string
	buf      bytes.Buffer
}

func (cw *continuation) Header() http.Header { return cw.header }

func (cw *continuation) WriteHeader(code int) {
	if cw.code != 0 || (code >= 100 && code < 200) {
		return
	}
	cw.code = code
	if code == http.StatusOK {
		mt, _, err := mime.ParseMediaType(cw.header.Get("Content-Type"))
		if err == nil && mt == cw.want {
			cw.relaying = true
			return
		}
		cw.mismatch = fmt.Sprintf("the upstream watch answered in %q, not %q", cw.header.Get("Content-Type"), cw.want)
	}
}

func (cw *continuation) Write(b []byte) (int, error) {
	if cw.code == 0 {
		cw.WriteHeader(http.StatusOK)
	}
	if cw.relaying {
		return cw.w.Write(b)
	}
	if cw.buf.Len() < maxUpstreamError {
		cw.buf.Write(b[:min(len(b), maxUpstreamError-cw.buf.Len())])
	}
	return len(b), nil
}

// Flush passes flushes of a relayed stream on, so events reach the client
// as they arrive.
func (cw *continuation) Flush() {
	if cw.relaying {
		_ = http.NewResponseController(cw.w).Flush()
	}
}

var (
	_ http.ResponseWriter = (*continuation)(nil)
	_ http.Flusher        = (*continuation)(nil)
)
