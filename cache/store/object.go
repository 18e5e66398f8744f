package store

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Object is one cached object. It keeps what requests are answered from,
// not the decoded Go object: built-in types are held as their protobuf
// message (the bytes protobuf answers are written from, and a few times
// smaller than the decoded object), plus the key, labels and field values
// selectors are evaluated on. Other forms (JSON, metadata-only) are made
// from a decoded copy on first use and kept until the object changes (a
// change replaces the whole Object). Types without a protobuf encoding
// (custom resources) keep the decoded object.
//
// An Object is immutable once it is in a Store: callers must not modify
// the object Decoded returns nor the slices Encoded returns.
type Object struct {
	// key is namespace/name, or name for cluster-scoped objects.
	key string
	// rv is the object's resourceVersion (0 if it had none).
	rv uint64
	// labels are the object's labels, packed.
	labels packed
	// fieldKeys and fieldValues are the resource's field labels other than
	// metadata.name and metadata.namespace, and this object's values of
	// them, packed; fieldKeys is shared by the objects of a Store.
	fieldKeys, fieldValues string
	// raw is the protobuf message of a built-in object (no envelope); nil
	// when obj is kept instead.
	raw   []byte
	codec *protoCodec
	// obj is the decoded object of types without a protobuf encoding.
	obj runtime.Object

	// encs holds the other encodings made so far; allocated on first use.
	encs atomic.Pointer[encodings]
}

type encodings [numEncodings]atomic.Pointer[[]byte]

// Encoding names a per-object byte form that the Store keeps.
type Encoding int

const (
	// EncodingJSON is the object as kube-apiserver's JSON serializer
	// writes it for a get, with kind and apiVersion and no trailing newline.
	EncodingJSON Encoding = iota
	// EncodingProtobuf is the object's protobuf message (no envelope).
	EncodingProtobuf
	// EncodingMetadataJSON and EncodingMetadataProtobuf are the object as
	// a meta.k8s.io/v1 PartialObjectMetadata, in JSON (with kind and
	// apiVersion) and as a protobuf message (no envelope).
	EncodingMetadataJSON
	EncodingMetadataProtobuf
	// numEncodings is the number of Encoding values.
	numEncodings
)

// Encoded returns o's bytes in form e, calling encode on the decoded
// object the first time and keeping the result for every later call. The
// protobuf form of a built-in object is its stored message. encode must
// not modify the object (concurrent first calls may both encode; one
// result is kept). The returned slice must not be modified.
func (o *Object) Encoded(e Encoding, encode func(runtime.Object) ([]byte, error)) ([]byte, error) {
	if e == EncodingProtobuf && o.raw != nil {
		return o.raw, nil
	}
	encs := o.encs.Load()
	if encs == nil {
		o.encs.CompareAndSwap(nil, &encodings{})
		encs = o.encs.Load()
	}
	if b := encs[e].Load(); b != nil {
		return *b, nil
	}
	obj, err := o.Decoded()
	if err != nil {
		return nil, err
	}
	b, err := encode(obj)
	if err != nil {
		return nil, err
	}
	if !encs[e].CompareAndSwap(nil, &b) {
		return *encs[e].Load(), nil
	}
	return b, nil
}

// Decoded returns the object, with apiVersion and kind set: the kept one,
// or a copy decoded from the stored protobuf message. It must not be
// modified.
func (o *Object) Decoded() (runtime.Object, error) {
	if o.obj != nil {
		return o.obj, nil
	}
	return o.codec.decode(o.raw)
}

// Key returns the object's store key: namespace/name, or name for
// cluster-scoped objects.
func (o *Object) Key() string { return o.key }

// ResourceVersion returns the object's resourceVersion (0 if it had none).
func (o *Object) ResourceVersion() uint64 { return o.rv }

// Namespace returns the object's namespace (empty for cluster-scoped
// resources). Names and namespaces never contain a slash.
func (o *Object) Namespace() string {
	if i := strings.IndexByte(o.key, '/'); i >= 0 {
		return o.key[:i]
	}
	return ""
}

// Name returns the object's name.
func (o *Object) Name() string { return o.key[strings.IndexByte(o.key, '/')+1:] }

// selectable returns what label and field selectors match on o. A stored
// built-in object answers from its packed labels and field values and its
// key (metadata.namespace only when it has one); a kept object is asked
// with attrs.
func (o *Object) selectable(attrs AttrsFunc) (labels.Labels, fields.Fields) {
	if o.obj == nil {
		return o.labels, objectFields{o}
	}
	if attrs == nil {
		return labels.Set{}, fields.Set{}
	}
	l, f, err := attrs(o.obj)
	if err != nil {
		return labels.Set{}, fields.Set{}
	}
	return l, f
}

// objectFields are a stored object's field values.
type objectFields struct{ o *Object }

func (f objectFields) Has(field string) bool {
	_, ok := f.lookup(field)
	return ok
}

func (f objectFields) Get(field string) string {
	v, _ := f.lookup(field)
	return v
}

func (f objectFields) lookup(field string) (string, bool) {
	switch field {
	case "metadata.name":
		return f.o.Name(), true
	case "metadata.namespace":
		if i := strings.IndexByte(f.o.key, '/'); i >= 0 {
			return f.o.key[:i], true
		}
		return "", false
	}
	return lookupIn(f.o.fieldKeys, f.o.fieldValues, field)
}

// lookupIn finds key among keys (each NUL-terminated) and returns the
// value at the same position among values.
func lookupIn(keys, values, key string) (string, bool) {
	for keys != "" {
		var k, v string
		k, keys, _ = strings.Cut(keys, "\x00")
		v, values, _ = strings.Cut(values, "\x00")
		if k == key {
			return v, true
		}
	}
	return "", false
}

// packed is a small string map in one string: the sorted keys, each
// NUL-terminated, one more NUL, then the values in the same order, each
// NUL-terminated. Keys are never empty, so the first two NULs in a row end
// the keys. Label keys and values never contain NUL. It implements
// labels.Labels.
type packed string

// packMap returns m packed, or false if a key is empty or a key or value
// holds a NUL.
func packMap(m map[string]string) (packed, bool) {
	if len(m) == 0 {
		return "", true
	}
	keys := make([]string, 0, len(m))
	n := 1
	for k, v := range m {
		if k == "" || strings.IndexByte(k, 0) >= 0 || strings.IndexByte(v, 0) >= 0 {
			return "", false
		}
		keys = append(keys, k)
		n += len(k) + len(v) + 2
	}
	slices.Sort(keys)
	var b strings.Builder
	b.Grow(n)
	for _, k := range keys {
		b.WriteString(k)
		b.WriteByte(0)
	}
	b.WriteByte(0)
	for _, k := range keys {
		b.WriteString(m[k])
		b.WriteByte(0)
	}
	return packed(b.String()), true
}

// Lookup implements labels.Labels.
func (p packed) Lookup(key string) (string, bool) {
	i := strings.Index(string(p), "\x00\x00")
	if i < 0 {
		return "", false
	}
	return lookupIn(string(p[:i+1]), string(p[i+2:]), key)
}

// Has implements labels.Labels.
func (p packed) Has(key string) bool {
	_, ok := p.Lookup(key)
	return ok
}

// Get implements labels.Labels.
func (p packed) Get(key string) string {
	v, _ := p.Lookup(key)
	return v
}

// packFields splits set (less the metadata fields, which come from the
// key) into its sorted keys and the matching values, each NUL-terminated,
// or returns false if a key or value holds a NUL.
func packFields(set fields.Set) (keys, values string, ok bool) {
	names := make([]string, 0, len(set))
	for k, v := range set {
		if strings.IndexByte(k, 0) >= 0 || strings.IndexByte(v, 0) >= 0 {
			return "", "", false
		}
		if k != "metadata.name" && k != "metadata.namespace" {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	var kb, vb strings.Builder
	for _, k := range names {
		kb.WriteString(k)
		kb.WriteByte(0)
		vb.WriteString(set[k])
		vb.WriteByte(0)
	}
	return kb.String(), vb.String(), true
}

// protoObject is a built-in object with its generated protobuf methods.
type protoObject interface {
	runtime.Object
	Marshal() ([]byte, error)
	Unmarshal([]byte) error
}

// protoCodec decodes the stored protobuf messages of one Go type and
// version.
type protoCodec struct {
	typ reflect.Type
	gvk schema.GroupVersionKind
}

func (c *protoCodec) decode(raw []byte) (runtime.Object, error) {
	obj, ok := reflect.New(c.typ).Interface().(protoObject)
	if !ok {
		return nil, fmt.Errorf("%v has no protobuf encoding", c.typ)
	}
	if err := obj.Unmarshal(raw); err != nil {
		return nil, fmt.Errorf("decoding a cached %s: %w", c.gvk.Kind, err)
	}
	obj.GetObjectKind().SetGroupVersionKind(c.gvk)
	return obj, nil
}

func (c *protoCodec) matches(obj runtime.Object) bool {
	return c != nil && reflect.TypeOf(obj).Elem() == c.typ && obj.GetObjectKind().GroupVersionKind() == c.gvk
}

// Key is the store key of namespace/name: namespace/name, or name for a
// cluster-scoped object.
func Key(namespace, name string) string {
	if namespace == "" {
		return name
	}
	return namespace + "/" + name
}
