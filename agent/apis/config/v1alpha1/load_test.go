package v1alpha1

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"
)

// flagValues are the variables behind the flags of flags().
type flagValues struct {
	vips   []string
	port   uint16
	domain string
	on     bool
	sync   time.Duration
	events int
}

// flags is a command's flag set with a few flags of each kind.
func flags() (*pflag.FlagSet, *flagValues) {
	v := &flagValues{}
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	fs.StringSliceVar(&v.vips, "service-vip", []string{"10.96.0.1"}, "")
	fs.Uint16Var(&v.port, "service-port", 443, "")
	fs.StringVar(&v.domain, "cluster-domain", "cluster.local", "")
	fs.BoolVar(&v.on, "interception", true, "")
	fs.DurationVar(&v.sync, "sync-period", 10*time.Second, "")
	fs.IntVar(&v.events, "cache-history-events", 10000, "")
	return fs, v
}

const file = `apiVersion: config.kube-apicache.io/v1alpha1
kind: AgentConfiguration
cluster:
  serviceVIPs: [10.100.0.1, fd00::1]
  servicePort: 6443
  clusterDomain: example.internal
  signerName: example.com/agents
interception:
  enabled: false
  syncPeriod: 30s
cache:
  historyEvents: 500
`

// Given a file that sets flags of several kinds, when it is applied to a
// command line that set one of them, then the command line's value stays
// and is reported as an override, every other field reaches its flag, a
// list replaces the default, and fields of flags the command lacks
// (signerName) are skipped.
func TestApplyToFlags(t *testing.T) {
	c, err := Decode([]byte(file))
	if err != nil {
		t.Fatal(err)
	}
	fs, v := flags()
	if err := fs.Parse([]string{"--cluster-domain=cli.local"}); err != nil {
		t.Fatal(err)
	}
	applied, overrides, err := ApplyToFlags(c, fs)
	if err != nil {
		t.Fatal(err)
	}
	want := []Override{{Flag: "cluster-domain", Field: field.NewPath("cluster", "clusterDomain"), FlagValue: "cli.local", FileValue: "example.internal"}}
	if diff := cmp.Diff(want, overrides, cmp.Comparer(func(a, b *field.Path) bool { return a.String() == b.String() })); diff != "" {
		t.Errorf("overrides (-want +got):\n%s", diff)
	}
	if strings.Join(v.vips, ",") != "10.100.0.1,fd00::1" || v.port != 6443 || v.domain != "cli.local" || v.on ||
		v.sync != 30*time.Second || v.events != 500 {
		t.Errorf("flags after the file: %+v", *v)
	}
	if _, ok := applied["cluster-domain"]; ok {
		t.Errorf("the command line's --cluster-domain was recorded as set by the file")
	}
	if p := applied["service-port"]; p == nil || p.String() != "cluster.servicePort" {
		t.Errorf("service-port applied from %v, want cluster.servicePort", p)
	}
	if !fs.Changed("service-vip") {
		t.Errorf("a flag the file set does not count as set")
	}
	err = applied.Annotate(errors.New("--service-port 6443 is not a port of Service default/kubernetes"))
	if want := "--service-port (config field cluster.servicePort) 6443 is not"; !strings.HasPrefix(err.Error(), want) {
		t.Errorf("annotated error %q, want prefix %q", err, want)
	}
}

// Given files with a mistake, when they are decoded or applied, then the
// error names the field (or the wrong apiVersion or kind).
func TestConfigErrors(t *testing.T) {
	for name, tc := range map[string]struct{ doc, want string }{
		"unknown field": {
			doc:  "apiVersion: config.kube-apicache.io/v1alpha1\nkind: AgentConfiguration\ncluster:\n  serviceVIP: 10.0.0.1\n",
			want: `unknown field "cluster.serviceVIP"`,
		},
		"duplicate field": {
			doc:  "apiVersion: config.kube-apicache.io/v1alpha1\nkind: AgentConfiguration\ncluster:\n  clusterDomain: a\n  clusterDomain: b\n",
			want: `"clusterDomain" already set`,
		},
		"wrong type": {
			doc:  "apiVersion: config.kube-apicache.io/v1alpha1\nkind: AgentConfiguration\ncluster:\n  servicePort: https\n",
			want: "servicePort",
		},
		"wrong version": {
			doc:  "apiVersion: config.kube-apicache.io/v1\nkind: AgentConfiguration\n",
			want: "config.kube-apicache.io/v1",
		},
		"no kind": {
			doc:  "apiVersion: config.kube-apicache.io/v1alpha1\n",
			want: "kind",
		},
		"bad value": {
			doc:  "apiVersion: config.kube-apicache.io/v1alpha1\nkind: AgentConfiguration\ncluster:\n  servicePort: 70000\n",
			want: "cluster.servicePort: Invalid value: \"70000\"",
		},
	} {
		t.Run(name, func(t *testing.T) {
			c, err := Decode([]byte(tc.doc))
			if err == nil {
				fs, _ := flags()
				_, _, err = ApplyToFlags(c, fs)
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// Every field names a flag, each flag once.
func TestFieldsNameDistinctFlags(t *testing.T) {
	seen := map[string]bool{}
	for _, f := range Fields() {
		if seen[f] {
			t.Errorf("flag --%s named by two fields", f)
		}
		seen[f] = true
	}
	if len(seen) < 40 {
		t.Errorf("only %d fields", len(seen))
	}
}

// shippedConfig decodes the AgentConfiguration of the ConfigMap in
// manifests/config.yaml.
func shippedConfig(t *testing.T) *AgentConfiguration {
	t.Helper()
	raw, err := os.ReadFile("../../../../manifests/config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cm corev1.ConfigMap
	if err := yaml.UnmarshalStrict(raw, &cm); err != nil {
		t.Fatal(err)
	}
	c, err := Decode([]byte(cm.Data["config.yaml"]))
	if err != nil {
		t.Fatalf("manifests/config.yaml: %v", err)
	}
	return c
}

// The ConfigMap the manifests ship holds a valid AgentConfiguration.
func TestShippedConfig(t *testing.T) {
	c := shippedConfig(t)
	if c.Interception.Enabled == nil || !*c.Interception.Enabled {
		t.Errorf("the shipped configuration does not intercept")
	}
}

// The shipped DaemonSet passes no flag that overrides a field of the
// shipped ConfigMap: an operator who edits that field must see the edit
// take effect.
func TestShippedDaemonSetOverridesNothing(t *testing.T) {
	c := shippedConfig(t)
	raw, err := os.ReadFile("../../../../manifests/daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(raw, &ds); err != nil {
		t.Fatal(err)
	}
	var args []string
	for _, ctr := range ds.Spec.Template.Spec.Containers {
		if ctr.Name == "kube-apicache" {
			args = ctr.Args
		}
	}
	if !slices.Contains(args, "--config=/etc/kube-apicache/config/config.yaml") {
		t.Fatalf("the DaemonSet's agent does not read the shipped configuration: %q", args)
	}
	// Every flag a field names, as a string flag: the values are not
	// parsed, only whether the command line sets them.
	fs := pflag.NewFlagSet("daemonset", pflag.ContinueOnError)
	fs.ParseErrorsAllowlist.UnknownFlags = true
	for _, name := range Fields() {
		fs.String(name, "", "")
	}
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	_, overrides, err := ApplyToFlags(c, fs)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range overrides {
		t.Errorf("the DaemonSet's --%s=%s overrides %s: %s in the shipped ConfigMap", o.Flag, o.FlagValue, o.Field, o.FileValue)
	}
}
