package rewriting

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"

	"golang.org/x/sync/semaphore"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/kube-apicache/kube-apicache/agent/internal/apihttp"
	"github.com/kube-apicache/kube-apicache/agent/rewrite"
)

// How an answer is carried to the caller.
type mode int

const (
	// modeBuffer holds the whole body and rewrites it at the end.
	modeBuffer mode = iota
	// modeStream rewrites a watch stream event by event.
	modeStream
	// modePass relays a body that carries no API names (logs, plain
	// text) as it comes.
	modePass
	// modeRefuse drops a body the rewriter cannot read (protobuf, CBOR)
	// and answers an error instead.
	modeRefuse
)

// response is the ResponseWriter next writes a selected caller's answer
// to. It restores the answer before the caller sees any of it.
type response struct {
	w     http.ResponseWriter
	req   *http.Request
	rw    *rewrite.Rewriter
	memos *memos
	max   int64
	// budget is the filter's bound on held bytes; held is what this
	// answer took of it.
	budget    *semaphore.Weighted
	budgetCap int64
	held      int64

	wroteHeader bool
	code        int
	mode        mode
	contentType string

	buf bytes.Buffer
	// overflow: the answer passed max; busy: the budget had no room for
	// it. Either way what follows is dropped and end answers an error.
	overflow, busy bool

	pw   *io.PipeWriter
	done chan struct{}

	// failed says the answer could not be rewritten; passed that it
	// carried no names.
	failed, passed bool

	// document, when set, rewrites a whole JSON answer with status 200
	// in place of the rewriter's objects (an OpenAPI document); such
	// answers are not memoised, and a redirect's body (which repeats its
	// Location) is dropped. headers, when set, rewrites the answer's
	// headers before they are sent.
	document     func([]byte) ([]byte, error)
	headers      func(http.Header)
	dropRedirect bool
}

func newResponse(w http.ResponseWriter, req *http.Request, rw *rewrite.Rewriter, m *memos, max int64, budget *semaphore.Weighted, budgetCap int64) *response {
	return &response{w: w, req: req, rw: rw, memos: m, max: max, budget: budget, budgetCap: budgetCap}
}

// take takes n bytes of the budget for this answer, if there is room.
func (s *response) take(n int64) bool {
	if !s.budget.TryAcquire(n) {
		return false
	}
	s.held += n
	return true
}

// release gives back what the answer took of the budget.
func (s *response) release() {
	if s.held > 0 {
		s.budget.Release(s.held)
		s.held = 0
	}
}

// Header implements http.ResponseWriter.
func (s *response) Header() http.Header { return s.w.Header() }

// WriteHeader implements http.ResponseWriter: it decides how the body
// is carried, by its Content-Type.
func (s *response) WriteHeader(code int) {
	if s.wroteHeader {
		return
	}
	if code >= 100 && code < 200 {
		s.w.WriteHeader(code)
		return
	}
	s.wroteHeader, s.code = true, code
	if s.headers != nil {
		s.headers(s.w.Header())
	}
	s.contentType = s.w.Header().Get("Content-Type")
	switch mediaKind(s.contentType) {
	case mediaJSON:
		s.mode = modeBuffer
		if code == http.StatusOK && apihttp.IsWatch(s.req) {
			s.mode = modeStream
		}
	case mediaYAML, mediaOther:
		// Other types are held and read as JSON, or refused: nothing
		// the rewriter cannot read reaches a selected caller.
		s.mode = modeBuffer
	case mediaBinary:
		s.mode = modeRefuse
	case mediaText:
		s.mode = modePass
	}
	if s.document != nil && code == http.StatusOK && s.mode == modePass {
		// kube-apiserver serves the index of the OpenAPI v3 documents
		// as text/plain; it is JSON all the same.
		s.mode = modeBuffer
	}
	if s.req.Method == http.MethodHead || code == http.StatusNoContent || code == http.StatusNotModified {
		// No body to rewrite, and none to count.
		s.mode = modePass
	}
	if s.document != nil && code >= 300 && code < 400 && s.w.Header().Get("Location") != "" {
		s.w.Header().Del("Content-Length")
		s.mode, s.dropRedirect = modePass, true
	}
	if code == http.StatusOK && apihttp.IsWatch(s.req) && s.mode != modePass {
		// A watch is never held whole: it may last an hour. One that is
		// not JSON ends at its first byte, which the pump cannot read.
		s.mode = modeStream
	}
	switch s.mode {
	case modePass:
		s.passed = true
		s.restoreWarnings()
		s.w.WriteHeader(code)
	case modeStream:
		s.restoreWarnings()
		s.w.Header().Del("Content-Length")
		s.w.WriteHeader(code)
		// The headers go now, as kube-apiserver sends them when a watch
		// starts: a client waits for them before the first event. From
		// here on only the pump touches w.
		_ = http.NewResponseController(s.w).Flush()
		pr, pw := io.Pipe()
		s.pw, s.done = pw, make(chan struct{})
		go s.pump(pr)
	}
}

// Write implements http.ResponseWriter.
func (s *response) Write(b []byte) (int, error) {
	if !s.wroteHeader {
		s.WriteHeader(http.StatusOK)
	}
	switch s.mode {
	case modePass:
		if s.dropRedirect {
			return len(b), nil
		}
		return s.w.Write(b)
	case modeStream:
		return s.pw.Write(b)
	case modeRefuse:
		return len(b), nil
	}
	if s.overflow || s.busy {
		return len(b), nil
	}
	if int64(s.buf.Len()+len(b)) > s.max {
		// The rest is dropped, not refused: the handler ends normally
		// and end answers the error.
		s.overflow = true
		s.buf = bytes.Buffer{}
		s.release()
		return len(b), nil
	}
	if !s.take(int64(len(b))) {
		s.busy = true
		s.buf = bytes.Buffer{}
		s.release()
		return len(b), nil
	}
	return s.buf.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's deadlines.
func (s *response) Unwrap() http.ResponseWriter { return s.w }

// Flush implements http.Flusher: held answers are not flushed; a watch
// stream is flushed event by event by its pump.
func (s *response) Flush() {
	if s.mode == modePass && s.wroteHeader {
		_ = http.NewResponseController(s.w).Flush()
	}
}

// end finishes the answer once next has returned: a held body is
// rewritten and written, a stream's pump ends.
func (s *response) end(completed bool) {
	defer s.release()
	if s.mode == modeStream && s.pw != nil {
		if completed {
			_ = s.pw.Close()
		} else {
			_ = s.pw.CloseWithError(http.ErrAbortHandler)
		}
		<-s.done
		return
	}
	if !completed || !s.wroteHeader || s.mode == modePass {
		return
	}
	if s.mode == modeRefuse {
		s.fail(fmt.Errorf("the answer came as %q, which rewrite profile %s cannot rewrite", s.contentType, s.rw.Name()))
		return
	}
	if s.overflow {
		s.fail(fmt.Errorf("the answer is larger than the %d bytes rewrite profile %s rewrites at once; ask for it in pages (limit and continue)", s.max, s.rw.Name()))
		return
	}
	need := int64(s.buf.Len()) * decodeFactor
	if need > s.budgetCap {
		s.fail(fmt.Errorf("the answer is larger than rewrite profile %s rewrites at once; ask for it in pages (limit and continue)", s.rw.Name()))
		return
	}
	if s.busy || !s.take(need-s.held) {
		s.busy = true
		s.failBusy()
		return
	}
	body, err := s.plainBody()
	if err == nil {
		body, err = s.restore(body)
	}
	if err != nil {
		s.fail(err)
		return
	}
	h := s.w.Header()
	h.Del("Content-Encoding")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	s.restoreWarnings()
	s.w.WriteHeader(s.code)
	_, _ = s.w.Write(body)
}

// plainBody is the held body, decompressed if it came compressed.
func (s *response) plainBody() ([]byte, error) {
	if !strings.EqualFold(s.w.Header().Get("Content-Encoding"), "gzip") {
		return s.buf.Bytes(), nil
	}
	zr, err := gzip.NewReader(&s.buf)
	if err != nil {
		return nil, fmt.Errorf("reading a compressed answer: %w", err)
	}
	b, err := io.ReadAll(io.LimitReader(zr, s.max+1))
	if err != nil {
		return nil, fmt.Errorf("reading a compressed answer: %w", err)
	}
	if int64(len(b)) > s.max {
		return nil, fmt.Errorf("the answer is larger than the %d bytes rewrite profile %s rewrites at once", s.max, s.rw.Name())
	}
	return b, nil
}

// restore rewrites a whole JSON or YAML body.
func (s *response) restore(body []byte) ([]byte, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return body, nil
	}
	if s.document != nil {
		switch {
		case s.code == http.StatusOK:
			return s.document(body)
		case s.code < 300:
			// A part of a document (206) cannot be rewritten alone.
			return nil, fmt.Errorf("the document came with status %d, which rewrite profile %s cannot rewrite", s.code, s.rw.Name())
		}
		// Other answers are Status errors, rewritten as objects.
	}
	if mediaKind(s.contentType) == mediaYAML {
		j, err := yaml.YAMLToJSON(body)
		if err != nil {
			return nil, fmt.Errorf("reading a YAML answer: %w", err)
		}
		out, err := s.rw.ObjectJSON(j)
		if err != nil {
			return nil, err
		}
		return yaml.JSONToYAML(out)
	}
	trailing := body[len(bytes.TrimRight(body, "\n")):]
	out, err := s.memos.objects.do(body, s.rw.ObjectJSON)
	if err != nil {
		return nil, err
	}
	// kube-apiserver ends a JSON answer with a newline; so does this.
	return append(out[:len(out):len(out)], trailing...), nil
}

// fail answers 500 in place of an answer that could not be rewritten:
// a selected caller never sees the cluster's names.
func (s *response) fail(err error) {
	s.failed = true
	klog.FromContext(s.req.Context()).V(2).Info("Could not rewrite an answer", "profile", s.rw.Name(), "path", s.req.URL.Path, "err", err)
	h := s.w.Header()
	for _, k := range []string{"Content-Length", "Content-Encoding", "Content-Type", "Warning"} {
		h.Del(k)
	}
	apihttp.WriteStatus(s.w, s.req, apierrors.NewInternalError(err))
}

// failBusy answers 503 in place of an answer the budget has no room to
// rewrite now.
func (s *response) failBusy() {
	h := s.w.Header()
	for _, k := range []string{"Content-Length", "Content-Encoding", "Content-Type", "Warning"} {
		h.Del(k)
	}
	h.Set("Retry-After", "1")
	apihttp.WriteStatus(s.w, s.req, apierrors.NewServiceUnavailable("the node's agent is rewriting too many answers at once; retry"))
}

// pump rewrites a watch stream: one JSON event at a time, each written
// and flushed as soon as it is complete.
func (s *response) pump(pr *io.PipeReader) {
	defer close(s.done)
	dec := json.NewDecoder(pr)
	rc := http.NewResponseController(s.w)
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			// The stream ended, or brought something that is no event:
			// either way nothing more is relayed, and next's writes fail.
			_ = pr.CloseWithError(errStreamEnded)
			return
		}
		out, err := s.memos.events.do(raw, s.rw.WatchEventJSON)
		if err != nil {
			s.failed = true
			_ = pr.CloseWithError(err)
			s.writeErrorEvent(err)
			return
		}
		if _, err := s.w.Write(append(out[:len(out):len(out)], '\n')); err != nil {
			_ = pr.CloseWithError(err)
			return
		}
		if err := rc.Flush(); err != nil {
			_ = pr.CloseWithError(err)
			return
		}
	}
}

var errStreamEnded = errors.New("the watch stream ended")

// writeErrorEvent ends a watch stream with an ERROR event, as
// kube-apiserver ends one it cannot go on with.
func (s *response) writeErrorEvent(err error) {
	st := apierrors.NewInternalError(fmt.Errorf("rewrite profile %s could not rewrite a watch event: %w", s.rw.Name(), err)).ErrStatus
	st.Kind, st.APIVersion = "Status", "v1"
	b, mErr := json.Marshal(map[string]any{"type": "ERROR", "object": st})
	if mErr != nil {
		return
	}
	_, _ = s.w.Write(append(b, '\n'))
	_ = http.NewResponseController(s.w).Flush()
}

// restoreWarnings rewrites the names in Warning headers (admission
// webhooks' and deprecation warnings name kinds and groups).
func (s *response) restoreWarnings() {
	h := s.w.Header()
	ws := h.Values("Warning")
	if len(ws) == 0 {
		return
	}
	h.Del("Warning")
	for _, w := range ws {
		h.Add("Warning", s.rw.Text(w))
	}
}

// outcome is the answer's outcome for the metrics.
func (s *response) outcome() string {
	switch {
	case s.failed, s.busy:
		return outcomeFailed
	case s.passed:
		return outcomePassed
	}
	return outcomeRewritten
}

// Media kinds of answers.
const (
	mediaOther = iota
	mediaJSON
	mediaYAML
	mediaBinary
	mediaText
)

// mediaKind sorts a Content-Type into what the filter does with it.
func mediaKind(ct string) int {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return mediaOther
	}
	switch {
	case strings.HasPrefix(mt, "text/"):
		return mediaText
	case mt == "application/json" || strings.HasSuffix(mt, "+json"):
		return mediaJSON
	case mt == "application/yaml":
		return mediaYAML
	case mt == "application/vnd.kubernetes.protobuf", mt == "application/cbor", strings.HasSuffix(mt, "+cbor"), strings.HasPrefix(mt, "application/vnd.kubernetes.protobuf"):
		return mediaBinary
	}
	return mediaOther
}
