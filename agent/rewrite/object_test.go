package rewrite

import "testing"

// objectCases are the object shapes, original and renamed. Each is
// checked both ways (checkSwap) and seeds the fuzz tests.
var objectCases = []struct {
	name, in, want string
}{
	{
		// A custom resource: apiVersion, kind, metadata keys, owner and
		// finalizers; a label of another domain stays.
		name: "custom resource",
		in: `{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w","namespace":"ns",
			"labels":{"example.com/role":"a","app":"w","app.kubernetes.io/name":"w"},
			"annotations":{"example.com/note":"n","kubectl.kubernetes.io/last-applied-configuration":"{}"},
			"finalizers":["example.com/cleanup","foregroundDeletion"],
			"ownerReferences":[{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","name":"vm","uid":"1"},{"apiVersion":"apps/v1","kind":"ReplicaSet","name":"rs","uid":"2"}]},
			"spec":{"size":3.50}}`,
		want: `{"apiVersion":"renamed.example.io/v1","kind":"RenamedWidget","metadata":{"name":"w","namespace":"ns",
			"labels":{"renamed.example.io/role":"a","unprefixed.renamed.example.net/app":"w","app.kubernetes.io/name":"w"},
			"annotations":{"renamed.example.io/note":"n","kubectl.kubernetes.io/last-applied-configuration":"{}"},
			"finalizers":["renamed.example.io/cleanup","foregroundDeletion"],
			"ownerReferences":[{"apiVersion":"x.virtualization.example.io/v1","kind":"RenamedVirtualMachine","name":"vm","uid":"1"},{"apiVersion":"apps/v1","kind":"ReplicaSet","name":"rs","uid":"2"}]},
			"spec":{"size":3.50}}`,
	},
	{
		// A Pod of another group, owned by a renamed kind: only the
		// reference and the keys change.
		name: "pod owned by a renamed kind",
		in:   `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","labels":{"kubevirt.io":"x"},"ownerReferences":[{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineInstance","name":"vmi","uid":"u","controller":true}]}}`,
		want: `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","labels":{"unprefixed.renamed.example.net/kubevirt.io":"x"},"ownerReferences":[{"apiVersion":"x.virtualization.example.io/v1","kind":"RenamedVirtualMachineInstance","name":"vmi","uid":"u","controller":true}]}}`,
	},
	{
		name: "managedFields",
		in: `{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w","managedFields":[{"manager":"m","operation":"Apply","apiVersion":"example.com/v1","fieldsType":"FieldsV1",
			"fieldsV1":{"f:metadata":{"f:labels":{".":{},"f:example.com/role":{},"f:app":{}},"f:annotations":{"f:example.com/note":{}},"f:finalizers":{".":{},"v:\"example.com/cleanup\"":{}},"f:ownerReferences":{"k:{\"uid\":\"1\"}":{}}},
			"f:spec":{"f:selector":{"f:matchLabels":{"f:example.com/role":{}}}}}}]}}`,
		want: `{"apiVersion":"renamed.example.io/v1","kind":"RenamedWidget","metadata":{"name":"w","managedFields":[{"manager":"m","operation":"Apply","apiVersion":"renamed.example.io/v1","fieldsType":"FieldsV1",
			"fieldsV1":{"f:metadata":{"f:labels":{".":{},"f:renamed.example.io/role":{},"f:unprefixed.renamed.example.net/app":{}},"f:annotations":{"f:renamed.example.io/note":{}},"f:finalizers":{".":{},"v:\"renamed.example.io/cleanup\"":{}},"f:ownerReferences":{"k:{\"uid\":\"1\"}":{}}},
			"f:spec":{"f:selector":{"f:matchLabels":{"f:renamed.example.io/role":{}}}}}}]}}`,
	},
	{
		name: "list of custom resources",
		in:   `{"apiVersion":"example.com/v1","kind":"WidgetList","metadata":{"resourceVersion":"7"},"items":[{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"a","labels":{"example.com/x":""}}}]}`,
		want: `{"apiVersion":"renamed.example.io/v1","kind":"RenamedWidgetList","metadata":{"resourceVersion":"7"},"items":[{"apiVersion":"renamed.example.io/v1","kind":"RenamedWidget","metadata":{"name":"a","labels":{"renamed.example.io/x":""}}}]}`,
	},
	{
		// Items of a built-in list carry no apiVersion or kind: the list's
		// kind tells them apart (here, Roles).
		name: "list of roles",
		in:   `{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"RoleList","items":[{"metadata":{"name":"r"},"rules":[{"apiGroups":["example.com"],"resources":["widgets"],"verbs":["get"]}]}]}`,
		want: `{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"RoleList","items":[{"metadata":{"name":"r"},"rules":[{"apiGroups":["renamed.example.io"],"resources":["renamedwidgets"],"verbs":["get"]}]}]}`,
	},
	{
		name: "table",
		in:   `{"apiVersion":"meta.k8s.io/v1","kind":"Table","columnDefinitions":[{"name":"Name","type":"string"}],"rows":[{"cells":["w"],"object":{"apiVersion":"meta.k8s.io/v1","kind":"PartialObjectMetadata","metadata":{"name":"w","labels":{"example.com/a":"b"}}}},{"cells":["v"],"object":{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"v"}}}]}`,
		want: `{"apiVersion":"meta.k8s.io/v1","kind":"Table","columnDefinitions":[{"name":"Name","type":"string"}],"rows":[{"cells":["w"],"object":{"apiVersion":"meta.k8s.io/v1","kind":"PartialObjectMetadata","metadata":{"name":"w","labels":{"renamed.example.io/a":"b"}}}},{"cells":["v"],"object":{"apiVersion":"renamed.example.io/v1","kind":"RenamedWidget","metadata":{"name":"v"}}}]}`,
	},
	{
		name: "status not found",
		in:   `{"apiVersion":"v1","kind":"Status","status":"Failure","message":"widgets.example.com \"x\" not found","reason":"NotFound","details":{"name":"x","group":"example.com","kind":"widgets"},"code":404}`,
		want: `{"apiVersion":"v1","kind":"Status","status":"Failure","message":"renamedwidgets.renamed.example.io \"x\" not found","reason":"NotFound","details":{"name":"x","group":"renamed.example.io","kind":"renamedwidgets"},"code":404}`,
	},
	{
		name: "status invalid",
		in:   `{"apiVersion":"v1","kind":"Status","status":"Failure","message":"Widget.example.com \"x\" is invalid: spec.size: Invalid value","reason":"Invalid","details":{"name":"x","group":"example.com","kind":"Widget","causes":[{"field":"spec.size","message":"Widget.example.com too big"}]},"code":422}`,
		want: `{"apiVersion":"v1","kind":"Status","status":"Failure","message":"RenamedWidget.renamed.example.io \"x\" is invalid: spec.size: Invalid value","reason":"Invalid","details":{"name":"x","group":"renamed.example.io","kind":"RenamedWidget","causes":[{"field":"spec.size","message":"RenamedWidget.renamed.example.io too big"}]},"code":422}`,
	},
	{
		name: "workload template and selector",
		in:   `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"d"},"spec":{"selector":{"matchLabels":{"example.com/app":"d"},"matchExpressions":[{"key":"tier","operator":"In","values":["a"]}]},"template":{"metadata":{"labels":{"example.com/app":"d"},"annotations":{"example.com/a":""}}}}}`,
		want: `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"d"},"spec":{"selector":{"matchLabels":{"renamed.example.io/app":"d"},"matchExpressions":[{"key":"unprefixed.renamed.example.net/tier","operator":"In","values":["a"]}]},"template":{"metadata":{"labels":{"renamed.example.io/app":"d"},"annotations":{"renamed.example.io/a":""}}}}}`,
	},
	{
		name: "service selector",
		in:   `{"apiVersion":"v1","kind":"Service","metadata":{"name":"s"},"spec":{"selector":{"example.com/app":"d"}}}`,
		want: `{"apiVersion":"v1","kind":"Service","metadata":{"name":"s"},"spec":{"selector":{"renamed.example.io/app":"d"}}}`,
	},
	{
		name: "cronjob",
		in:   `{"apiVersion":"batch/v1","kind":"CronJob","spec":{"jobTemplate":{"metadata":{"labels":{"example.com/a":""}},"spec":{"template":{"metadata":{"labels":{"example.com/b":""}}}}}}}`,
		want: `{"apiVersion":"batch/v1","kind":"CronJob","spec":{"jobTemplate":{"metadata":{"labels":{"renamed.example.io/a":""}},"spec":{"template":{"metadata":{"labels":{"renamed.example.io/b":""}}}}}}}`,
	},
	{
		name: "event about a renamed kind",
		in:   `{"apiVersion":"v1","kind":"Event","involvedObject":{"apiVersion":"example.com/v1","kind":"Widget","name":"w"},"message":"synced widgets.example.com"}`,
		want: `{"apiVersion":"v1","kind":"Event","involvedObject":{"apiVersion":"renamed.example.io/v1","kind":"RenamedWidget","name":"w"},"message":"synced widgets.example.com"}`,
	},
	{
		name: "events.k8s.io event and HPA target",
		in:   `{"apiVersion":"events.k8s.io/v1","kind":"Event","regarding":{"apiVersion":"example.com/v1","kind":"Widget"},"related":{"apiVersion":"v1","kind":"Pod"}}`,
		want: `{"apiVersion":"events.k8s.io/v1","kind":"Event","regarding":{"apiVersion":"renamed.example.io/v1","kind":"RenamedWidget"},"related":{"apiVersion":"v1","kind":"Pod"}}`,
	},
	{
		name: "hpa",
		in:   `{"apiVersion":"autoscaling/v2","kind":"HorizontalPodAutoscaler","spec":{"scaleTargetRef":{"apiVersion":"example.com/v1","kind":"Widget","name":"w"}}}`,
		want: `{"apiVersion":"autoscaling/v2","kind":"HorizontalPodAutoscaler","spec":{"scaleTargetRef":{"apiVersion":"renamed.example.io/v1","kind":"RenamedWidget","name":"w"}}}`,
	},
	{
		// Rules name subresources and wildcards; resourceNames stay; a
		// rule of other groups only is untouched.
		name: "cluster role",
		in: `{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRole","metadata":{"name":"c"},"rules":[
			{"apiGroups":["kubevirt.io"],"resources":["virtualmachines","virtualmachines/status","*"],"resourceNames":["widgets"],"verbs":["*"]},
			{"apiGroups":["apps"],"resources":["deployments"],"verbs":["get"]},
			{"nonResourceURLs":["/apis/example.com"],"verbs":["get"]}],
			"aggregationRule":{"clusterRoleSelectors":[{"matchLabels":{"example.com/aggregate":"true"}}]}}`,
		want: `{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRole","metadata":{"name":"c"},"rules":[
			{"apiGroups":["x.virtualization.example.io"],"resources":["renamedvirtualmachines","renamedvirtualmachines/status","*"],"resourceNames":["widgets"],"verbs":["*"]},
			{"apiGroups":["apps"],"resources":["deployments"],"verbs":["get"]},
			{"nonResourceURLs":["/apis/example.com"],"verbs":["get"]}],
			"aggregationRule":{"clusterRoleSelectors":[{"matchLabels":{"renamed.example.io/aggregate":"true"}}]}}`,
	},
	{
		name: "validating webhook configuration",
		in:   `{"apiVersion":"admissionregistration.k8s.io/v1","kind":"ValidatingWebhookConfiguration","webhooks":[{"name":"w.example.com","rules":[{"apiGroups":["example.com"],"apiVersions":["v1"],"resources":["widgets","widgets/scale"],"operations":["CREATE"]}],"objectSelector":{"matchLabels":{"example.com/managed":"true"}},"clientConfig":{"service":{"name":"s","namespace":"n"}}}]}`,
		want: `{"apiVersion":"admissionregistration.k8s.io/v1","kind":"ValidatingWebhookConfiguration","webhooks":[{"name":"w.example.com","rules":[{"apiGroups":["renamed.example.io"],"apiVersions":["v1"],"resources":["renamedwidgets","renamedwidgets/scale"],"operations":["CREATE"]}],"objectSelector":{"matchLabels":{"renamed.example.io/managed":"true"}},"clientConfig":{"service":{"name":"s","namespace":"n"}}}]}`,
	},
	{
		name: "validating admission policy",
		in:   `{"apiVersion":"admissionregistration.k8s.io/v1","kind":"ValidatingAdmissionPolicy","spec":{"matchConstraints":{"resourceRules":[{"apiGroups":["example.com"],"resources":["widgets"]}],"excludeResourceRules":[{"apiGroups":["kubevirt.io"],"resources":["virtualmachines"]}]}}}`,
		want: `{"apiVersion":"admissionregistration.k8s.io/v1","kind":"ValidatingAdmissionPolicy","spec":{"matchConstraints":{"resourceRules":[{"apiGroups":["renamed.example.io"],"resources":["renamedwidgets"]}],"excludeResourceRules":[{"apiGroups":["x.virtualization.example.io"],"resources":["renamedvirtualmachines"]}]}}}`,
	},
	{
		name: "custom resource definition",
		in: `{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition","metadata":{"name":"widgets.example.com"},
			"spec":{"group":"example.com","scope":"Namespaced","names":{"plural":"widgets","singular":"widget","kind":"Widget","listKind":"WidgetList","shortNames":["wd"],"categories":["all","example"]},
			"versions":[{"name":"v1","served":true,"storage":true}],"conversion":{"strategy":"Webhook","webhook":{"clientConfig":{"service":{"name":"conv","namespace":"n","path":"/convert"}},"conversionReviewVersions":["v1"]}}},
			"status":{"acceptedNames":{"plural":"widgets","kind":"Widget"},"storedVersions":["v1"]}}`,
		want: `{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition","metadata":{"name":"renamedwidgets.renamed.example.io"},
			"spec":{"group":"renamed.example.io","scope":"Namespaced","names":{"plural":"renamedwidgets","singular":"renamedwidget","kind":"RenamedWidget","listKind":"RenamedWidgetList","shortNames":["renamedwd"],"categories":["all","renamedexample"]},
			"versions":[{"name":"v1","served":true,"storage":true}],"conversion":{"strategy":"Webhook","webhook":{"clientConfig":{"service":{"name":"conv","namespace":"n","path":"/convert"}},"conversionReviewVersions":["v1"]}}},
			"status":{"acceptedNames":{"plural":"renamedwidgets","kind":"RenamedWidget"},"storedVersions":["v1"]}}`,
	},
	{
		name: "CRD of another group",
		in:   `{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition","metadata":{"name":"gadgets.other.io"},"spec":{"group":"other.io","names":{"plural":"gadgets","kind":"Gadget"}}}`,
		want: `{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition","metadata":{"name":"gadgets.other.io"},"spec":{"group":"other.io","names":{"plural":"gadgets","kind":"Gadget"}}}`,
	},
	{
		name: "self subject access review",
		in:   `{"apiVersion":"authorization.k8s.io/v1","kind":"SelfSubjectAccessReview","spec":{"resourceAttributes":{"group":"kubevirt.io","resource":"virtualmachines","subresource":"status","verb":"get","name":"widgets","labelSelector":{"rawSelector":"example.com/a=b","requirements":[{"key":"example.com/a","operator":"In","values":["b"]}]}}},"status":{"allowed":true}}`,
		want: `{"apiVersion":"authorization.k8s.io/v1","kind":"SelfSubjectAccessReview","spec":{"resourceAttributes":{"group":"x.virtualization.example.io","resource":"renamedvirtualmachines","subresource":"status","verb":"get","name":"widgets","labelSelector":{"rawSelector":"renamed.example.io/a=b","requirements":[{"key":"renamed.example.io/a","operator":"In","values":["b"]}]}}},"status":{"allowed":true}}`,
	},
	{
		name: "subject access review of another group",
		in:   `{"apiVersion":"authorization.k8s.io/v1","kind":"SubjectAccessReview","spec":{"user":"u","resourceAttributes":{"group":"apps","resource":"deployments"}}}`,
		want: `{"apiVersion":"authorization.k8s.io/v1","kind":"SubjectAccessReview","spec":{"user":"u","resourceAttributes":{"group":"apps","resource":"deployments"}}}`,
	},
	{
		name: "self subject rules review",
		in:   `{"apiVersion":"authorization.k8s.io/v1","kind":"SelfSubjectRulesReview","spec":{"namespace":"n"},"status":{"resourceRules":[{"verbs":["get"],"apiGroups":["example.com"],"resources":["widgets"]}],"nonResourceRules":[],"incomplete":false}}`,
		want: `{"apiVersion":"authorization.k8s.io/v1","kind":"SelfSubjectRulesReview","spec":{"namespace":"n"},"status":{"resourceRules":[{"verbs":["get"],"apiGroups":["renamed.example.io"],"resources":["renamedwidgets"]}],"nonResourceRules":[],"incomplete":false}}`,
	},
	{
		name: "legacy discovery: group list",
		in:   `{"kind":"APIGroupList","apiVersion":"v1","groups":[{"name":"example.com","versions":[{"groupVersion":"example.com/v1","version":"v1"}],"preferredVersion":{"groupVersion":"example.com/v1","version":"v1"}},{"name":"apps","versions":[{"groupVersion":"apps/v1","version":"v1"}]}]}`,
		want: `{"kind":"APIGroupList","apiVersion":"v1","groups":[{"name":"renamed.example.io","versions":[{"groupVersion":"renamed.example.io/v1","version":"v1"}],"preferredVersion":{"groupVersion":"renamed.example.io/v1","version":"v1"}},{"name":"apps","versions":[{"groupVersion":"apps/v1","version":"v1"}]}]}`,
	},
	{
		name: "legacy discovery: group",
		in:   `{"kind":"APIGroup","apiVersion":"v1","name":"kubevirt.io","versions":[{"groupVersion":"kubevirt.io/v1","version":"v1"}],"preferredVersion":{"groupVersion":"kubevirt.io/v1","version":"v1"}}`,
		want: `{"kind":"APIGroup","apiVersion":"v1","name":"x.virtualization.example.io","versions":[{"groupVersion":"x.virtualization.example.io/v1","version":"v1"}],"preferredVersion":{"groupVersion":"x.virtualization.example.io/v1","version":"v1"}}`,
	},
	{
		name: "legacy discovery: resource list",
		in: `{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"example.com/v1","resources":[
			{"name":"widgets","singularName":"widget","namespaced":true,"kind":"Widget","verbs":["get"],"shortNames":["wd"],"categories":["all","example"]},
			{"name":"widgets/status","singularName":"","namespaced":true,"kind":"Widget","verbs":["get"]},
			{"name":"widgets/scale","singularName":"","namespaced":true,"group":"autoscaling","version":"v1","kind":"Scale","verbs":["get"]}]}`,
		want: `{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"renamed.example.io/v1","resources":[
			{"name":"renamedwidgets","singularName":"renamedwidget","namespaced":true,"kind":"RenamedWidget","verbs":["get"],"shortNames":["renamedwd"],"categories":["all","renamedexample"]},
			{"name":"renamedwidgets/status","singularName":"","namespaced":true,"kind":"RenamedWidget","verbs":["get"]},
			{"name":"renamedwidgets/scale","singularName":"","namespaced":true,"group":"autoscaling","version":"v1","kind":"Scale","verbs":["get"]}]}`,
	},
	{
		name: "aggregated discovery v2",
		in: `{"apiVersion":"apidiscovery.k8s.io/v2","kind":"APIGroupDiscoveryList","metadata":{},"items":[{"metadata":{"name":"example.com"},"versions":[{"version":"v1","resources":[
			{"resource":"widgets","responseKind":{"group":"example.com","version":"v1","kind":"Widget"},"scope":"Namespaced","singularResource":"widget","verbs":["get"],"shortNames":["wd"],"categories":["all"],
			 "subresources":[{"subresource":"status","responseKind":{"group":"example.com","version":"v1","kind":"Widget"},"verbs":["get"]},{"subresource":"scale","responseKind":{"group":"autoscaling","version":"v1","kind":"Scale"},"acceptedTypes":[{"group":"autoscaling","version":"v1","kind":"Scale"}],"verbs":["get"]}]}],"freshness":"Current"}]},
			{"metadata":{"name":"apps"},"versions":[{"version":"v1","resources":[{"resource":"deployments","responseKind":{"group":"apps","version":"v1","kind":"Deployment"}}]}]}]}`,
		want: `{"apiVersion":"apidiscovery.k8s.io/v2","kind":"APIGroupDiscoveryList","metadata":{},"items":[{"metadata":{"name":"renamed.example.io"},"versions":[{"version":"v1","resources":[
			{"resource":"renamedwidgets","responseKind":{"group":"renamed.example.io","version":"v1","kind":"RenamedWidget"},"scope":"Namespaced","singularResource":"renamedwidget","verbs":["get"],"shortNames":["renamedwd"],"categories":["all"],
			 "subresources":[{"subresource":"status","responseKind":{"group":"renamed.example.io","version":"v1","kind":"RenamedWidget"},"verbs":["get"]},{"subresource":"scale","responseKind":{"group":"autoscaling","version":"v1","kind":"Scale"},"acceptedTypes":[{"group":"autoscaling","version":"v1","kind":"Scale"}],"verbs":["get"]}]}],"freshness":"Current"}]},
			{"metadata":{"name":"apps"},"versions":[{"version":"v1","resources":[{"resource":"deployments","responseKind":{"group":"apps","version":"v1","kind":"Deployment"}}]}]}]}`,
	},
	{
		name: "aggregated discovery v2beta1",
		in:   `{"apiVersion":"apidiscovery.k8s.io/v2beta1","kind":"APIGroupDiscoveryList","items":[{"metadata":{"name":"kubevirt.io"},"versions":[{"version":"v1","resources":[{"resource":"virtualmachines","responseKind":{"group":"kubevirt.io","version":"v1","kind":"VirtualMachine"},"shortNames":["vm","vms"]}]}]}]}`,
		want: `{"apiVersion":"apidiscovery.k8s.io/v2beta1","kind":"APIGroupDiscoveryList","items":[{"metadata":{"name":"x.virtualization.example.io"},"versions":[{"version":"v1","resources":[{"resource":"renamedvirtualmachines","responseKind":{"group":"x.virtualization.example.io","version":"v1","kind":"RenamedVirtualMachine"},"shortNames":["renamedvm","renamedvms"]}]}]}]}`,
	},
	{
		name: "admission review request",
		in: `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","kind":{"group":"example.com","version":"v1","kind":"Widget"},"resource":{"group":"example.com","version":"v1","resource":"widgets"},"subResource":"status",
			"requestKind":{"group":"example.com","version":"v1","kind":"Widget"},"requestResource":{"group":"example.com","version":"v1","resource":"widgets"},"name":"w","namespace":"n","operation":"UPDATE","userInfo":{"username":"u"},
			"object":{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w","labels":{"example.com/a":""}}},"oldObject":{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w"}},"options":{"apiVersion":"meta.k8s.io/v1","kind":"UpdateOptions"}}}`,
		want: `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","kind":{"group":"renamed.example.io","version":"v1","kind":"RenamedWidget"},"resource":{"group":"renamed.example.io","version":"v1","resource":"renamedwidgets"},"subResource":"status",
			"requestKind":{"group":"renamed.example.io","version":"v1","kind":"RenamedWidget"},"requestResource":{"group":"renamed.example.io","version":"v1","resource":"renamedwidgets"},"name":"w","namespace":"n","operation":"UPDATE","userInfo":{"username":"u"},
			"object":{"apiVersion":"renamed.example.io/v1","kind":"RenamedWidget","metadata":{"name":"w","labels":{"renamed.example.io/a":""}}},"oldObject":{"apiVersion":"renamed.example.io/v1","kind":"RenamedWidget","metadata":{"name":"w"}},"options":{"apiVersion":"meta.k8s.io/v1","kind":"UpdateOptions"}}}`,
	},
	{
		// The patch is base64 of [{"op":"add","path":"/metadata/labels/example.com~1a","value":"b"}].
		name: "admission review response",
		in:   `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"u","allowed":false,"patchType":"JSONPatch","patch":"W3sib3AiOiJhZGQiLCJwYXRoIjoiL21ldGFkYXRhL2xhYmVscy9leGFtcGxlLmNvbX4xYSIsInZhbHVlIjoiYiJ9XQ==","warnings":["example.com/v1 Widget is deprecated; use example.com/v2 Widget"],"status":{"message":"widgets.example.com \"w\" is forbidden","details":{"group":"example.com","kind":"widgets"}}}}`,
		want: `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"u","allowed":false,"patchType":"JSONPatch","patch":"W3sib3AiOiJhZGQiLCJwYXRoIjoiL21ldGFkYXRhL2xhYmVscy9yZW5hbWVkLmV4YW1wbGUuaW9+MWEiLCJ2YWx1ZSI6ImIifV0=","warnings":["renamed.example.io/v1 RenamedWidget is deprecated; use renamed.example.io/v2 RenamedWidget"],"status":{"message":"renamedwidgets.renamed.example.io \"w\" is forbidden","details":{"group":"renamed.example.io","kind":"renamedwidgets"}}}}`,
	},
	{
		name: "conversion review",
		in:   `{"apiVersion":"apiextensions.k8s.io/v1","kind":"ConversionReview","request":{"uid":"u","desiredAPIVersion":"example.com/v2","objects":[{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w"}}]},"response":{"uid":"u","convertedObjects":[{"apiVersion":"example.com/v2","kind":"Widget","metadata":{"name":"w"}}],"result":{"status":"Success"}}}`,
		want: `{"apiVersion":"apiextensions.k8s.io/v1","kind":"ConversionReview","request":{"uid":"u","desiredAPIVersion":"renamed.example.io/v2","objects":[{"apiVersion":"renamed.example.io/v1","kind":"RenamedWidget","metadata":{"name":"w"}}]},"response":{"uid":"u","convertedObjects":[{"apiVersion":"renamed.example.io/v2","kind":"RenamedWidget","metadata":{"name":"w"}}],"result":{"status":"Success"}}}`,
	},
	{
		name: "object of another group stays",
		in:   `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"d","labels":{"app.kubernetes.io/name":"x"}},"spec":{"replicas":1}}`,
		want: `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"d","labels":{"app.kubernetes.io/name":"x"}},"spec":{"replicas":1}}`,
	},
}

// TestObject: every object shape, both ways.
func TestObject(t *testing.T) {
	r := testRewriter(t)
	for _, c := range objectCases {
		t.Run(c.name, func(t *testing.T) {
			checkSwap(t, c.in, c.want, r.ObjectJSON)
		})
	}
}

// watchCases are watch events of every type.
var watchCases = []struct {
	name, in, want string
}{
	{"added", `{"type":"ADDED","object":{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w","finalizers":["example.com/f"]}}}`,
		`{"type":"ADDED","object":{"apiVersion":"renamed.example.io/v1","kind":"RenamedWidget","metadata":{"name":"w","finalizers":["renamed.example.io/f"]}}}`},
	{"modified", `{"type":"MODIFIED","object":{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{"name":"v"}}}`,
		`{"type":"MODIFIED","object":{"apiVersion":"x.virtualization.example.io/v1","kind":"RenamedVirtualMachine","metadata":{"name":"v"}}}`},
	{"deleted", `{"type":"DELETED","object":{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w"}}}`,
		`{"type":"DELETED","object":{"apiVersion":"renamed.example.io/v1","kind":"RenamedWidget","metadata":{"name":"w"}}}`},
	{"bookmark", `{"type":"BOOKMARK","object":{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"resourceVersion":"12","annotations":{"k8s.io/initial-events-end":"true"}}}}`,
		`{"type":"BOOKMARK","object":{"apiVersion":"renamed.example.io/v1","kind":"RenamedWidget","metadata":{"resourceVersion":"12","annotations":{"k8s.io/initial-events-end":"true"}}}}`},
	{"error", `{"type":"ERROR","object":{"apiVersion":"v1","kind":"Status","status":"Failure","message":"too old resource version: 1 (5)","reason":"Expired","code":410,"details":{"group":"example.com","kind":"widgets"}}}`,
		`{"type":"ERROR","object":{"apiVersion":"v1","kind":"Status","status":"Failure","message":"too old resource version: 1 (5)","reason":"Expired","code":410,"details":{"group":"renamed.example.io","kind":"renamedwidgets"}}}`},
}

// TestWatchEvent: ADDED, MODIFIED, DELETED, BOOKMARK and ERROR, both ways.
func TestWatchEvent(t *testing.T) {
	r := testRewriter(t)
	for _, c := range watchCases {
		t.Run(c.name, func(t *testing.T) {
			checkSwap(t, c.in, c.want, r.WatchEventJSON)
		})
	}
}

// TestObjectJSONKeepsNumbers: numbers are written back digit for digit,
// and nothing is HTML-escaped.
func TestObjectJSONKeepsNumbers(t *testing.T) {
	r := testRewriter(t)
	in := `{"apiVersion":"example.com/v1","kind":"Widget","spec":{"big":12345678901234567890,"f":1.50e3,"s":"<a&b>"}}`
	want := `{"apiVersion":"renamed.example.io/v1","kind":"RenamedWidget","spec":{"big":12345678901234567890,"f":1.50e3,"s":"<a&b>"}}`
	got, err := r.ObjectJSON([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

// TestObjectJSONErrors: what is not one JSON object is refused.
func TestObjectJSONErrors(t *testing.T) {
	r := testRewriter(t)
	for _, in := range []string{``, `[]`, `{"a":1} {}`, `{`} {
		if _, err := r.ObjectJSON([]byte(in)); err == nil {
			t.Errorf("ObjectJSON(%q) gave no error", in)
		}
	}
}
