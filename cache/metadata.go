package cache

import (
	"strconv"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// The meta.k8s.io/v1 kinds of metadata-only answers.
var (
	metadataGVK     = metav1.SchemeGroupVersion.WithKind("PartialObjectMetadata")
	metadataListGVK = metav1.SchemeGroupVersion.WithKind("PartialObjectMetadataList")
)

// asPartialObjectMetadata returns obj's metadata as kube-apiserver's
// transformation returns it for Accept as=PartialObjectMetadata.
func asPartialObjectMetadata(obj runtime.Object) (*metav1.PartialObjectMetadata, error) {
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil, err
	}
	p := meta.AsPartialObjectMetadata(m)
	p.SetGroupVersionKind(metadataGVK)
	return p, nil
}

// metadataJSON is o as a PartialObjectMetadata in JSON, cached on o.
func (e *encoder) metadataJSON(o *Object) ([]byte, error) {
	return o.Encoded(EncodingMetadataJSON, func(obj runtime.Object) ([]byte, error) {
		p, err := asPartialObjectMetadata(obj)
		if err != nil {
			return nil, err
		}
		return e.encodeJSON(p)
	})
}

// metadataProtobuf is o's PartialObjectMetadata protobuf message, cached
// on o.
func (e *encoder) metadataProtobuf(o *Object) ([]byte, error) {
	return o.Encoded(EncodingMetadataProtobuf, func(obj runtime.Object) ([]byte, error) {
		p, err := asPartialObjectMetadata(obj)
		if err != nil {
			return nil, err
		}
		return p.Marshal()
	})
}

// metadataObject returns the body of a metadata-only get of o, or o's
// embedded form in a metadata-only watch event (without the JSON newline).
func (e *encoder) metadataObject(m mediaType, o *Object) (*body, error) {
	if m == mediaProtobuf {
		raw, err := e.metadataProtobuf(o)
		if err != nil {
			return nil, err
		}
		return envelope(metadataGVK.GroupVersion().String(), metadataGVK.Kind, &body{parts: [][]byte{raw}}), nil
	}
	b, err := e.metadataJSON(o)
	if err != nil {
		return nil, err
	}
	return &body{parts: [][]byte{b}}, nil
}

// metadataList returns the body of a metadata-only list of objs at rv: a
// PartialObjectMetadataList whose items carry their kind and apiVersion,
// as kube-apiserver writes it.
func (e *encoder) metadataList(m mediaType, objs []*Object, rv uint64) (*body, error) {
	listMeta := metav1.ListMeta{ResourceVersion: strconv.FormatUint(rv, 10)}
	if m == mediaProtobuf {
		return protobufList(metadataListGVK.GroupVersion().String(), metadataListGVK.Kind, listMeta, objs, e.metadataProtobuf)
	}
	if len(objs) == 0 {
		// The empty list has a null items field; let the serializer say so.
		list := &metav1.PartialObjectMetadataList{ListMeta: listMeta}
		list.SetGroupVersionKind(metadataListGVK)
		b, err := e.encodeJSON(list)
		if err != nil {
			return nil, err
		}
		return &body{parts: [][]byte{b, newline}}, nil
	}
	head := []byte(`{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":` +
		strconv.Quote(listMeta.ResourceVersion) + `},"items":[`)
	return jsonList(head, objs, func(o *Object) (open, rest []byte, err error) {
		rest, err = e.metadataJSON(o)
		return nil, rest, err
	})
}
