package rewrite

import (
	"encoding/base64"
)

// admissionReview rewrites an AdmissionReview (admission.k8s.io v1 and
// v1beta1), for the webhook path: the request's kind, resource,
// requestKind, requestResource, object and oldObject (subResource and
// options are left alone), and the response's patch (base64 JSON patch,
// of the request's kind when the review carries the request), warnings
// and status.
func (r *Rewriter) admissionReview(obj map[string]any) {
	// The patch patches the request's object: its kind is the patch's
	// target, when the review carries the request.
	var target Target
	if req, ok := obj["request"].(map[string]any); ok {
		if k, ok := req["kind"].(map[string]any); ok {
			target.Group, _ = k["group"].(string)
			target.Kind, _ = k["kind"].(string)
		}
		target.Name, _ = req["name"].(string)
	}
	if req, ok := obj["request"].(map[string]any); ok {
		r.groupVersionKind(req["kind"], "")
		r.groupVersionKind(req["requestKind"], "")
		r.groupVersionResource(req["resource"])
		r.groupVersionResource(req["requestResource"])
		for _, f := range []string{"object", "oldObject"} {
			if o, ok := req[f].(map[string]any); ok {
				r.object(o, Target{})
			}
		}
	}
	if resp, ok := obj["response"].(map[string]any); ok {
		swapString(resp, "patch", func(p string) string { return r.base64JSONPatch(p, target) })
		swapStrings(resp["warnings"], r.Text)
		if st, ok := resp["status"].(map[string]any); ok {
			r.status(st)
		}
	}
}

// base64JSONPatch rewrites a base64-encoded JSON patch; the patch comes
// back as canonical JSON. What is not base64 JSON patch is left alone.
func (r *Rewriter) base64JSONPatch(s string, target Target) string {
	raw, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return s
	}
	out, err := r.JSONPatchJSON(raw, target)
	if err != nil {
		return s
	}
	return base64.StdEncoding.EncodeToString(out)
}

// conversionReview rewrites a ConversionReview (apiextensions.k8s.io v1
// and v1beta1): the desired apiVersion, the objects to convert, the
// converted objects and the result.
func (r *Rewriter) conversionReview(obj map[string]any) {
	if req, ok := obj["request"].(map[string]any); ok {
		swapString(req, "desiredAPIVersion", r.APIVersion)
		for _, o := range maps(req["objects"]) {
			r.object(o, Target{})
		}
	}
	if resp, ok := obj["response"].(map[string]any); ok {
		for _, o := range maps(resp["convertedObjects"]) {
			r.object(o, Target{})
		}
		if st, ok := resp["result"].(map[string]any); ok {
			r.status(st)
		}
	}
}
