package cache

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/client-go/kubernetes/scheme"
)

func groupResource(info *request.RequestInfo) schema.GroupResource {
	return schema.GroupResource{Group: info.APIGroup, Resource: info.Resource}
}

// maxWriteBody bounds how much of a write's response is read to find its
// resourceVersion.
const maxWriteBody = 4 << 20

var writeVerbs = map[string]bool{"create": true, "update": true, "patch": true, "delete": true, "deletecollection": true}

// ObserveWrite is the read-your-writes barrier's input: the forwarder calls
// it with every upstream response before relaying it. For a successful
// write of a cached resource it records the resourceVersion the response
// carries, and consistent reads of that resource then wait until the cache
// has caught up with it. A write whose RV cannot be read makes consistent
// reads of the resource go upstream for the wait timeout.
//
// It may read resp.Body, which it then replaces with an equivalent reader.
func (c *Cache) ObserveWrite(resp *http.Response) {
	if resp == nil || resp.Request == nil || resp.StatusCode < 200 || (resp.StatusCode > 299 && resp.StatusCode < 500) {
		// 4xx: refused before anything was stored. 5xx (a timeout, etcd
		// trouble) may follow a committed write: its RV is unknown.
		return
	}
	info, ok := request.RequestInfoFrom(resp.Request.Context())
	if !ok || !info.IsResourceRequest || !writeVerbs[info.Verb] {
		return
	}
	r := c.byGR[groupResource(info)]
	if r == nil || len(resp.Request.URL.Query()["dryRun"]) > 0 {
		// A dry run changes nothing.
		return
	}
	until := c.now().Add(c.cfg.WaitTimeout)
	if resp.StatusCode >= 500 || info.Verb == "deletecollection" {
		// deletecollection answers with the list as it was before the
		// deletions, at an RV older than any of them.
		r.noteWrite(0, false, until)
		return
	}
	rv, known := readWriteRV(resp)
	if known && r.outOfScope(resp) {
		// The object is outside what the cache holds (a pod on another
		// node): the write cannot change a cached answer, and the scoped
		// watch would not reach its RV before its next bookmark.
		return
	}
	r.noteWrite(rv, known, until)
}

// outOfScope reports whether the object in a write's (already read) body
// is outside r's scope. Unscoped resources hold every object.
func (r *resource) outOfScope(resp *http.Response) bool {
	if len(r.scopeTerms) == 0 || !r.ready.Load() || !r.builtin {
		return false
	}
	buf, err := io.ReadAll(io.LimitReader(resp.Body, maxWriteBody+1))
	resp.Body = readCloser{Reader: io.MultiReader(bytes.NewReader(buf), resp.Body), Closer: resp.Body}
	if err != nil {
		return false
	}
	obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(buf, nil, nil)
	if err != nil {
		return false
	}
	_, set, err := attrsFor(r.fields, r.namespaced)(obj)
	if err != nil {
		return false
	}
	return !r.scope.Matches(set)
}

// readWriteRV reads the resourceVersion of the object or list in a write's
// response body, and puts the bytes it read back in front of the body.
func readWriteRV(resp *http.Response) (uint64, bool) {
	if resp.Body == nil || resp.Body == http.NoBody || resp.Header.Get("Content-Encoding") != "" {
		return 0, false
	}
	if resp.ContentLength > maxWriteBody {
		return 0, false
	}
	buf, err := io.ReadAll(io.LimitReader(resp.Body, maxWriteBody+1))
	resp.Body = readCloser{Reader: io.MultiReader(bytes.NewReader(buf), resp.Body), Closer: resp.Body}
	if err != nil || len(buf) > maxWriteBody {
		return 0, false
	}
	var rv string
	if strings.HasPrefix(resp.Header.Get("Content-Type"), runtime.ContentTypeProtobuf) {
		rv = protobufRV(buf)
	} else {
		var doc struct {
			Kind     string `json:"kind"`
			Metadata struct {
				ResourceVersion string `json:"resourceVersion"`
			} `json:"metadata"`
		}
		if json.Unmarshal(buf, &doc) == nil && doc.Kind != "Status" {
			rv = doc.Metadata.ResourceVersion
		}
	}
	n, err := ParseResourceVersion(rv)
	if err != nil {
		return 0, false
	}
	return n, true
}

type readCloser struct {
	io.Reader
	io.Closer
}

// protobufRV finds metadata.resourceVersion in a protobuf envelope: the
// object's field 1 is its ObjectMeta (resourceVersion is field 6) or, for
// a list, its ListMeta (resourceVersion is field 2).
func protobufRV(b []byte) string {
	if !bytes.HasPrefix(b, protobufMagic) {
		return ""
	}
	var typeMeta, raw []byte
	eachField(b[len(protobufMagic):], func(num protowire.Number, v []byte) {
		switch num {
		case 1:
			typeMeta = v
		case 2:
			raw = v
		}
	})
	var kind string
	eachField(typeMeta, func(num protowire.Number, v []byte) {
		if num == 2 {
			kind = string(v)
		}
	})
	if kind == "Status" {
		return ""
	}
	rvField := protowire.Number(6)
	if strings.HasSuffix(kind, "List") {
		rvField = 2
	}
	var metadata []byte
	eachField(raw, func(num protowire.Number, v []byte) {
		if num == 1 && metadata == nil {
			metadata = v
		}
	})
	var rv string
	eachField(metadata, func(num protowire.Number, v []byte) {
		if num == rvField {
			rv = string(v)
		}
	})
	return rv
}

// eachField calls fn for each length-delimited field of the message b and
// skips the others; it stops at malformed input.
func eachField(b []byte, fn func(protowire.Number, []byte)) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return
		}
		b = b[n:]
		if typ == protowire.BytesType {
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return
			}
			fn(num, v)
			b = b[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return
		}
		b = b[m:]
	}
}
