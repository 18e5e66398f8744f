package main

import (
	"encoding/json"
	"fmt"
	"net/http"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utiljson "k8s.io/apimachinery/pkg/util/json"
)

// handleConvert is the conversion webhook of widgets.
func handleConvert(w http.ResponseWriter, r *http.Request) {
	var review apiextensionsv1.ConversionReview
	if err := decodeReview(w, r, &review); err != nil {
		sayf("CONVERSION-ERROR %v", err)
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if review.Request == nil {
		say("CONVERSION-ERROR the review has no request")
		http.Error(w, "the review has no request", http.StatusBadRequest)
		return
	}
	writeReview(w, apiextensionsv1.ConversionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: apiextensionsv1.SchemeGroupVersion.String(), Kind: "ConversionReview"},
		Response: convertRequest(review.Request),
	})
}

// convertRequest converts the objects of a conversion request and prints
//
//	CONVERSION <desiredAPIVersion> <apiVersion/kind of each object, comma-separated, or ->
//
// and, when it fails, `CONVERSION-FAILED <message>`.
func convertRequest(req *apiextensionsv1.ConversionRequest) *apiextensionsv1.ConversionResponse {
	objs := make([]map[string]any, len(req.Objects))
	var seen []string
	var parseErr error
	for i, raw := range req.Objects {
		obj := map[string]any{}
		if err := utiljson.Unmarshal(raw.Raw, &obj); err != nil && parseErr == nil {
			parseErr = fmt.Errorf("decoding object %d: %w", i, err)
		}
		objs[i] = obj
		apiVersion, _ := obj["apiVersion"].(string)
		k, _ := obj["kind"].(string)
		seen = append(seen, apiVersion+"/"+k)
	}
	lines := []string{fmt.Sprintf("CONVERSION %s %s", req.DesiredAPIVersion, joinOrDash(seen))}

	resp := &apiextensionsv1.ConversionResponse{UID: req.UID}
	converted, err := convertObjects(req.DesiredAPIVersion, objs)
	if err == nil {
		err = parseErr
	}
	if err != nil {
		resp.Result = metav1.Status{Status: metav1.StatusFailure, Message: err.Error()}
		lines = append(lines, "CONVERSION-FAILED "+err.Error())
	} else {
		resp.ConvertedObjects = converted
		resp.Result = metav1.Status{Status: metav1.StatusSuccess}
	}
	say(lines...)
	return resp
}

// convertObjects converts widgets to desiredAPIVersion. It refuses any
// group but example.com, any kind but Widget and any version but v1 and
// v2, with an error that starts with "unexpected".
func convertObjects(desiredAPIVersion string, objs []map[string]any) ([]runtime.RawExtension, error) {
	to, err := schema.ParseGroupVersion(desiredAPIVersion)
	if err != nil || to.Group != group || !knownVersion(to.Version) {
		return nil, fmt.Errorf("unexpected desired API version %q", desiredAPIVersion)
	}
	out := make([]runtime.RawExtension, 0, len(objs))
	for _, obj := range objs {
		apiVersion, _ := obj["apiVersion"].(string)
		k, _ := obj["kind"].(string)
		from, err := schema.ParseGroupVersion(apiVersion)
		if err != nil || from.Group != group || k != kind || !knownVersion(from.Version) {
			return nil, fmt.Errorf("unexpected object of apiVersion %q and kind %q", apiVersion, k)
		}
		convertWidget(obj, from.Version, to.Version)
		obj["apiVersion"] = to.String()
		b, err := json.Marshal(obj)
		if err != nil {
			return nil, fmt.Errorf("encoding a converted widget: %w", err)
		}
		out = append(out, runtime.RawExtension{Raw: b})
	}
	return out, nil
}

// knownVersion says whether v is a version of widgets.
func knownVersion(v string) bool {
	return v == "v1" || v == "v2"
}

// convertWidget moves the size of a widget's spec between spec.size (v1)
// and spec.dimensions.size (v2), in place; metadata, status and the other
// spec fields stay as they are.
func convertWidget(obj map[string]any, from, to string) {
	spec, ok := obj["spec"].(map[string]any)
	if !ok || from == to {
		return
	}
	switch {
	case from == "v1" && to == "v2":
		if size, ok := spec["size"]; ok {
			delete(spec, "size")
			spec["dimensions"] = map[string]any{"size": size}
		}
	case from == "v2" && to == "v1":
		if dims, ok := spec["dimensions"].(map[string]any); ok {
			if size, ok := dims["size"]; ok {
				spec["size"] = size
			}
		}
		delete(spec, "dimensions")
	}
}
