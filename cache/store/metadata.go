package store

import (
	"strconv"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// The meta.k8s.io/v1 kinds of metadata-only answers.
var (
	MetadataGVK     = metav1.SchemeGroupVersion.WithKind("PartialObjectMetadata")
	MetadataListGVK = metav1.SchemeGroupVersion.WithKind("PartialObjectMetadataList")
)

// AsPartialObjectMetadata returns obj's metadata as kube-apiserver's
// transformation returns it for Accept as=PartialObjectMetadata.
func AsPartialObjectMetadata(obj runtime.Object) (*metav1.PartialObjectMetadata, error) {
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil, err
	}
	p := meta.AsPartialObjectMetadata(m)
	p.SetGroupVersionKind(MetadataGVK)
	return p, nil
}

// metadataJSON is o as a PartialObjectMetadata in JSON, cached on o.
func (e *Encoder) metadataJSON(o *Object) ([]byte, error) {
	return o.Encoded(EncodingMetadataJSON, e.encodeMetadataJSON)
}

// encodeMetadataJSON is obj's PartialObjectMetadata in JSON
// (EncodingMetadataJSON).
func (e *Encoder) encodeMetadataJSON(obj runtime.Object) ([]byte, error) {
	p, err := AsPartialObjectMetadata(obj)
	if err != nil {
		return nil, err
	}
	return e.EncodeJSON(p)
}

// metadataProtobuf is o's PartialObjectMetadata protobuf message, cached
// on o.
func (e *Encoder) metadataProtobuf(o *Object) ([]byte, error) {
	return o.Encoded(EncodingMetadataProtobuf, encodeMetadataProtobuf)
}

// encodeMetadataProtobuf is obj's PartialObjectMetadata protobuf message
// (EncodingMetadataProtobuf).
func encodeMetadataProtobuf(obj runtime.Object) ([]byte, error) {
	p, err := AsPartialObjectMetadata(obj)
	if err != nil {
		return nil, err
	}
	return p.Marshal()
}

// MetadataObject returns the body of a metadata-only get of o, or o's
// embedded form in a metadata-only watch event (without the JSON newline).
func (e *Encoder) MetadataObject(m MediaType, o *Object) (*Body, error) {
	if m == MediaProtobuf {
		raw, err := e.metadataProtobuf(o)
		if err != nil {
			return nil, err
		}
		return Envelope(MetadataGVK.GroupVersion().String(), MetadataGVK.Kind, &Body{parts: [][]byte{raw}}), nil
	}
	b, err := e.metadataJSON(o)
	if err != nil {
		return nil, err
	}
	return &Body{parts: [][]byte{b}}, nil
}

// MetadataList returns the body of a metadata-only list of objs at rv: a
// PartialObjectMetadataList whose items carry their kind and apiVersion,
// as kube-apiserver writes it.
func (e *Encoder) MetadataList(m MediaType, objs []*Object, rv uint64) (*Body, error) {
	listMeta := metav1.ListMeta{ResourceVersion: strconv.FormatUint(rv, 10)}
	if m == MediaProtobuf {
		return protobufList(MetadataListGVK.GroupVersion().String(), MetadataListGVK.Kind, listMeta, objs, e.metadataProtobuf)
	}
	if len(objs) == 0 {
		// The empty list has a null items field; let the serializer say so.
		list := &metav1.PartialObjectMetadataList{ListMeta: listMeta}
		list.SetGroupVersionKind(MetadataListGVK)
		b, err := e.EncodeJSON(list)
		if err != nil {
			return nil, err
		}
		return &Body{parts: [][]byte{b, newline}}, nil
	}
	head := []byte(`{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":` +
		strconv.Quote(listMeta.ResourceVersion) + `},"items":[`)
	return jsonList(head, objs, func(o *Object) (open, rest []byte, err error) {
		rest, err = e.metadataJSON(o)
		return nil, rest, err
	})
}
