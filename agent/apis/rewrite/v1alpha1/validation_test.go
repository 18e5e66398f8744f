package v1alpha1

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func validProfile() RewriteProfile {
	return RewriteProfile{
		Name:           "widgets",
		Selector:       CallerSelector{ServiceAccounts: []string{"widgets-system/operator"}, Namespaces: []string{"renamed"}},
		Groups:         []GroupRename{{From: "example.com", To: "renamed.example.io"}, {From: "kubevirt.io", To: "x.virtualization.example.io"}},
		KindPrefix:     "Renamed",
		KeepCategories: []string{"all"},
		Labels:         []KeyDomainRename{{From: "example.com", To: "renamed.example.io"}, {From: "", To: "unprefixed.example.net"}},
		Annotations:    []KeyDomainRename{{From: "example.com", To: "renamed.example.io"}},
		Finalizers:     []KeyDomainRename{{From: "example.com", To: "renamed.example.io"}},
	}
}

// TestValidate: one error per mistake, naming its field.
func TestValidate(t *testing.T) {
	for _, c := range []struct {
		name   string
		edit   func(*RewriteConfiguration)
		served StaticServedGroups
		want   []string // "type field" of each error
	}{
		{name: "valid", edit: func(*RewriteConfiguration) {}},
		{name: "no profiles", edit: func(c *RewriteConfiguration) { c.Profiles = nil }, want: []string{"FieldValueRequired profiles"}},
		{name: "empty kind prefix", edit: func(c *RewriteConfiguration) { c.Profiles[0].KindPrefix = "" },
			want: []string{"FieldValueRequired profiles[0].kindPrefix"}},
		{name: "lower-case kind prefix", edit: func(c *RewriteConfiguration) { c.Profiles[0].KindPrefix = "renamed" },
			want: []string{"FieldValueInvalid profiles[0].kindPrefix"}},
		{name: "empty selector", edit: func(c *RewriteConfiguration) { c.Profiles[0].Selector = CallerSelector{} },
			want: []string{"FieldValueRequired profiles[0].selector"}},
		{name: "bad selector entries", edit: func(c *RewriteConfiguration) {
			c.Profiles[0].Selector = CallerSelector{ServiceAccounts: []string{"operator", "a/b", "a/b", "Bad/x"}, Namespaces: []string{"n", "n", "N"}}
		}, want: []string{
			"FieldValueInvalid profiles[0].selector.serviceAccounts[0]",
			"FieldValueDuplicate profiles[0].selector.serviceAccounts[2]",
			"FieldValueInvalid profiles[0].selector.serviceAccounts[3]",
			"FieldValueDuplicate profiles[0].selector.namespaces[1]",
			"FieldValueInvalid profiles[0].selector.namespaces[2]",
		}},
		{name: "no name", edit: func(c *RewriteConfiguration) { c.Profiles[0].Name = "" },
			want: []string{"FieldValueRequired profiles[0].name"}},
		{name: "no groups", edit: func(c *RewriteConfiguration) { c.Profiles[0].Groups = nil },
			want: []string{"FieldValueRequired profiles[0].groups"}},
		{name: "kind mapped twice", edit: func(c *RewriteConfiguration) {
			c.Profiles[0].Groups = append(c.Profiles[0].Groups, GroupRename{From: "example.com", To: "other.example.io"})
		}, want: []string{"FieldValueDuplicate profiles[0].groups[2].from"}},
		{name: "two originals to one target", edit: func(c *RewriteConfiguration) {
			c.Profiles[0].Groups = append(c.Profiles[0].Groups, GroupRename{From: "other.io", To: "renamed.example.io"})
		}, want: []string{"FieldValueInvalid profiles[0].groups[2].to"}},
		{name: "a target that is another rule's original", edit: func(c *RewriteConfiguration) {
			c.Profiles[0].Groups[1].To = "example.com"
		}, want: []string{"FieldValueInvalid profiles[0].groups[1].to"}},
		{name: "invalid and built-in groups", edit: func(c *RewriteConfiguration) {
			c.Profiles[0].Groups = []GroupRename{{From: "Example.com", To: "apps"}, {From: "x.k8s.io", To: "y.example.io"}, {From: "", To: ""}}
		}, want: []string{
			"FieldValueInvalid profiles[0].groups[0].from",
			"FieldValueInvalid profiles[0].groups[0].to",
			"FieldValueInvalid profiles[0].groups[1].from",
			"FieldValueRequired profiles[0].groups[2].from",
			"FieldValueRequired profiles[0].groups[2].to",
		}},
		{name: "target served by the cluster", served: StaticServedGroups{"renamed.example.io": ServedByCluster},
			edit: func(*RewriteConfiguration) {}, want: []string{"FieldValueForbidden profiles[0].groups[0].to"}},
		{name: "target served to others", served: StaticServedGroups{"x.virtualization.example.io": ServedDenied},
			edit: func(*RewriteConfiguration) {}, want: []string{"FieldValueForbidden profiles[0].groups[1].to"}},
		{name: "target served by custom resources the callers may use",
			served: StaticServedGroups{"renamed.example.io": ServedByCustomResources, "example.com": ServedByCustomResources},
			edit:   func(*RewriteConfiguration) {}},
		{name: "two profiles, one target", edit: func(c *RewriteConfiguration) {
			p := validProfile()
			p.Name = "second"
			p.Selector = CallerSelector{Namespaces: []string{"second"}}
			p.Groups = []GroupRename{{From: "example.com", To: "renamed.example.io"}}
			c.Profiles = append(c.Profiles, p)
		}, want: []string{"FieldValueInvalid profiles[1].groups[0].to"}},
		{name: "two profiles, one original, two targets", edit: func(c *RewriteConfiguration) {
			p := validProfile()
			p.Name = "second"
			p.Selector = CallerSelector{Namespaces: []string{"second"}}
			p.Groups = []GroupRename{{From: "example.com", To: "second.example.io"}}
			c.Profiles = append(c.Profiles, p)
		}},
		{name: "a caller selected by two profiles", edit: func(c *RewriteConfiguration) {
			p := validProfile()
			p.Name = "second"
			p.Selector = CallerSelector{ServiceAccounts: []string{"widgets-system/operator", "renamed/x", "other/y"}, Namespaces: []string{"renamed"}}
			p.Groups = []GroupRename{{From: "example.com", To: "second.example.io"}}
			c.Profiles = append(c.Profiles, p)
		}, want: []string{
			// One error per mistake, on the later profile.
			"FieldValueInvalid profiles[1].selector.namespaces[0]",
			"FieldValueInvalid profiles[1].selector.serviceAccounts[0]",
			"FieldValueInvalid profiles[1].selector.serviceAccounts[1]",
		}},
		{name: "two profiles of one name", edit: func(c *RewriteConfiguration) {
			p := validProfile()
			p.Selector = CallerSelector{Namespaces: []string{"second"}}
			p.Groups = []GroupRename{{From: "other.io", To: "second.example.io"}}
			c.Profiles = append(c.Profiles, p)
		}, want: []string{"FieldValueDuplicate profiles[1].name"}},
		{name: "key domains", edit: func(c *RewriteConfiguration) {
			c.Profiles[0].Labels = []KeyDomainRename{
				{From: "example.com", To: "sub.example.com"},
				{From: "kubernetes.io", To: "x.io"},
				{From: "", To: ""},
				{From: "", To: "y.io"},
			}
			c.Profiles[0].Finalizers = []KeyDomainRename{{From: "", To: "z.io"}}
		}, want: []string{
			"FieldValueInvalid profiles[0].labels[0].to",
			"FieldValueInvalid profiles[0].labels[1].from",
			"FieldValueRequired profiles[0].labels[2].to",
			"FieldValueDuplicate profiles[0].labels[3].from",
			"FieldValueRequired profiles[0].finalizers[0].from",
		}},
		{name: "categories", edit: func(c *RewriteConfiguration) { c.Profiles[0].KeepCategories = []string{"all", "", "all"} },
			want: []string{"FieldValueRequired profiles[0].keepCategories[1]", "FieldValueDuplicate profiles[0].keepCategories[2]"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := &RewriteConfiguration{Profiles: []RewriteProfile{validProfile()}}
			c.edit(cfg)
			var served ServedGroups
			if c.served != nil {
				served = c.served
			}
			var got []string
			for _, e := range Validate(cfg, served) {
				got = append(got, string(e.Type)+" "+e.Field)
				if e.Error() == "" {
					t.Error("an error without text")
				}
			}
			if d := cmp.Diff(c.want, got); d != "" {
				t.Errorf("(-want +got):\n%s\n%v", d, Validate(cfg, served))
			}
		})
	}
}
