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

// protobufToJSON decodes a protobuf body of a built-in type and encodes
// it as JSON, apiVersion and kind included.
func protobufToJSON(body []byte) ([]byte, error) {
	obj, gvk, err := protobufBodies.Decode(body, nil, nil)
	if err != nil {
		return nil, err
	}
	obj.GetObjectKind().SetGroupVersionKind(*gvk)
	return json.Marshal(obj)
}
