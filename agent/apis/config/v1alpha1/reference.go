package v1alpha1

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Reader is a command that reads the configuration file: its flags and
// the top-level sections it reads (all without any).
type Reader struct {
	Name     string
	Flags    *pflag.FlagSet
	Sections []string
}

// Reference returns the Markdown reference of AgentConfiguration: one row
// per field with its type, its flag, the flag's default and the flag's
// help. A field is described by the first reader that has its flag, and
// says which readers read it.
func Reference(readers []Reader) string {
	var b strings.Builder
	b.WriteString("| Field | Type | Flag | Default | Read by | Description |\n")
	b.WriteString("|---|---|---|---|---|---|\n")
	walk(reflect.ValueOf(&AgentConfiguration{}).Elem(), nil, func(f fieldInfo) {
		var fl *pflag.Flag
		var names []string
		for _, r := range readers {
			if x := r.Flags.Lookup(f.flag); x != nil && inSections(f.path, r.Sections) {
				if fl == nil {
					fl = x
				}
				names = append(names, r.Name)
			}
		}
		if fl == nil {
			panic(fmt.Sprintf("configuration field %s: no command reads it (flag --%s)", f.path, f.flag))
		}
		def := fl.DefValue
		if def == "" || def == "[]" {
			def = "(none)"
		}
		fmt.Fprintf(&b, "| `%s` | %s | `--%s` | %s | %s | %s |\n", f.path, typeName(f.typ), f.flag,
			cell("`"+def+"`"), strings.Join(names, ", "), cell(fl.Usage))
	})
	return b.String()
}

// Fields returns the flag names of every configuration field, in order.
func Fields() []string {
	var out []string
	walk(reflect.ValueOf(&AgentConfiguration{}).Elem(), nil, func(f fieldInfo) { out = append(out, f.flag) })
	return out
}

// cell keeps a value inside one Markdown table cell.
func cell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}

func typeName(t reflect.Type) string {
	switch t {
	case reflect.TypeFor[[]string]():
		return "list of strings"
	case reflect.TypeFor[*metav1.Duration]():
		return "duration"
	case reflect.TypeFor[*bool]():
		return "boolean"
	case reflect.TypeFor[*string]():
		return "string"
	case reflect.TypeFor[*int32](), reflect.TypeFor[*int64](), reflect.TypeFor[*uint32]():
		return "integer"
	}
	return t.String()
}
