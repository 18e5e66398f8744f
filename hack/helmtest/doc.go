// Package helmtest checks the Helm chart in manifests/helm/kube-apicache
// against the kustomize manifests it mirrors: helm's linter passes, the
// chart's default render holds the same objects as the kustomize base,
// and each value that stands for a kustomize component renders the same
// objects as the base with that component.
//
// It is a module of its own, so that Helm's and kustomize's dependencies
// stay out of the agent's module graph; `make vet` runs its tests. Both
// renderers run in-process (helm.sh/helm/v3, sigs.k8s.io/kustomize/api):
// no helm or kubectl binary is needed, and the result does not depend on
// the kustomize built into the machine's kubectl.
package helmtest
