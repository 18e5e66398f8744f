package main

import (
	"fmt"
	"net/http"
	"slices"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
)

// handleValidate is the validating admission webhook of widgets.
func handleValidate(w http.ResponseWriter, r *http.Request) {
	var review admissionv1.AdmissionReview
	if err := decodeReview(w, r, &review); err != nil {
		sayf("ADMISSION-ERROR %v", err)
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if review.Request == nil {
		say("ADMISSION-ERROR the review has no request")
		http.Error(w, "the review has no request", http.StatusBadRequest)
		return
	}
	writeReview(w, admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: admissionv1.SchemeGroupVersion.String(), Kind: "AdmissionReview"},
		Response: admit(review.Request),
	})
}

// admit decides on one admission request and prints it:
//
//	ADMISSION <operation> <group>/<version> <kind> <resource> <namespace>/<name>
//	ADMISSION-LABELS <sorted label keys, comma-separated, or ->
//	ADMISSION-FINALIZERS <finalizers, comma-separated, or ->
//	ADMISSION-RESULT allowed | ADMISSION-RESULT denied: <message>
//
// It denies any kind other than example.com Widget, and a negative size.
func admit(req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	obj := map[string]any{}
	var parseErr error
	if len(req.Object.Raw) > 0 {
		if err := utiljson.Unmarshal(req.Object.Raw, &obj); err != nil {
			parseErr = fmt.Errorf("decoding the object: %w", err)
		}
	}
	u := &unstructured.Unstructured{Object: obj}
	name := req.Name
	if name == "" {
		name = u.GetName()
	}
	if name == "" {
		name = u.GetGenerateName()
	}
	lines := []string{
		fmt.Sprintf("ADMISSION %s %s/%s %s %s %s/%s", req.Operation, req.Kind.Group, req.Kind.Version, req.Kind.Kind, req.Resource.Resource, req.Namespace, name),
		"ADMISSION-LABELS " + joinOrDash(sortedKeys(u.GetLabels())),
		"ADMISSION-FINALIZERS " + joinOrDash(u.GetFinalizers()),
	}

	var denial string
	switch {
	case req.Kind.Group != group || req.Kind.Kind != kind:
		denial = fmt.Sprintf("unexpected kind %s/%s", req.Kind.Group, req.Kind.Kind)
	case parseErr != nil:
		denial = parseErr.Error()
	default:
		path := []string{"spec", "size"}
		if req.Kind.Version == "v2" {
			path = []string{"spec", "dimensions", "size"}
		}
		if size, found, _ := unstructured.NestedInt64(obj, path...); found && size < 0 {
			denial = fmt.Sprintf("%s %s: %s", req.Kind.Kind, name, denialText)
		}
	}

	resp := &admissionv1.AdmissionResponse{UID: req.UID}
	if denial != "" {
		resp.Result = &metav1.Status{
			Status:  metav1.StatusFailure,
			Code:    http.StatusForbidden,
			Reason:  metav1.StatusReasonForbidden,
			Message: denial,
		}
		lines = append(lines, "ADMISSION-RESULT denied: "+denial)
	} else {
		resp.Allowed = true
		resp.Warnings = []string{fmt.Sprintf("widget %s looks fine", name)}
		lines = append(lines, "ADMISSION-RESULT allowed")
	}
	say(lines...)
	return resp
}

// sortedKeys returns the keys of m in order.
func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// joinOrDash joins s with commas, or returns "-" when s is empty.
func joinOrDash(s []string) string {
	if len(s) == 0 {
		return "-"
	}
	return strings.Join(s, ",")
}
