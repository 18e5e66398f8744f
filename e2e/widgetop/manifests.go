package main

import (
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// widgetCRD returns the CustomResourceDefinition of widgets.example.com:
// v1 (spec.size) is stored, v2 (spec.dimensions.size) is served too, and
// the webhook at conversionURL converts between them.
func widgetCRD(conversionURL string, caBundle []byte) *apiextensionsv1.CustomResourceDefinition {
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: crdName},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: group,
			Names: apiextensionsv1.CustomResourceDefinitionNames{
				Plural:     resource,
				Singular:   "widget",
				Kind:       kind,
				ListKind:   listKind,
				ShortNames: []string{"wdg"},
				Categories: []string{"example"},
			},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{
				{
					Name:    "v1",
					Served:  true,
					Storage: true,
					Schema: widgetSchema(map[string]apiextensionsv1.JSONSchemaProps{
						"size":  {Type: "integer"},
						"color": {Type: "string"},
					}),
					Subresources: &apiextensionsv1.CustomResourceSubresources{
						Status: &apiextensionsv1.CustomResourceSubresourceStatus{},
					},
					AdditionalPrinterColumns: []apiextensionsv1.CustomResourceColumnDefinition{
						{Name: "Size", Type: "integer", JSONPath: ".spec.size"},
					},
				},
				{
					Name:    "v2",
					Served:  true,
					Storage: false,
					Schema: widgetSchema(map[string]apiextensionsv1.JSONSchemaProps{
						"dimensions": {
							Type:       "object",
							Properties: map[string]apiextensionsv1.JSONSchemaProps{"size": {Type: "integer"}},
						},
						"color": {Type: "string"},
					}),
					Subresources: &apiextensionsv1.CustomResourceSubresources{
						Status: &apiextensionsv1.CustomResourceSubresourceStatus{},
					},
				},
			},
			Conversion: &apiextensionsv1.CustomResourceConversion{
				Strategy: apiextensionsv1.WebhookConverter,
				Webhook: &apiextensionsv1.WebhookConversion{
					ClientConfig: &apiextensionsv1.WebhookClientConfig{
						URL:      ptr.To(conversionURL),
						CABundle: caBundle,
					},
					ConversionReviewVersions: []string{"v1"},
				},
			},
		},
	}
}

// widgetSchema returns a structural schema with the given spec
// properties and status.observedSize; unknown fields are pruned.
func widgetSchema(spec map[string]apiextensionsv1.JSONSchemaProps) *apiextensionsv1.CustomResourceValidation {
	return &apiextensionsv1.CustomResourceValidation{
		OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
			Type: "object",
			Properties: map[string]apiextensionsv1.JSONSchemaProps{
				"apiVersion": {Type: "string"},
				"kind":       {Type: "string"},
				"metadata":   {Type: "object"},
				"spec":       {Type: "object", Properties: spec},
				"status": {
					Type:       "object",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{"observedSize": {Type: "integer"}},
				},
			},
		},
	}
}

// widgetWebhookConfig returns the ValidatingWebhookConfiguration that
// sends creates and updates of widgets to the webhook at url.
func widgetWebhookConfig(name, url string, caBundle []byte) *admissionregistrationv1.ValidatingWebhookConfiguration {
	return &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: webhookName,
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
				Rule: admissionregistrationv1.Rule{
					APIGroups:   []string{group},
					APIVersions: []string{"*"},
					Resources:   []string{resource},
					Scope:       ptr.To(admissionregistrationv1.NamespacedScope),
				},
			}},
			ClientConfig: admissionregistrationv1.WebhookClientConfig{
				URL:      ptr.To(url),
				CABundle: caBundle,
			},
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			TimeoutSeconds:          ptr.To[int32](10),
		}},
	}
}
