package rewriting

import (
	"encoding/json"
	"fmt"
	"mime"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsv1beta1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1beta1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
)

// client-go's typed clients send built-in objects (and DeleteOptions) in
// protobuf when so configured: the generated clientsets of some groups
// do by default. The rewriter reads JSON only, so such a body of a
// selected caller is decoded with the built-in types and sent on as JSON,
// which kube-apiserver takes as well. Custom resources have no protobuf
// form, so nothing of a renamed group is lost.

var protobufBodies = newProtobufDecoder()

func newProtobufDecoder() runtime.Decoder {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, apiextensionsv1.AddToScheme, apiextensionsv1beta1.AddToScheme} {
		if err := add(s); err != nil {
			panic(fmt.Sprintf("building the protobuf scheme: %v", err))
		}
	}
	return protobuf.NewSerializer(s, s)
}

// isProtobuf says whether a Content-Type is Kubernetes' protobuf.
func isProtobuf(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && mt == runtime.ContentTypeProtobuf
}

// Bounds of the protobuf bodies the filter decodes. The generated
// decoders have no depth limit (a CRD's schema nests itself), and a field
// of two bytes can stand for a large empty struct: bodies are scanned
// first, and refused past these.
const (
	maxProtobufDepth  = 100
	maxProtobufFields = 20000
	// protobufFieldCost is what the budget counts per field walked: an
	// empty element of two bytes decodes to a struct of a kilobyte or
	// more, then to JSON.
	protobufFieldCost = 2 << 10
)

// protobufFields walks a protobuf body and returns the fields it holds,
// or an error past the bounds.
func protobufFields(body []byte) (int, error) {
	work := maxProtobufFields
	if !withinBounds(body, 0, &work) {
		return 0, fmt.Errorf("nested deeper than %d or with more than %d fields", maxProtobufDepth, maxProtobufFields)
	}
	return maxProtobufFields - work, nil
}

// protobufToJSON decodes a protobuf body of a built-in type, which
// protobufFields has let through, and encodes it as JSON, apiVersion and
// kind included.
func protobufToJSON(body []byte) ([]byte, error) {
	obj, gvk, err := protobufBodies.Decode(body, nil, nil)
	if err != nil {
		return nil, err
	}
	obj.GetObjectKind().SetGroupVersionKind(*gvk)
	return json.Marshal(obj)
}

// withinBounds walks protobuf wire data, reading every length-delimited
// field that parses as a message as one, and says whether it stays within
// maxProtobufDepth levels and the fields left in work (which every field
// read, at any level, spends). Strings that happen to parse as messages,
// even in part, only make the walk stricter. The Kubernetes envelope's four magic bytes
// are skipped.
func withinBounds(b []byte, depth int, work *int) bool {
	if depth == 0 && len(b) >= 4 && string(b[:4]) == "k8s\x00" {
		b = b[4:]
	}
	ok, _ := walk(b, depth, work)
	return ok
}

// walk reads b as a message the way the generated decoders read one: it
// returns whether the walk stayed within bounds, and whether b parsed as
// a message at all. Every field read spends work, also in reads that turn
// out not to be messages, so the walk's time is bounded too. Groups (wire
// types 3 and 4), which the decoders skip as unknown fields, are skipped
// as they skip them, so that no level can hide behind one.
func walk(b []byte, depth int, work *int) (within, message bool) {
	if depth > maxProtobufDepth {
		return false, true
	}
	for len(b) > 0 {
		*work--
		if *work < 0 {
			return false, true
		}
		tag, n := varint(b)
		if n == 0 || tag>>3 == 0 {
			return true, false
		}
		b = b[n:]
		switch tag & 7 {
		case 3:
			rest, ok := skipGroup(b, work)
			if !ok {
				if *work < 0 {
					return false, true
				}
				return true, false
			}
			b = rest
		case 2:
			l, n := varint(b)
			if n == 0 || l > uint64(len(b)-n) {
				return true, false
			}
			inner := b[n : n+int(l)]
			b = b[n+int(l):]
			if len(inner) == 0 {
				continue
			}
			if within, message := walk(inner, depth+1, work); message && !within {
				return false, true
			}
		default:
			rest, ok := skipScalar(b, tag&7)
			if !ok {
				return true, false
			}
			b = rest
		}
	}
	return true, true
}

// skipScalar skips the value of a varint (0), fixed64 (1) or fixed32 (5)
// field; other wire types are not scalars.
func skipScalar(b []byte, wire uint64) ([]byte, bool) {
	switch wire {
	case 0:
		_, n := varint(b)
		if n == 0 {
			return nil, false
		}
		return b[n:], true
	case 1:
		if len(b) < 8 {
			return nil, false
		}
		return b[8:], true
	case 5:
		if len(b) < 4 {
			return nil, false
		}
		return b[4:], true
	}
	return nil, false
}

// skipGroup skips a group's fields up to its end, nested groups
// included, as the decoders skip an unknown group; every field spends
// work.
func skipGroup(b []byte, work *int) ([]byte, bool) {
	depth := 0
	for len(b) > 0 {
		*work--
		if *work < 0 {
			return nil, false
		}
		tag, n := varint(b)
		if n == 0 || tag>>3 == 0 {
			return nil, false
		}
		b = b[n:]
		switch tag & 7 {
		case 3:
			depth++
		case 4:
			if depth == 0 {
				return b, true
			}
			depth--
		case 2:
			l, n := varint(b)
			if n == 0 || l > uint64(len(b)-n) {
				return nil, false
			}
			b = b[n+int(l):]
		default:
			rest, ok := skipScalar(b, tag&7)
			if !ok {
				return nil, false
			}
			b = rest
		}
	}
	return nil, false
}

// varint reads a base-128 varint as the generated decoders do: up to ten
// bytes, the bits past 64 dropped. n is 0 when b holds none.
func varint(b []byte) (v uint64, n int) {
	for i := 0; i < 10 && i < len(b); i++ {
		v |= uint64(b[i]&0x7f) << (7 * uint(i))
		if b[i] < 0x80 {
			return v, i + 1
		}
	}
	return 0, 0
}
