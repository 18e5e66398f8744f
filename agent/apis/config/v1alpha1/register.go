// Package v1alpha1 is the agent's configuration file format: one
// AgentConfiguration, read by `kube-apicache` and `kube-apicache approver`
// alike (--config), so that the values both must agree on (the Service VIP,
// the listen addresses, the cluster domain, the signer) are written once.
//
// Every field stands for a command-line flag, named in its `flag` tag. The
// file sets the flags the command line leaves unset: a flag given on the
// command line wins over the file. Fields whose flag a command does not
// have are ignored by it (the approver reads only the cluster section). The
// reference in docs/reference/config.md is generated from these types and the flags'
// help (`kube-apicache docs`), so it cannot drift from the code.
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group of the project's own configuration types.
const GroupName = "config.kube-apicache.io"

// SchemeGroupVersion is the group and version of this package's types.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}

var (
	schemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme registers AgentConfiguration with a scheme.
	AddToScheme = schemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(SchemeGroupVersion, &AgentConfiguration{})
	return nil
}
