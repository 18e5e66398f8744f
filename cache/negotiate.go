package cache

import (
	"mime"
	"net/http"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1beta1 "k8s.io/apimachinery/pkg/apis/meta/v1beta1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/endpoints/handlers/negotiation"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/kube-apicache/kube-apicache/cache/store"
)

// Content negotiation: which encoding and shape a cached answer takes, as
// kube-apiserver would choose them, or why the request is forwarded.

// transform is the shape a response's objects take, as requested with the
// Accept header's as=, g= and v= parameters.
type transform int

const (
	// asObject: the objects themselves.
	asObject transform = iota
	// asMetadata: PartialObjectMetadata (a get or watch) or
	// PartialObjectMetadataList (a list), meta.k8s.io/v1.
	asMetadata
	// asTable: a meta.k8s.io/v1 Table (custom resources only).
	asTable
)

// Reasons a transformed request is forwarded.
const (
	reasonTableBuiltin = "table-builtin"
	reasonTransform    = "transform"
)

// transformMediaTypes are the media types kube-apiserver offers once a
// client asks for a transformation: JSON, YAML and protobuf for every
// resource, custom resources included (YAML is listed so a client that
// prefers it is forwarded, not answered in another type).
var transformMediaTypes = func() []runtime.SerializerInfo {
	var out []runtime.SerializerInfo
	for _, info := range scheme.Codecs.SupportedMediaTypes() {
		switch info.MediaType {
		case runtime.ContentTypeJSON, runtime.ContentTypeYAML, runtime.ContentTypeProtobuf:
			out = append(out, info)
		}
	}
	return out
}()

// restrictions are kube-apiserver's endpoint restrictions for resource
// handlers (RequestScope): without a transformation a custom resource is
// served as JSON or YAML only; Table is JSON or YAML; PartialObjectMetadata
// and its list any media type; the meta.k8s.io versions are v1 and v1beta1.
type restrictions struct{ builtin bool }

func (e restrictions) AllowsMediaTypeTransform(mimeType, mimeSubType string, target *schema.GroupVersionKind) bool {
	if target == nil {
		return e.builtin || (mimeType == "application" && (mimeSubType == "json" || mimeSubType == "yaml"))
	}
	if target.GroupVersion() != metav1.SchemeGroupVersion && target.GroupVersion() != metav1beta1.SchemeGroupVersion {
		return false
	}
	switch target.Kind {
	case "Table":
		return mimeType == "application" && (mimeSubType == "json" || mimeSubType == "yaml")
	case "PartialObjectMetadata", "PartialObjectMetadataList":
		return true
	}
	return false
}

func (restrictions) AllowsServerVersion(version string) bool { return version == "v1" }
func (restrictions) AllowsStreamSchema(s string) bool        { return s == "watch" }

// negotiateShape negotiates the response's encoding and shape from the
// request, once, as kube-apiserver would: the Accept header (one, every
// media range one answerableAccept allows), the request's pretty
// printing (which the cache never writes: kube-apiserver indents JSON
// for ?pretty and for curl, Wget and browsers), then a plain Accept
// header as negotiateMedia does or one asking for a transformation as
// negotiateTransform does. It returns the wire encoding and shape the
// cache will write, or the reason to forward. The plan carries the
// result; nothing after classification negotiates again.
func negotiateShape(r *http.Request, builtin bool, verb string) (store.MediaType, transform, string) {
	accept := r.Header.Get("Accept")
	transformed := strings.Contains(accept, "as=")
	if len(r.Header.Values("Accept")) > 1 || !answerableAccept(accept, transformed) {
		return 0, 0, reasonMediaType
	}
	if strings.Contains(accept, "pretty") {
		return 0, 0, reasonMediaType
	}
	if strings.Contains(r.URL.RawQuery, "pretty") {
		return 0, 0, reasonPretty
	}
	if ua := r.UserAgent(); strings.HasPrefix(ua, "curl") || strings.HasPrefix(ua, "Wget") || strings.HasPrefix(ua, "Mozilla/5.0") {
		// kube-apiserver indents JSON for these clients.
		return 0, 0, reasonPretty
	}
	if !transformed {
		m, reason := negotiateMedia(accept, builtin)
		return m, asObject, reason
	}
	return negotiateTransform(accept, builtin, verb)
}

// negotiateMedia picks the encoding of an answer without a
// transformation as kube-apiserver would, from an Accept header
// negotiateShape has checked, and forwards the types the cache does not
// write itself (YAML, unknown types).
func negotiateMedia(accept string, builtin bool) (store.MediaType, string) {
	supported := customMediaTypes
	if builtin {
		supported = builtinMediaTypes
	}
	opts, ok := negotiation.NegotiateMediaTypeOptions(accept, supported, negotiation.DefaultEndpointRestrictions)
	if !ok {
		return 0, reasonMediaType
	}
	switch opts.Accepted.MediaType {
	case runtime.ContentTypeJSON:
		return store.MediaJSON, ""
	case runtime.ContentTypeProtobuf:
		return store.MediaProtobuf, ""
	}
	return 0, reasonMediaType
}

// negotiateTransform negotiates an Accept header that asks for a
// transformation (as=...), which negotiateShape has checked, as
// kube-apiserver does, and returns the wire encoding and shape the cache
// will write, or the reason to forward. Only the meta.k8s.io/v1 forms the
// cache builds exactly as kube-apiserver does are answered:
// PartialObjectMetadata for get and watch, PartialObjectMetadataList for
// list, and Table for custom resources (get and list) in JSON. Everything
// else, including the v1beta1 forms and the mismatched ones kube-apiserver
// rejects, is forwarded.
func negotiateTransform(accept string, builtin bool, verb string) (store.MediaType, transform, string) {
	opts, ok := negotiation.NegotiateMediaTypeOptions(accept, transformMediaTypes, restrictions{builtin: builtin})
	if !ok || opts.Pretty || len(opts.Unrecognized) > 0 || opts.UseServerVersion != "" {
		return 0, 0, reasonMediaType
	}
	var media store.MediaType
	switch opts.Accepted.MediaType {
	case runtime.ContentTypeJSON:
		media = store.MediaJSON
	case runtime.ContentTypeProtobuf:
		media = store.MediaProtobuf
	default:
		return 0, 0, reasonMediaType
	}
	target := opts.Convert
	if target == nil {
		if !builtin && media != store.MediaJSON {
			return 0, 0, reasonMediaType
		}
		return media, asObject, ""
	}
	if target.GroupVersion() != metav1.SchemeGroupVersion {
		return 0, 0, reasonTransform
	}
	switch {
	case target.Kind == "PartialObjectMetadata" && (verb == "get" || verb == "watch"),
		target.Kind == "PartialObjectMetadataList" && verb == "list":
		return media, asMetadata, ""
	case target.Kind == "Table" && (verb == "get" || verb == "list"):
		if builtin {
			// kube-apiserver's printers for built-in types are not a
			// library the cache can use; a NAME/AGE table would be wrong.
			return 0, 0, reasonTableBuiltin
		}
		if media != store.MediaJSON {
			return 0, 0, reasonMediaType
		}
		return media, asTable, ""
	}
	return 0, 0, reasonTransform
}

// The media types kube-apiserver offers for built-in and for custom
// resources (YAML is offered so that a client preferring it is forwarded
// rather than answered in another type).
var builtinMediaTypes, customMediaTypes = func() ([]runtime.SerializerInfo, []runtime.SerializerInfo) {
	var builtin, custom []runtime.SerializerInfo
	for _, info := range scheme.Codecs.SupportedMediaTypes() {
		switch info.MediaType {
		case runtime.ContentTypeJSON, runtime.ContentTypeYAML:
			builtin = append(builtin, info)
			custom = append(custom, info)
		case runtime.ContentTypeProtobuf:
			builtin = append(builtin, info)
		}
	}
	return builtin, custom
}()

// answerableAccept reports whether every media range in accept is one the
// cache negotiates exactly as kube-apiserver does: application/json,
// application/vnd.kubernetes.protobuf or */*, written in lower case, with
// no parameter but q (and as, g and v when the client asks for a
// transformation). kube-apiserver's answer to anything else depends on
// details of its negotiation the cache does not reproduce (it refuses
// application/*, for one) or on parameters of newer API versions (such as
// drop=), so those requests are forwarded, never answered. No Accept
// header at all is JSON.
func answerableAccept(accept string, transform bool) bool {
	if accept == "" {
		return true
	}
	for _, clause := range strings.Split(accept, ",") {
		mt, params, err := mime.ParseMediaType(clause)
		if err != nil {
			return false
		}
		if raw, _, _ := strings.Cut(clause, ";"); strings.TrimSpace(raw) != mt {
			return false
		}
		switch mt {
		case runtime.ContentTypeJSON, runtime.ContentTypeProtobuf, "*/*":
		default:
			return false
		}
		for k := range params {
			switch {
			case k == "q":
			case transform && (k == "as" || k == "g" || k == "v"):
			default:
				return false
			}
		}
	}
	return true
}
