package cache

import (
	"bytes"
	"fmt"
	"io"
	"strconv"

	"google.golang.org/protobuf/encoding/protowire"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	jsonserializer "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/client-go/kubernetes/scheme"
)

// mediaType is a response encoding the cache writes itself.
type mediaType int

const (
	mediaJSON mediaType = iota
	mediaProtobuf
)

func (m mediaType) contentType() string {
	if m == mediaProtobuf {
		return runtime.ContentTypeProtobuf
	}
	return runtime.ContentTypeJSON
}

// protobufMagic starts every kube-apiserver protobuf body.
var protobufMagic = []byte{0x6b, 0x38, 0x73, 0x00}

// encoder writes one resource's objects and lists exactly as
// kube-apiserver's serializers do, from each Object's cached bytes.
type encoder struct {
	gvk     schema.GroupVersionKind
	builtin bool
	json    runtime.Encoder
	// itemPrefix is how a typed object's JSON starts ({"kind":..,"apiVersion":..,);
	// list items are written without kind and apiVersion, as kube-apiserver
	// does for built-in types.
	itemPrefix []byte
}

func newEncoder(gvk schema.GroupVersionKind, builtin bool) *encoder {
	e := &encoder{
		gvk:     gvk,
		builtin: builtin,
		json:    jsonserializer.NewSerializerWithOptions(jsonserializer.DefaultMetaFactory, scheme.Scheme, scheme.Scheme, jsonserializer.SerializerOptions{}),
	}
	e.itemPrefix = []byte(`{"kind":` + strconv.Quote(gvk.Kind) + `,"apiVersion":` + strconv.Quote(gvk.GroupVersion().String()) + `,`)
	return e
}

func (e *encoder) encodeJSON(obj runtime.Object) ([]byte, error) {
	var buf bytes.Buffer
	if err := e.json.Encode(obj, &buf); err != nil {
		return nil, err
	}
	// A copy of exactly the encoding's size: the buffer may have twice its
	// capacity, and the result is kept for as long as the object is cached.
	return bytes.Clone(bytes.TrimSuffix(buf.Bytes(), []byte("\n"))), nil
}

func encodeProtobuf(obj runtime.Object) ([]byte, error) {
	m, ok := obj.(interface{ Marshal() ([]byte, error) })
	if !ok {
		return nil, fmt.Errorf("%T has no protobuf encoding", obj)
	}
	return m.Marshal()
}

func (e *encoder) objectJSON(o *Object) ([]byte, error) {
	return o.Encoded(EncodingJSON, e.encodeJSON)
}

func (e *encoder) objectProtobuf(o *Object) ([]byte, error) {
	return o.Encoded(EncodingProtobuf, encodeProtobuf)
}

// itemJSON is o as an item of a list: open (nil or "{") followed by rest.
// Built-in types drop kind and apiVersion; the cached bytes are reused.
func (e *encoder) itemJSON(o *Object) (open, rest []byte, err error) {
	b, err := e.objectJSON(o)
	if err != nil || !e.builtin {
		return nil, b, err
	}
	if !bytes.HasPrefix(b, e.itemPrefix) {
		return nil, nil, fmt.Errorf("unexpected JSON encoding of %s %s", e.gvk.Kind, o.Key())
	}
	return openBrace, b[len(e.itemPrefix):], nil
}

var openBrace = []byte("{")

// body is a response body as the byte slices to write in order: cached
// object encodings and small frames around them, never a copy of the
// objects.
type body struct {
	parts [][]byte
}

func (b *body) add(p []byte) { b.parts = append(b.parts, p) }

func (b *body) size() int {
	n := 0
	for _, p := range b.parts {
		n += len(p)
	}
	return n
}

// writeTo writes the body, stopping at the first error.
func (b *body) writeTo(w io.Writer) error {
	for _, p := range b.parts {
		if _, err := w.Write(p); err != nil {
			return err
		}
	}
	return nil
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

var newline = []byte("\n")

// object returns the body of a get of o.
func (e *encoder) object(m mediaType, o *Object) (*body, error) {
	if m == mediaProtobuf {
		raw, err := e.objectProtobuf(o)
		if err != nil {
			return nil, err
		}
		return envelope(e.gvk.GroupVersion().String(), e.gvk.Kind, &body{parts: [][]byte{raw}}), nil
	}
	b, err := e.objectJSON(o)
	if err != nil {
		return nil, err
	}
	return &body{parts: [][]byte{b, newline}}, nil
}

// list returns the body of a list of objs at rv. Every object is encoded
// (or found encoded) before anything is written, so an encoding error never
// leaves a half-written response.
func (e *encoder) list(m mediaType, objs []*Object, rv uint64) (*body, error) {
	listKind := e.gvk.Kind + "List"
	apiVersion := e.gvk.GroupVersion().String()
	listMeta := metav1.ListMeta{ResourceVersion: strconv.FormatUint(rv, 10)}
	if m == mediaProtobuf {
		return protobufList(apiVersion, listKind, listMeta, objs, e.objectProtobuf)
	}
	head := []byte(`{"kind":` + strconv.Quote(listKind) + `,"apiVersion":` + strconv.Quote(apiVersion) +
		`,"metadata":{"resourceVersion":` + strconv.Quote(listMeta.ResourceVersion) + `},"items":[`)
	return jsonList(head, objs, e.itemJSON)
}

// protobufList returns the protobuf body of a list of objs: the list
// message (listMeta as field 1, then each object as item encodes it as
// field 2) in the envelope for apiVersion and kind.
func protobufList(apiVersion, kind string, listMeta metav1.ListMeta, objs []*Object, item func(*Object) ([]byte, error)) (*body, error) {
	lm, err := listMeta.Marshal()
	if err != nil {
		return nil, err
	}
	raw := &body{parts: make([][]byte, 0, 1+2*len(objs))}
	head := protowire.AppendTag(nil, 1, protowire.BytesType)
	raw.add(protowire.AppendBytes(head, lm))
	// One buffer holds every item's tag and length.
	tags := make([]byte, 0, 6*len(objs))
	for _, o := range objs {
		b, err := item(o)
		if err != nil {
			return nil, err
		}
		start := len(tags)
		tags = protowire.AppendTag(tags, 2, protowire.BytesType)
		tags = protowire.AppendVarint(tags, uint64(len(b)))
		raw.add(tags[start:len(tags):len(tags)])
		raw.add(b)
	}
	return envelope(apiVersion, kind, raw), nil
}

// jsonList returns the JSON body of a list of objs: head (the list up to
// the opening bracket of its items), each object as item encodes it (an
// optional opening part, then the rest), comma-separated, and the closing
// "]}" and newline.
func jsonList(head []byte, objs []*Object, item func(*Object) (open, rest []byte, err error)) (*body, error) {
	out := &body{parts: make([][]byte, 0, 2+3*len(objs))}
	out.add(head)
	comma := []byte(",")
	for i, o := range objs {
		open, rest, err := item(o)
		if err != nil {
			return nil, err
		}
		if i > 0 {
			out.add(comma)
		}
		if open != nil {
			out.add(open)
		}
		out.add(rest)
	}
	out.add([]byte("]}\n"))
	return out, nil
}

// envelope wraps raw in the protobuf envelope kube-apiserver uses: the
// magic prefix and a runtime.Unknown holding apiVersion, kind and raw.
func envelope(apiVersion, kind string, raw *body) *body {
	tm := protowire.AppendTag(nil, 1, protowire.BytesType)
	tm = protowire.AppendString(tm, apiVersion)
	tm = protowire.AppendTag(tm, 2, protowire.BytesType)
	tm = protowire.AppendString(tm, kind)
	head := append([]byte{}, protobufMagic...)
	head = protowire.AppendTag(head, 1, protowire.BytesType)
	head = protowire.AppendBytes(head, tm)
	head = protowire.AppendTag(head, 2, protowire.BytesType)
	head = protowire.AppendVarint(head, uint64(raw.size()))
	out := &body{parts: make([][]byte, 0, len(raw.parts)+2)}
	out.add(head)
	out.parts = append(out.parts, raw.parts...)
	// contentEncoding (field 3) and contentType (field 4), both empty.
	out.add([]byte{0x1a, 0x00, 0x22, 0x00})
	return out
}
