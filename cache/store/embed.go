package store

import (
	"encoding/binary"

	"google.golang.org/protobuf/encoding/protowire"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// EventEncoder embeds objects in the watch events of one media type and
// shape, as kube-apiserver's watch does: an object's JSON with kind and
// apiVersion, or its protobuf message in kube-apiserver's envelope; as the
// object itself or as its PartialObjectMetadata. A watch takes its
// EventEncoder once, with the media type and shape it negotiated (see
// Encoder.EventEncoder); each event then reuses the object's cached form
// and, in protobuf, an envelope head made once.
//
// An EventEncoder is immutable and safe for concurrent use.
type EventEncoder struct {
	media    MediaType
	metadata bool
	// form is the object's cached form that events embed, made by encode.
	form   Encoding
	encode func(runtime.Object) ([]byte, error)
	// envelopeHead is the protobuf envelope up to the embedded message's
	// length (envelopeHead); nil for JSON, which embeds the form as it is.
	envelopeHead []byte
	// enc writes the objects a watch makes itself (bookmarks, statuses).
	enc *Encoder
}

// newEventEncoders returns e's EventEncoders, indexed by media type and
// whether they embed metadata only.
func newEventEncoders(e *Encoder) [2][2]*EventEncoder {
	var out [2][2]*EventEncoder
	for _, m := range []MediaType{MediaJSON, MediaProtobuf} {
		for _, metadata := range []bool{false, true} {
			ee := &EventEncoder{media: m, metadata: metadata, enc: e}
			switch {
			case metadata && m == MediaProtobuf:
				ee.form, ee.encode = EncodingMetadataProtobuf, encodeMetadataProtobuf
				ee.envelopeHead = envelopeHead(MetadataGVK.GroupVersion().String(), MetadataGVK.Kind)
			case metadata:
				ee.form, ee.encode = EncodingMetadataJSON, e.encodeMetadataJSON
			case m == MediaProtobuf:
				ee.form, ee.encode = EncodingProtobuf, EncodeProtobuf
				ee.envelopeHead = envelopeHead(e.gvk.GroupVersion().String(), e.gvk.Kind)
			default:
				ee.form, ee.encode = EncodingJSON, e.EncodeJSON
			}
			out[m][b2i(metadata)] = ee
		}
	}
	return out
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// EventEncoder returns the EventEncoder of m, for objects as they are or
// (metadata) as their PartialObjectMetadata.
func (e *Encoder) EventEncoder(m MediaType, metadata bool) *EventEncoder {
	return e.events[m][b2i(metadata)]
}

// MediaType is the media type ee encodes in.
func (ee *EventEncoder) MediaType() MediaType { return ee.media }

// Prepare makes o's form that Object embeds, and keeps it with o.
func (ee *EventEncoder) Prepare(o *Object) error {
	_, err := o.Encoded(ee.form, ee.encode)
	return err
}

// Object is o as a watch event embeds it. In JSON it is o's cached form,
// which must not be modified; in protobuf a new slice holding the
// envelope around it.
func (ee *EventEncoder) Object(o *Object) ([]byte, error) {
	raw, err := o.Encoded(ee.form, ee.encode)
	if err != nil || ee.envelopeHead == nil {
		return raw, err
	}
	out := make([]byte, 0, len(ee.envelopeHead)+binary.MaxVarintLen64+len(raw)+len(envelopeTail))
	out = append(out, ee.envelopeHead...)
	out = protowire.AppendVarint(out, uint64(len(raw)))
	out = append(out, raw...)
	return append(out, envelopeTail...), nil
}

// Bookmark is obj, a bookmark's object of the watched kind, as the
// watch's events embed it: as its PartialObjectMetadata for a
// metadata-only watch.
func (ee *EventEncoder) Bookmark(obj runtime.Object) ([]byte, error) {
	if ee.metadata {
		pm, err := AsPartialObjectMetadata(obj)
		if err != nil {
			return nil, err
		}
		obj = pm
	}
	return Embed(ee.media, obj, ee.enc)
}

// Status is st as an ERROR event of the watch embeds it.
func (ee *EventEncoder) Status(st *metav1.Status) ([]byte, error) {
	return Embed(ee.media, st, ee.enc)
}
