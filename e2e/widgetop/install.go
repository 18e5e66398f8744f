package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// installOptions are the flags of `widgetop install`.
type installOptions struct {
	conversionURL string
	webhookURL    string
	caFile        string
	configName    string
}

// denialText is what the validating webhook says about a negative size;
// install waits until a dry-run create is denied with it.
const denialText = "spec.size must not be negative"

// installPoll is the interval of install's waits.
const installPoll = 500 * time.Millisecond

// install creates the CRD and the ValidatingWebhookConfiguration (each
// left alone when it exists) and waits until the CRD is established and
// discovered and the webhook denies a bad widget.
func install(ctx context.Context, o installOptions) error {
	caBundle, err := os.ReadFile(o.caFile)
	if err != nil {
		return fmt.Errorf("reading the CA bundle: %w", err)
	}
	if len(strings.TrimSpace(string(caBundle))) == 0 {
		return fmt.Errorf("the CA bundle %s is empty", o.caFile)
	}
	cfg, ns, err := inCluster()
	if err != nil {
		return err
	}
	ext, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating the apiextensions client: %w", err)
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating the client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating the dynamic client: %w", err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating the discovery client: %w", err)
	}

	if err := ensureCRD(ctx, ext, widgetCRD(o.conversionURL, caBundle)); err != nil {
		return err
	}
	if err := waitEstablished(ctx, ext); err != nil {
		return err
	}
	if err := waitDiscovered(ctx, disc); err != nil {
		return err
	}
	if err := ensureWebhookConfig(ctx, kube, o.configName, o.webhookURL, caBundle); err != nil {
		return err
	}
	return waitWebhookEffective(ctx, dyn, ns)
}

// ensureCRD creates crd unless a CRD of its name exists; it prints
// `CRD <name> created` or `CRD <name> exists`.
func ensureCRD(ctx context.Context, ext apiextensionsclient.Interface, crd *apiextensionsv1.CustomResourceDefinition) error {
	_, err := ext.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{FieldManager: fieldManager})
	switch {
	case apierrors.IsAlreadyExists(err):
		sayf("CRD %s exists", crd.Name)
	case err != nil:
		return fmt.Errorf("creating CRD %s: %w", crd.Name, err)
	default:
		sayf("CRD %s created", crd.Name)
	}
	return nil
}

// waitEstablished waits until the CRD, read back by its original name,
// has the condition Established=True; it prints `ESTABLISHED <name>`.
func waitEstablished(ctx context.Context, ext apiextensionsclient.Interface) error {
	var last string
	err := wait.PollUntilContextCancel(ctx, installPoll, true, func(ctx context.Context) (bool, error) {
		crd, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crdName, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		if crd.Name != crdName || crd.Spec.Group != group || crd.Spec.Names.Kind != kind {
			return false, fmt.Errorf("CRD %s reads back as %s (group %s, kind %s)", crdName, crd.Name, crd.Spec.Group, crd.Spec.Names.Kind)
		}
		for _, c := range crd.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
		}
		last = fmt.Sprintf("conditions %v", conditionSummary(crd.Status.Conditions))
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for CRD %s to be established (last: %s): %w", crdName, last, err)
	}
	sayf("ESTABLISHED %s", crdName)
	return nil
}

// conditionSummary renders CRD conditions as Type=Status(Reason).
func conditionSummary(conds []apiextensionsv1.CustomResourceDefinitionCondition) []string {
	var out []string
	for _, c := range conds {
		out = append(out, fmt.Sprintf("%s=%s(%s)", c.Type, c.Status, c.Reason))
	}
	return out
}

// waitDiscovered waits until discovery lists widgets in example.com/v1;
// it prints `DISCOVERED example.com/v1 widgets`.
func waitDiscovered(ctx context.Context, disc discovery.DiscoveryInterface) error {
	gv := group + "/v1"
	var last string
	err := wait.PollUntilContextCancel(ctx, installPoll, true, func(ctx context.Context) (bool, error) {
		list, err := disc.ServerResourcesForGroupVersion(gv)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		var names []string
		for _, r := range list.APIResources {
			names = append(names, r.Name)
		}
		if slices.Contains(names, resource) {
			return true, nil
		}
		last = fmt.Sprintf("resources %v", names)
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for discovery to list %s in %s (last: %s): %w", resource, gv, last, err)
	}
	sayf("DISCOVERED %s %s", gv, resource)
	return nil
}

// ensureWebhookConfig creates the ValidatingWebhookConfiguration unless
// one of its name exists; it prints `WEBHOOKCONFIG <name> created` or
// `WEBHOOKCONFIG <name> exists`.
func ensureWebhookConfig(ctx context.Context, kube kubernetes.Interface, name, url string, caBundle []byte) error {
	cfg := widgetWebhookConfig(name, url, caBundle)
	_, err := kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, cfg, metav1.CreateOptions{FieldManager: fieldManager})
	switch {
	case apierrors.IsAlreadyExists(err):
		sayf("WEBHOOKCONFIG %s exists", name)
	case err != nil:
		return fmt.Errorf("creating ValidatingWebhookConfiguration %s: %w", name, err)
	default:
		sayf("WEBHOOKCONFIG %s created", name)
	}
	return nil
}

// waitWebhookEffective dry-runs the create of a widget with a negative
// size in ns until the webhook denies it; it prints
// `WEBHOOK effective after <n> attempts`.
func waitWebhookEffective(ctx context.Context, dyn dynamic.Interface, ns string) error {
	gvr := schema.GroupVersionResource{Group: group, Version: "v1", Resource: resource}
	probe := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": group + "/v1",
		"kind":       kind,
		"metadata":   map[string]any{"name": "widgetop-install-probe", "namespace": ns},
		"spec":       map[string]any{"size": int64(-1), "color": "none"},
	}}
	attempts := 0
	last := "no attempt yet"
	err := wait.PollUntilContextCancel(ctx, installPoll, true, func(ctx context.Context) (bool, error) {
		attempts++
		_, err := dyn.Resource(gvr).Namespace(ns).Create(ctx, probe.DeepCopy(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		switch {
		case err == nil:
			last = "the dry-run create of a widget with size -1 was allowed"
			return false, nil
		case strings.Contains(err.Error(), denialText):
			return true, nil
		default:
			last = err.Error()
			return false, nil
		}
	})
	if err != nil {
		return fmt.Errorf("waiting for the webhook to deny a negative size in namespace %s after %d attempts (last: %s): %w", ns, attempts, last, err)
	}
	sayf("WEBHOOK effective after %d attempts", attempts)
	return nil
}
