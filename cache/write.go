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
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/kube-apicache/kube-apicache/cache/store"
)

func groupResource(info *request.RequestInfo) schema.GroupResource {
	return schema.GroupResource{Group: info.APIGroup, Resource: info.Resource}
}

// maxWriteBody bounds how much of a write's response is read to find its
// resourceVersion.
const maxWriteBody = 4 << 20

// maxObservedBytes bounds the write responses being read at once, across
// all requests: a burst of large writes cannot make the agent hold more
// than this. A write that finds the budget spent counts as a write whose
// RV is unknown (consistent reads are forwarded for the wait timeout),
// which is always safe.
const maxObservedBytes = 32 << 20

// unknownLengthBody is what reading a response of unknown length reserves.
// Objects are rarely larger; a larger one counts as a write of unknown RV.
const unknownLengthBody = 1 << 20

// maxEmptyCollectionBody bounds how much of a deletecollection's answer is
// read to find whether it is empty: an empty list is a few hundred bytes,
// an empty Table a few kilobytes. A larger answer deleted something.
const maxEmptyCollectionBody = 64 << 10

var writeVerbs = map[string]bool{"create": true, "update": true, "patch": true, "delete": true, "deletecollection": true}

// ObserveWrite is the read-your-writes barrier's input: the forwarder calls
// it with every upstream response before relaying it. For a successful
// write of a cached resource it records the resourceVersion the response
// carries, and consistent reads of that resource then wait until the cache
// has caught up with it. A write whose RV cannot be read makes consistent
// reads of the resource go upstream for the wait timeout.
//
// Only answers that kube-apiserver's own storage wrote are trusted: writes
// of the resource itself or of its status or scale subresource, whose body
// is that resource's object (kind, apiVersion, namespace and name checked
// against the request). Every other subresource is ignored: a proxy
// subresource's answer comes from a tenant's own backend and could name
// any resourceVersion.
//
// A deletecollection answers with the objects it deleted, as listed before
// the deletions, at an RV older than any of them: its RV is unknown, unless
// the answer is empty, when it deleted nothing and changes nothing. So a
// caller who may delete a collection cannot send every consistent read of
// the resource upstream for the wait timeout by deleting what is not there.
// Other writes of unknown RV still do (a 5xx, a Status, a compressed or
// oversized answer, a deletecollection that deleted something): a caller
// who may write a cached resource can keep the node's consistent reads of
// it forwarded under ConsistentLocalWrites, never answered stale. The
// default, ConsistentProbe, does not wait for this barrier.
//
// It may read resp.Body, which it then replaces with an equivalent reader.
func (c *Cache) ObserveWrite(resp *http.Response) {
	if resp == nil || resp.Request == nil || resp.StatusCode < 200 || (resp.StatusCode > 299 && resp.StatusCode < 500) {
		// 4xx: refused before anything was stored. 5xx (a timeout, etcd
		// trouble) may follow a committed write: its RV is unknown.
		return
	}
	info, ok := request.RequestInfoFrom(resp.Request.Context())
	if !ok || !info.IsResourceRequest || !writeVerbs[info.Verb] || !storageSubresource(info.Subresource) {
		return
	}
	r := c.byGR[groupResource(info)]
	if r == nil || len(resp.Request.URL.Query()["dryRun"]) > 0 {
		// A dry run changes nothing.
		return
	}
	now := c.now()
	until := now.Add(c.cfg.WaitTimeout)
	if resp.StatusCode >= 500 {
		r.noteWrite(0, false, now, until)
		return
	}
	if info.Verb == "deletecollection" {
		if buf, ok := c.readWriteBody(resp, maxEmptyCollectionBody); ok {
			empty := deletedNothing(buf, resp.Header.Get("Content-Type"), info, r)
			c.observing.Add(-int64(cap(buf)))
			if empty {
				return
			}
		}
		r.noteWrite(0, false, now, until)
		return
	}
	buf, ok := c.readWriteBody(resp, maxWriteBody)
	if !ok {
		r.noteWrite(0, false, now, until)
		return
	}
	defer c.observing.Add(-int64(cap(buf)))
	id, ok := writtenObject(buf, resp.Header.Get("Content-Type"))
	switch {
	case !ok || id.kind == "Status":
		// A Status (a delete that removed the object at once) or a body
		// that does not parse: the write happened, its RV is unknown.
		r.noteWrite(0, false, now, until)
		return
	case !id.answers(info, r):
		// Not the object this request wrote: nothing kube-apiserver's
		// storage would answer. Trust nothing in it.
		klog.Background().V(4).Info("Ignoring a write answer that is not the written object", "resource", r.label,
			"kind", id.kind, "apiVersion", id.apiVersion, "namespace", id.namespace, "name", id.name)
		return
	}
	rv, err := store.ParseResourceVersion(id.rv)
	if err != nil {
		r.noteWrite(0, false, now, until)
		return
	}
	if info.Subresource != "scale" && r.outOfScope(buf) {
		// The object is outside what the cache holds (a pod on another
		// node): the write cannot change a cached answer, and the scoped
		// watch would not reach its RV before its next bookmark.
		return
	}
	r.noteWrite(rv, true, now, until)
}

// storageSubresource reports whether a write of this subresource answers
// with an object kube-apiserver's storage wrote: the resource itself, its
// status, or its scale.
func storageSubresource(sub string) bool {
	return sub == "" || sub == "status" || sub == "scale"
}

// readWriteBody reads a write's response body, of at most limit bytes,
// within the agent-wide budget and puts the bytes back in front of the
// body. It returns false, having read nothing it keeps, when the body is
// absent, compressed, too large or the budget is spent. On success the
// caller must return cap(buf) to c.observing.
func (c *Cache) readWriteBody(resp *http.Response, limit int64) ([]byte, bool) {
	if resp.Body == nil || resp.Body == http.NoBody || resp.Header.Get("Content-Encoding") != "" {
		return nil, false
	}
	reserve := min(int64(unknownLengthBody), limit)
	switch {
	case resp.ContentLength > limit:
		return nil, false
	case resp.ContentLength >= 0:
		reserve = resp.ContentLength
	}
	if c.observing.Add(reserve) > maxObservedBytes {
		c.observing.Add(-reserve)
		return nil, false
	}
	buf := make([]byte, 0, reserve+1)
	buf, err := readAllInto(buf, io.LimitReader(resp.Body, reserve+1))
	resp.Body = readCloser{Reader: io.MultiReader(bytes.NewReader(buf), resp.Body), Closer: resp.Body}
	if err != nil || int64(len(buf)) > reserve {
		c.observing.Add(-reserve)
		return nil, false
	}
	// Account for what was allocated, which is what the caller releases.
	c.observing.Add(int64(cap(buf)) - reserve)
	return buf, true
}

// readAllInto reads r to its end into buf's spare capacity (growing it
// only if r is longer than that).
func readAllInto(buf []byte, r io.Reader) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// outOfScope reports whether the object in a write's body is outside r's
// scope. Unscoped resources hold every object. Only core pods and nodes are
// scoped, so this needs no informer: it holds while the resource is idle.
func (r *resource) outOfScope(buf []byte) bool {
	if r.scopeAttrs == nil {
		return false
	}
	obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(buf, nil, nil)
	if err != nil {
		return false
	}
	_, set, err := r.scopeAttrs(obj)
	if err != nil {
		return false
	}
	return !r.scope.Matches(set)
}

// objectIdentity is what a write's answer says about the object it holds.
type objectIdentity struct {
	apiVersion, kind, namespace, name, rv string
}

// answers reports whether id is the object a write of info returns: the
// resource's own kind (Scale for the scale subresource) in the request's
// group and version, in the request's namespace, and with its name when
// the request named one (a create may have the name generated). The kind
// and scope are checked only while an informer has resolved them.
func (id objectIdentity) answers(info *request.RequestInfo, r *resource) bool {
	resolved := r.current.Load()
	if resolved != nil && !resolved.ready.Load() {
		resolved = nil
	}
	wantKind, wantAPIVersion := "", schema.GroupVersion{Group: info.APIGroup, Version: info.APIVersion}.String()
	switch {
	case info.Subresource == "scale":
		wantKind, wantAPIVersion = "Scale", "autoscaling/v1"
	case resolved != nil:
		wantKind = resolved.gvk.Kind
	}
	if (wantKind != "" && id.kind != wantKind) || id.apiVersion != wantAPIVersion {
		return false
	}
	if id.namespace != info.Namespace && (resolved == nil || resolved.namespaced) {
		return false
	}
	return info.Name == "" || id.name == info.Name
}

// writtenObject reads the identity and resourceVersion of the object in a
// write's answer, in JSON or protobuf.
func writtenObject(buf []byte, contentType string) (objectIdentity, bool) {
	if strings.HasPrefix(contentType, runtime.ContentTypeProtobuf) {
		return protobufIdentity(buf)
	}
	var doc struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name            string `json:"name"`
			Namespace       string `json:"namespace"`
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	}
	if json.Unmarshal(buf, &doc) != nil {
		return objectIdentity{}, false
	}
	return objectIdentity{apiVersion: doc.APIVersion, kind: doc.Kind, namespace: doc.Metadata.Namespace,
		name: doc.Metadata.Name, rv: doc.Metadata.ResourceVersion}, true
}

// deletedNothing reports whether buf, a deletecollection's answer, is an
// empty collection of the request's resource: a list of its kind or of its
// metadata (PartialObjectMetadataList) without items, or a Table without
// rows, in JSON, YAML or protobuf, whichever the caller asked for.
// kube-apiserver's answer holds every object it deleted (from all the
// pages it listed, or from the one page a limit asked for). Anything else,
// such as a Status or a CBOR body, counts as a collection that was not
// empty.
func deletedNothing(buf []byte, contentType string, info *request.RequestInfo, r *resource) bool {
	var id objectIdentity
	var n int
	switch {
	case strings.HasPrefix(contentType, runtime.ContentTypeProtobuf):
		var ok bool
		if id, n, ok = protobufCollection(buf); !ok {
			return false
		}
	default:
		if strings.HasPrefix(contentType, runtime.ContentTypeYAML) {
			j, err := yaml.YAMLToJSON(buf)
			if err != nil {
				return false
			}
			buf = j
		}
		var doc struct {
			APIVersion string            `json:"apiVersion"`
			Kind       string            `json:"kind"`
			Items      []json.RawMessage `json:"items"`
			Rows       []json.RawMessage `json:"rows"`
		}
		if json.Unmarshal(buf, &doc) != nil {
			return false
		}
		id = objectIdentity{apiVersion: doc.APIVersion, kind: doc.Kind}
		n = len(doc.Items)
		if doc.Kind == "Table" {
			n = len(doc.Rows)
		}
	}
	return n == 0 && id.listOf(info, r)
}

// listOf reports whether id is the kind of a collection answer of info's
// resource: its list kind in the request's group and version (checked
// while an informer has resolved the kind), or a meta.k8s.io Table or
// PartialObjectMetadataList.
func (id objectIdentity) listOf(info *request.RequestInfo, r *resource) bool {
	switch id.apiVersion {
	case "meta.k8s.io/v1", "meta.k8s.io/v1beta1":
		return id.kind == "Table" || id.kind == "PartialObjectMetadataList"
	case schema.GroupVersion{Group: info.APIGroup, Version: info.APIVersion}.String():
	default:
		return false
	}
	if resolved := r.current.Load(); resolved != nil && resolved.ready.Load() {
		return id.kind == resolved.gvk.Kind+"List"
	}
	return strings.HasSuffix(id.kind, "List")
}

// protobufCollection reads the type and item count of a list in
// kube-apiserver's protobuf envelope: TypeMeta in field 1, the list in
// field 2, whose items are its field 2 (ListMeta is field 1).
func protobufCollection(b []byte) (objectIdentity, int, bool) {
	id, raw, ok := protobufEnvelope(b)
	if !ok {
		return objectIdentity{}, 0, false
	}
	items := 0
	eachField(raw, func(num protowire.Number, _ []byte) {
		if num == 2 {
			items++
		}
	})
	return id, items, id.kind != ""
}

// protobufEnvelope splits kube-apiserver's protobuf envelope: the
// identity from TypeMeta (apiVersion 1, kind 2) in field 1, and the raw
// object in field 2.
func protobufEnvelope(b []byte) (id objectIdentity, raw []byte, ok bool) {
	if !bytes.HasPrefix(b, store.ProtobufMagic) {
		return objectIdentity{}, nil, false
	}
	var typeMeta []byte
	eachField(b[len(store.ProtobufMagic):], func(num protowire.Number, v []byte) {
		switch num {
		case 1:
			typeMeta = v
		case 2:
			raw = v
		}
	})
	eachField(typeMeta, func(num protowire.Number, v []byte) {
		switch num {
		case 1:
			id.apiVersion = string(v)
		case 2:
			id.kind = string(v)
		}
	})
	return id, raw, true
}

type readCloser struct {
	io.Reader
	io.Closer
}

// protobufIdentity reads an object's identity from kube-apiserver's
// protobuf envelope: TypeMeta (apiVersion 1, kind 2) in field 1, the
// object in field 2, whose field 1 is its ObjectMeta (name 1, namespace 3,
// resourceVersion 6).
func protobufIdentity(b []byte) (objectIdentity, bool) {
	id, raw, ok := protobufEnvelope(b)
	if !ok {
		return objectIdentity{}, false
	}
	var metadata []byte
	eachField(raw, func(num protowire.Number, v []byte) {
		if num == 1 && metadata == nil {
			metadata = v
		}
	})
	eachField(metadata, func(num protowire.Number, v []byte) {
		switch num {
		case 1:
			id.name = string(v)
		case 3:
			id.namespace = string(v)
		case 6:
			id.rv = string(v)
		}
	})
	return id, id.kind != ""
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
