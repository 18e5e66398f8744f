package v1alpha1

import (
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kube-apicache/kube-apicache/agent/apis/internal/kindfile"
)

var decoder = kindfile.NewDecoder[*AgentConfiguration](AddToScheme, SchemeGroupVersion, "AgentConfiguration")

// Decode parses an AgentConfiguration (YAML or JSON). apiVersion and kind
// are required; unknown and duplicate fields are errors.
func Decode(data []byte) (*AgentConfiguration, error) { return decoder.Decode(data) }

// Load reads and decodes the file at path.
func Load(path string) (*AgentConfiguration, error) { return decoder.Load(path) }

// Applied records, for each flag the file set, the field that set it, so
// that later errors naming the flag can name the field too.
type Applied map[string]*field.Path

// Override is a field of the file that the command line overrode: its
// flag was set there too, and the command line's value won.
type Override struct {
	// Flag is the flag's name, without dashes; Field the field's path.
	Flag  string
	Field *field.Path
	// FlagValue is the command line's value, FileValue the file's, each
	// as the flag prints it.
	FlagValue, FileValue string
}

// ApplyToFlags sets every flag of fs that c gives a value and the command
// line did not set. Only the fields of the named top-level sections are
// looked at (all of them without any), and fields whose flag fs lacks are
// skipped: each command reads the sections that concern it, so that a flag
// of the same name meaning something else there (the approver's own
// metrics address) is never set by the agent's field. Each value goes
// through the flag's own parser, so the file accepts exactly what the flag
// accepts; errors carry the field path. The fields whose flag the command
// line had set are returned as overrides, for the caller to report: an
// edit of such a field has no effect.
func ApplyToFlags(c *AgentConfiguration, fs *pflag.FlagSet, sections ...string) (Applied, []Override, error) {
	applied := Applied{}
	var overrides []Override
	var errs field.ErrorList
	walk(reflect.ValueOf(c).Elem(), nil, func(f fieldInfo) {
		if f.value.IsNil() || !inSections(f.path, sections) {
			return
		}
		fl := fs.Lookup(f.flag)
		if fl == nil {
			return
		}
		s := flagValue(f.value)
		if fl.Changed {
			overrides = append(overrides, Override{Flag: f.flag, Field: f.path, FlagValue: fl.Value.String(), FileValue: s})
			return
		}
		// A list flag appends once changed; start it over so the file's
		// list replaces the default rather than adding to it.
		if sv, ok := fl.Value.(pflag.SliceValue); ok {
			list := []string{}
			if s != "" {
				list = strings.Split(s, ",")
			}
			if err := sv.Replace(list); err != nil {
				errs = append(errs, field.Invalid(f.path, s, err.Error()))
				return
			}
			fl.Changed = true
			applied[f.flag] = f.path
			return
		}
		if err := fs.Set(f.flag, s); err != nil {
			errs = append(errs, field.Invalid(f.path, s, err.Error()))
			return
		}
		applied[f.flag] = f.path
	})
	return applied, overrides, errs.ToAggregate()
}

// inSections says whether path lies in one of sections; no sections means
// all of them.
func inSections(path *field.Path, sections []string) bool {
	if len(sections) == 0 {
		return true
	}
	return slices.Contains(sections, strings.SplitN(path.String(), ".", 2)[0])
}

// flagRef matches a flag named in an error message.
var flagRef = regexp.MustCompile(`--[a-z0-9]+(-[a-z0-9]+)*`)

// Annotate adds the configuration field to each flag an error message
// names, where the file set that flag: "--service-vip (cluster.serviceVIPs)".
func (a Applied) Annotate(err error) error {
	if err == nil || len(a) == 0 {
		return err
	}
	msg := err.Error()
	done := map[string]bool{}
	out := flagRef.ReplaceAllStringFunc(msg, func(m string) string {
		p, ok := a[strings.TrimPrefix(m, "--")]
		if !ok || done[m] {
			return m
		}
		done[m] = true
		return m + " (config field " + p.String() + ")"
	})
	if out == msg {
		return err
	}
	return annotated{msg: out, err: err}
}

type annotated struct {
	msg string
	err error
}

func (a annotated) Error() string { return a.msg }
func (a annotated) Unwrap() error { return a.err }

// fieldInfo is one leaf field of AgentConfiguration.
type fieldInfo struct {
	path  *field.Path
	flag  string
	value reflect.Value
	typ   reflect.Type
	doc   string
}

// walk calls fn for every leaf field with a flag tag, depth first in
// declaration order.
func walk(v reflect.Value, path *field.Path, fn func(fieldInfo)) {
	t := v.Type()
	for i := range t.NumField() {
		sf := t.Field(i)
		if sf.Anonymous {
			continue
		}
		name, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
		var p *field.Path
		if path == nil {
			p = field.NewPath(name)
		} else {
			p = path.Child(name)
		}
		if flag := sf.Tag.Get("flag"); flag != "" {
			fn(fieldInfo{path: p, flag: flag, value: v.Field(i), typ: sf.Type})
			continue
		}
		if sf.Type.Kind() == reflect.Struct {
			walk(v.Field(i), p, fn)
		}
	}
}

// flagValue renders a set field the way its flag parses it.
func flagValue(v reflect.Value) string {
	switch x := v.Interface().(type) {
	case []string:
		return strings.Join(x, ",")
	case *metav1.Duration:
		return x.Duration.String()
	case *string:
		return *x
	case *bool:
		return strconv.FormatBool(*x)
	case *int32:
		return strconv.FormatInt(int64(*x), 10)
	case *int64:
		return strconv.FormatInt(*x, 10)
	case *uint32:
		return strconv.FormatUint(uint64(*x), 10)
	case *time.Duration:
		return x.String()
	}
	panic(fmt.Sprintf("configuration field of unexpected type %s", v.Type()))
}
