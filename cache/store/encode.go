package store

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

// MediaType is a response encoding the cache writes itself.
type MediaType int

const (
	MediaJSON MediaType = iota
	MediaProtobuf
)

// ContentType is m's Content-Type.
func (m MediaType) ContentType() string {
	if m == MediaProtobuf {
		return runtime.ContentTypeProtobuf
	}
	return runtime.ContentTypeJSON
}

// ProtobufMagic starts every kube-apiserver protobuf body.
var ProtobufMagic = []byte{0x6b, 0x38, 0x73, 0x00}

// Encoder writes one resource's objects and lists exactly as
// kube-apiserver's serializers do, from each Object's cached bytes.
type Encoder struct {
	gvk     schema.GroupVersionKind
	builtin bool
	json    runtime.Encoder
	// itemPrefix is how a typed object's JSON starts ({"kind":..,"apiVersion":..,);
	// list items are written without kind and apiVersion, as kube-apiserver
	// does for built-in types.
	itemPrefix []byte
	// events are the EventEncoders of the kind, by media type and whether
	// they embed metadata only (embed.go).
	events [2][2]*EventEncoder
}

// NewEncoder returns the Encoder of kind gvk; builtin: a type of
// client-go's scheme, written without kind and apiVersion in lists.
func NewEncoder(gvk schema.GroupVersionKind, builtin bool) *Encoder {
	e := &Encoder{
		gvk:     gvk,
		builtin: builtin,
		json:    jsonserializer.NewSerializerWithOptions(jsonserializer.DefaultMetaFactory, scheme.Scheme, scheme.Scheme, jsonserializer.SerializerOptions{}),
	}
	e.itemPrefix = []byte(`{"kind":` + strconv.Quote(gvk.Kind) + `,"apiVersion":` + strconv.Quote(gvk.GroupVersion().String()) + `,`)
	e.events = newEventEncoders(e)
	return e
}

// EncodeJSON is obj as kube-apiserver's JSON serializer writes it, less
// the trailing newline.
func (e *Encoder) EncodeJSON(obj runtime.Object) ([]byte, error) {
	var buf bytes.Buffer
	if err := e.json.Encode(obj, &buf); err != nil {
		return nil, err
	}
	// A copy of exactly the encoding's size: the buffer may have twice its
	// capacity, and the result is kept for as long as the object is cached.
	return bytes.Clone(bytes.TrimSuffix(buf.Bytes(), []byte("\n"))), nil
}

// EncodeProtobuf is obj's protobuf message (no envelope).
func EncodeProtobuf(obj runtime.Object) ([]byte, error) {
	m, ok := obj.(interface{ Marshal() ([]byte, error) })
	if !ok {
		return nil, fmt.Errorf("%T has no protobuf encoding", obj)
	}
	return m.Marshal()
}

// ObjectJSON is o's JSON, cached on o.
func (e *Encoder) ObjectJSON(o *Object) ([]byte, error) {
	return o.Encoded(EncodingJSON, e.EncodeJSON)
}

// ObjectProtobuf is o's protobuf message, cached on o.
func (e *Encoder) ObjectProtobuf(o *Object) ([]byte, error) {
	return o.Encoded(EncodingProtobuf, EncodeProtobuf)
}

// itemJSON is o as an item of a list: open (nil or "{") followed by rest.
// Built-in types drop kind and apiVersion; the cached bytes are reused.
func (e *Encoder) itemJSON(o *Object) (open, rest []byte, err error) {
	b, err := e.ObjectJSON(o)
	if err != nil || !e.builtin {
		return nil, b, err
	}
	if !bytes.HasPrefix(b, e.itemPrefix) {
		return nil, nil, fmt.Errorf("unexpected JSON encoding of %s %s", e.gvk.Kind, o.Key())
	}
	return openBrace, b[len(e.itemPrefix):], nil
}

var openBrace = []byte("{")

// Body is a response body as the byte slices to write in order: cached
// object encodings and small frames around them, never a copy of the
// objects.
type Body struct {
	parts [][]byte
}

// Add appends p to the body.
func (b *Body) Add(p []byte) { b.parts = append(b.parts, p) }

// Size is the body's length in bytes.
func (b *Body) Size() int {
	n := 0
	for _, p := range b.parts {
		n += len(p)
	}
	return n
}

// WriteAll writes the body, stopping at the first error.
func (b *Body) WriteAll(w io.Writer) error {
	for _, p := range b.parts {
		if _, err := w.Write(p); err != nil {
			return err
		}
	}
	return nil
}

// Bytes returns the body as one slice.
func (b *Body) Bytes() []byte {
	if len(b.parts) == 1 {
		return b.parts[0]
	}
	out := make([]byte, 0, b.Size())
	for _, p := range b.parts {
		out = append(out, p...)
	}
	return out
}

var newline = []byte("\n")

// Object returns the body of a get of o.
func (e *Encoder) Object(m MediaType, o *Object) (*Body, error) {
	if m == MediaProtobuf {
		raw, err := e.ObjectProtobuf(o)
		if err != nil {
			return nil, err
		}
		return Envelope(e.gvk.GroupVersion().String(), e.gvk.Kind, &Body{parts: [][]byte{raw}}), nil
	}
	b, err := e.ObjectJSON(o)
	if err != nil {
		return nil, err
	}
	return &Body{parts: [][]byte{b, newline}}, nil
}

// List returns the body of a list of objs at rv. Every object is encoded
// (or found encoded) before anything is written, so an encoding error never
// leaves a half-written response.
func (e *Encoder) List(m MediaType, objs []*Object, rv uint64) (*Body, error) {
	listKind := e.gvk.Kind + "List"
	apiVersion := e.gvk.GroupVersion().String()
	listMeta := metav1.ListMeta{ResourceVersion: strconv.FormatUint(rv, 10)}
	if m == MediaProtobuf {
		return protobufList(apiVersion, listKind, listMeta, objs, e.ObjectProtobuf)
	}
	head := []byte(`{"kind":` + strconv.Quote(listKind) + `,"apiVersion":` + strconv.Quote(apiVersion) +
		`,"metadata":{"resourceVersion":` + strconv.Quote(listMeta.ResourceVersion) + `},"items":[`)
	return jsonList(head, objs, e.itemJSON)
}

// protobufList returns the protobuf body of a list of objs: the list
// message (listMeta as field 1, then each object as item encodes it as
// field 2) in the envelope for apiVersion and kind.
func protobufList(apiVersion, kind string, listMeta metav1.ListMeta, objs []*Object, item func(*Object) ([]byte, error)) (*Body, error) {
	lm, err := listMeta.Marshal()
	if err != nil {
		return nil, err
	}
	raw := &Body{parts: make([][]byte, 0, 1+2*len(objs))}
	head := protowire.AppendTag(nil, 1, protowire.BytesType)
	raw.Add(protowire.AppendBytes(head, lm))
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
		raw.Add(tags[start:len(tags):len(tags)])
		raw.Add(b)
	}
	return Envelope(apiVersion, kind, raw), nil
}

// jsonList returns the JSON body of a list of objs: head (the list up to
// the opening bracket of its items), each object as item encodes it (an
// optional opening part, then the rest), comma-separated, and the closing
// "]}" and newline.
func jsonList(head []byte, objs []*Object, item func(*Object) (open, rest []byte, err error)) (*Body, error) {
	out := &Body{parts: make([][]byte, 0, 2+3*len(objs))}
	out.Add(head)
	comma := []byte(",")
	for i, o := range objs {
		open, rest, err := item(o)
		if err != nil {
			return nil, err
		}
		if i > 0 {
			out.Add(comma)
		}
		if open != nil {
			out.Add(open)
		}
		out.Add(rest)
	}
	out.Add([]byte("]}\n"))
	return out, nil
}

// Envelope wraps raw in the protobuf envelope kube-apiserver uses: the
// magic prefix and a runtime.Unknown holding apiVersion, kind and raw.
func Envelope(apiVersion, kind string, raw *Body) *Body {
	head := protowire.AppendVarint(envelopeHead(apiVersion, kind), uint64(raw.Size()))
	out := &Body{parts: make([][]byte, 0, len(raw.parts)+2)}
	out.Add(head)
	out.parts = append(out.parts, raw.parts...)
	out.Add(bytes.Clone(envelopeTail))
	return out
}

// envelopeHead is the protobuf envelope for apiVersion and kind up to the
// length of its raw message: the magic prefix, the runtime.Unknown's
// TypeMeta (field 1) and the tag of its raw field (field 2).
func envelopeHead(apiVersion, kind string) []byte {
	tm := protowire.AppendTag(nil, 1, protowire.BytesType)
	tm = protowire.AppendString(tm, apiVersion)
	tm = protowire.AppendTag(tm, 2, protowire.BytesType)
	tm = protowire.AppendString(tm, kind)
	head := append([]byte{}, ProtobufMagic...)
	head = protowire.AppendTag(head, 1, protowire.BytesType)
	head = protowire.AppendBytes(head, tm)
	return protowire.AppendTag(head, 2, protowire.BytesType)
}

// envelopeTail ends the protobuf envelope after the raw message: its
// contentEncoding (field 3) and contentType (field 4), both empty. It must
// not be modified.
var envelopeTail = []byte{0x1a, 0x00, 0x22, 0x00}

// Embed encodes obj as an object embedded in a watch event: JSON with kind
// and apiVersion, or kube-apiserver's protobuf envelope.
func Embed(m MediaType, obj runtime.Object, enc *Encoder) ([]byte, error) {
	if m == MediaProtobuf {
		raw, err := EncodeProtobuf(obj)
		if err != nil {
			return nil, err
		}
		gvk := obj.GetObjectKind().GroupVersionKind()
		return Envelope(gvk.GroupVersion().String(), gvk.Kind, &Body{parts: [][]byte{raw}}).Bytes(), nil
	}
	return enc.EncodeJSON(obj)
}
