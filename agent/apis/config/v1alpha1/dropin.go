package v1alpha1

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

// DropInExtension is the name suffix of the drop-in files LoadWithDropIns
// reads; other files in the directory are ignored.
const DropInExtension = ".yaml"

// LoadWithDropIns reads the configuration file at path and merges over it,
// in lexical order of their names, the drop-in files of dir: every file
// whose name ends in DropInExtension and does not start with a dot (the
// kubelet's ConfigMap volumes keep their bookkeeping under such names). A
// drop-in is a partial AgentConfiguration: it carries apiVersion and kind,
// and is decoded strictly on its own, so that a misspelt field is an error
// naming its file. The documents are merged as JSON merge patches
// (RFC 7386), as the kubelet merges its --config-dir: a drop-in's map
// merges into the one before, anything else (a list, a value) replaces it,
// and null removes the field, which then falls back to its flag's default.
//
// Either may be empty: no path means an empty base, no dir no drop-ins. A
// dir that does not exist is an error (a mistyped --config-dir must not go
// unnoticed); an empty one is not. The file at path is skipped when it
// lies in dir, so that one ConfigMap mounted as a directory can hold both
// the main file and its drop-ins. The names of the drop-ins merged are
// returned, in the order they were merged.
func LoadWithDropIns(path, dir string) (*AgentConfiguration, []string, error) {
	if dir == "" {
		if path == "" {
			return &AgentConfiguration{}, nil, nil
		}
		c, err := Load(path)
		return c, nil, err
	}
	merged := map[string]any{"apiVersion": SchemeGroupVersion.String(), "kind": "AgentConfiguration"}
	if path != "" {
		doc, err := readDocument(path)
		if err != nil {
			return nil, nil, err
		}
		merged = doc
	}
	files, err := dropIns(dir, path)
	if err != nil {
		return nil, nil, err
	}
	for _, f := range files {
		doc, err := readDocument(f)
		if err != nil {
			return nil, nil, fmt.Errorf("drop-in %w", err)
		}
		merged = mergePatch(merged, doc).(map[string]any)
	}
	c, err := decodeMerged(merged)
	if err != nil {
		return nil, nil, fmt.Errorf("the drop-ins of %s merged: %w", dir, err)
	}
	return c, files, nil
}

// MergeData is LoadWithDropIns for a ConfigMap's data, as the ConfigMap
// mounted as a directory reads: the key main is the configuration file,
// every other key ending in DropInExtension and not starting with a dot a
// drop-in, merged over it in lexical order. The agent's watch of the kill
// switch's ConfigMap reads it this way, so that an interception.enabled
// set in a drop-in counts there as it does at start-up. A missing main
// key is an error: the data is not this configuration.
func MergeData(data map[string]string, main string) (*AgentConfiguration, error) {
	text, ok := data[main]
	if !ok {
		return nil, fmt.Errorf("no key %s", main)
	}
	merged, err := parseDocument([]byte(text))
	if err != nil {
		return nil, fmt.Errorf("key %s: %w", main, err)
	}
	keys := slices.Sorted(maps.Keys(data))
	for _, k := range keys {
		if k == main || strings.HasPrefix(k, ".") || !strings.HasSuffix(k, DropInExtension) {
			continue
		}
		doc, err := parseDocument([]byte(data[k]))
		if err != nil {
			return nil, fmt.Errorf("drop-in key %s: %w", k, err)
		}
		merged = mergePatch(merged, doc).(map[string]any)
	}
	c, err := decodeMerged(merged)
	if err != nil {
		return nil, fmt.Errorf("the keys merged: %w", err)
	}
	return c, nil
}

// decodeMerged decodes a merged document strictly.
func decodeMerged(merged map[string]any) (*AgentConfiguration, error) {
	data, err := json.Marshal(merged)
	if err != nil {
		return nil, err
	}
	return Decode(data)
}

// dropIns lists dir's drop-in files in lexical order, without skip.
func dropIns(dir, skip string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("configuration drop-in directory: %w", err)
	}
	skipAbs := ""
	if skip != "" {
		if skipAbs, err = filepath.Abs(skip); err != nil {
			return nil, err
		}
	}
	var files []string
	for _, e := range entries { // os.ReadDir sorts by name
		name := e.Name()
		if strings.HasPrefix(name, ".") || !strings.HasSuffix(name, DropInExtension) {
			continue
		}
		p := filepath.Join(dir, name)
		if abs, err := filepath.Abs(p); err == nil && abs == skipAbs {
			continue
		}
		// Stat follows the symbolic links a ConfigMap volume's keys are.
		fi, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("configuration drop-in: %w", err)
		}
		if fi.IsDir() {
			continue
		}
		files = append(files, p)
	}
	return files, nil
}

// readDocument reads one configuration document, checks it strictly with
// Decode (apiVersion, kind, known and unique fields), and returns it as
// the JSON object it stands for. Errors name the file.
func readDocument(path string) (map[string]any, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	doc, err := parseDocument(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return doc, nil
}

// parseDocument checks one configuration document strictly with Decode
// (apiVersion, kind, known and unique fields) and returns it as the JSON
// object it stands for.
func parseDocument(data []byte) (map[string]any, error) {
	if _, err := Decode(data); err != nil {
		return nil, err
	}
	j, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, err
	}
	var doc map[string]any
	if err := json.Unmarshal(j, &doc); err != nil {
		return nil, err
	}
	if doc == nil {
		return nil, errors.New("not a YAML mapping")
	}
	return doc, nil
}

// mergePatch applies patch to target as RFC 7386 defines it: objects merge
// key by key, a null removes its key, and anything else replaces the
// target's value. target is modified.
func mergePatch(target, patch any) any {
	p, ok := patch.(map[string]any)
	if !ok {
		return patch
	}
	t, ok := target.(map[string]any)
	if !ok {
		t = map[string]any{}
	}
	for k, v := range p {
		if v == nil {
			delete(t, k)
			continue
		}
		t[k] = mergePatch(t[k], v)
	}
	return t
}
