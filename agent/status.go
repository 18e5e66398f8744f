package agent

import (
	"net/http"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/endpoints/handlers/responsewriters"
	"k8s.io/client-go/kubernetes/scheme"
)

// writeStatus answers with err as a metav1.Status, encoded in whatever the
// client negotiated (JSON, YAML or protobuf), as kube-apiserver does.
func writeStatus(w http.ResponseWriter, r *http.Request, err error) {
	responsewriters.ErrorNegotiated(err, scheme.Codecs.WithoutConversion(), schema.GroupVersion{Version: "v1"}, w, r)
}
