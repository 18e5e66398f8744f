package rewriting

import (
	"fmt"
	"net/http"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-apicache/kube-apicache/agent/internal/apihttp"
	"github.com/kube-apicache/kube-apicache/agent/rewrite"
)

// OpenAPI v3 for selected callers. The index and a renamed group's
// documents are rewritten (package rewrite says what). Clients keep them
// (client-go's disk cache, keyed by URL and revalidated with the ETag;
// the documents' URLs carry a hash and are cached as immutable), so the
// answers a profile rewrote carry the profile's fingerprint in their
// validators: the documents' hash in the index and in redirects, and
// every ETag (aggregated discovery's too). A validator without it (from
// kube-apiserver directly, while the agent was not on the path, or under
// another profile) never revalidates a rewritten answer, and the
// reverse.

// openAPIV3Path says whether path is under /openapi/v3: the index of the
// OpenAPI v3 documents and the document of each group version.
func openAPIV3Path(path string) bool {
	rest, ok := strings.CutPrefix(path, "/openapi/v3")
	return ok && (rest == "" || rest[0] == '/')
}

// serveOpenAPIV3 serves a selected caller's request for the index of
// OpenAPI v3 documents or a renamed group's document: the document is
// asked for under the group's other name and answered in JSON,
// rewritten. Documents of other groups carry none of the profile's
// names and go as they are.
func (f *Filter) serveOpenAPIV3(w http.ResponseWriter, r *http.Request, rw *rewrite.Rewriter, next http.Handler) {
	path, what := rw.OpenAPIV3Path(r.URL.Path)
	if what == rewrite.OpenAPIV3None {
		next.ServeHTTP(w, r)
		return
	}
	fp := rw.Fingerprint()
	out := r.Clone(r.Context())
	out.URL.Path, out.URL.RawPath = path, ""
	document := rw.OpenAPIV3DocumentJSON
	if what == rewrite.OpenAPIV3Index {
		// kube-apiserver answers the index in JSON whatever is asked.
		out.Header.Set("Accept", "application/json")
		document = func(b []byte) ([]byte, error) { return tagIndex(b, rw) }
	} else {
		accept, ok := rewrite.AcceptJSON(r.Header.Get("Accept"))
		if !ok {
			f.metrics.request(rw.Name(), outcomeRefused)
			apihttp.WriteStatus(w, r, newStatusError(http.StatusNotAcceptable, metav1.StatusReasonNotAcceptable,
				fmt.Sprintf("rewrite profile %s answers OpenAPI documents in JSON only; the request accepts %q", rw.Name(), r.Header.Get("Accept"))))
			return
		}
		out.Header.Set("Accept", accept)
		if q := out.URL.Query(); q.Has("hash") {
			q.Set("hash", untagHash(q.Get("hash")))
			out.URL.RawQuery = q.Encode()
		}
	}
	out.RequestURI = out.URL.RequestURI()
	out.Header.Del("Accept-Encoding")
	untagConditions(out.Header, fp)
	tag := validators(fp)
	f.relay(w, out, rw, next, func(rec *response) {
		rec.document = document
		rec.headers = func(h http.Header) {
			tag(h)
			if loc := h.Get("Location"); loc != "" {
				h.Set("Location", tagLocation(rw.OpenAPIV3Location(loc), fp))
			}
		}
	})
}

// untagConditions makes a selected caller's request unconditional but for
// the entity tags the agent gave it under this profile (fp), untagged: a
// part of an answer cannot be rewritten, nor a copy validated by date or
// by another tag told apart from one rewritten otherwise. kube-apiserver
// sets validators on aggregated discovery and on the OpenAPI documents.
func untagConditions(h http.Header, fp string) {
	for _, k := range []string{"Range", "If-Range", "If-Modified-Since", "If-Unmodified-Since", "If-Match"} {
		h.Del(k)
	}
	if tags := untagETags(h.Values("If-None-Match"), fp); tags != "" {
		h.Set("If-None-Match", tags)
	} else {
		h.Del("If-None-Match")
	}
}

// validators returns what tags the validators of an answer rewritten
// under the profile fp: its entity tag carries fp, and its date goes.
func validators(fp string) func(http.Header) {
	return func(h http.Header) {
		if etag := h.Get("Etag"); etag != "" {
			h.Set("Etag", tagETag(etag, fp))
		}
		h.Del("Last-Modified")
	}
}

// tagIndex rewrites an index of OpenAPI v3 documents for rw and adds the
// profile's fingerprint to the hash of each renamed group's document.
func tagIndex(index []byte, rw *rewrite.Rewriter) ([]byte, error) {
	v, err := rewrite.Decode(index)
	if err != nil {
		return nil, err
	}
	doc, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("want a JSON object, got %T", v)
	}
	paths, _ := rw.OpenAPIV3Index(doc)["paths"].(map[string]any)
	for _, e := range paths {
		entry, _ := e.(map[string]any)
		u, _ := entry["serverRelativeURL"].(string)
		p, _, _ := strings.Cut(u, "?")
		if _, what := rw.OpenAPIV3Path(p); what == rewrite.OpenAPIV3Document {
			entry["serverRelativeURL"] = tagLocation(u, rw.Fingerprint())
		}
	}
	return rewrite.Encode(doc)
}

// tagLocation adds fp to the hash of a document's server-relative URL.
func tagLocation(u, fp string) string {
	p, q, ok := strings.Cut(u, "?")
	if !ok {
		return u
	}
	params := strings.Split(q, "&")
	for i, kv := range params {
		if h, ok := strings.CutPrefix(kv, "hash="); ok {
			params[i] = "hash=" + h + "-" + fp
		}
	}
	return p + "?" + strings.Join(params, "&")
}

// untagHash removes what tagLocation added to a document's hash, under
// this profile or another: kube-apiserver's hashes are hex digits.
func untagHash(h string) string {
	if i := strings.LastIndexByte(h, '-'); i >= 0 {
		return h[:i]
	}
	return h
}

// tagETag adds fp inside an entity tag: "X" becomes "X-fp", W/"X"
// W/"X-fp".
func tagETag(etag, fp string) string {
	if !strings.HasSuffix(etag, `"`) || len(etag) < 2 {
		return etag
	}
	return etag[:len(etag)-1] + "-" + fp + `"`
}

// untagETags returns, of the entity tags of If-None-Match headers, those
// tagged with fp, untagged, comma-separated; tags without fp are
// dropped, and "*" is kept.
func untagETags(values []string, fp string) string {
	var kept []string
	suffix := "-" + fp + `"`
	for _, v := range values {
		for _, t := range strings.Split(v, ",") {
			t = strings.TrimSpace(t)
			switch {
			case t == "*":
				kept = append(kept, t)
			case strings.HasSuffix(t, suffix):
				kept = append(kept, strings.TrimSuffix(t, suffix)+`"`)
			}
		}
	}
	return strings.Join(kept, ", ")
}
