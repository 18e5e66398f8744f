package cache

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	toolscache "k8s.io/client-go/tools/cache"
)

// Object is one cached object: the decoded object as the watch delivered
// it, the attributes selectors are evaluated on, and its encodings, made on
// first use and kept until the object changes (a change replaces the whole
// Object).
//
// An Object is immutable once it is in a Store: callers must not modify Obj
// or the slices returned by Encoded.
type Object struct {
	// Labels are what label selectors match (the object's own map).
	Labels labels.Set
	// Obj is the object, with apiVersion and kind set.
	Obj runtime.Object

	// encs holds the encodings made so far; allocated on first use.
	encs atomic.Pointer[encodings]
}

type encodings [numEncodings]atomic.Pointer[[]byte]

// Encoding names a per-object byte form that the Store keeps.
type Encoding int

const (
	// EncodingJSON is the object as kube-apiserver's JSON serializer
	// writes it for a get, with kind and apiVersion and no trailing newline.
	EncodingJSON Encoding = iota
	// EncodingProtobuf is the object's protobuf message (no envelope).
	EncodingProtobuf
	// EncodingMetadataJSON and EncodingMetadataProtobuf are the object as
	// a meta.k8s.io/v1 PartialObjectMetadata, in JSON (with kind and
	// apiVersion) and as a protobuf message (no envelope).
	EncodingMetadataJSON
	EncodingMetadataProtobuf
	// numEncodings is the number of Encoding values; issue-specific forms
	// (metadata-only, Table rows) can be added before it.
	numEncodings
)

// Encoded returns o's bytes in form e, calling encode the first time and
// keeping the result for every later call. encode must not modify the
// object (concurrent first calls may both encode; one result is kept). The
// returned slice must not be modified.
func (o *Object) Encoded(e Encoding, encode func(runtime.Object) ([]byte, error)) ([]byte, error) {
	encs := o.encs.Load()
	if encs == nil {
		o.encs.CompareAndSwap(nil, &encodings{})
		encs = o.encs.Load()
	}
	if b := encs[e].Load(); b != nil {
		return *b, nil
	}
	b, err := encode(o.Obj)
	if err != nil {
		return nil, err
	}
	if !encs[e].CompareAndSwap(nil, &b) {
		return *encs[e].Load(), nil
	}
	return b, nil
}

// Key returns the object's store key: namespace/name, or name for
// cluster-scoped objects.
func (o *Object) Key() string { return keyString(o.Namespace(), o.Name()) }

// Namespace returns the object's namespace (empty for cluster-scoped
// resources). Object keeps no copy of what its object already holds.
func (o *Object) Namespace() string { return o.meta().GetNamespace() }

// Name returns the object's name.
func (o *Object) Name() string { return o.meta().GetName() }

// meta returns the object's metadata; Store admits only objects that
// have it.
func (o *Object) meta() metav1.Object {
	m, _ := meta.Accessor(o.Obj)
	return m
}

// objectKey identifies an object in a Store without allocating.
type objectKey struct{ namespace, name string }

func keyOf(o *Object) objectKey { return objectKey{o.Namespace(), o.Name()} }

func keyString(namespace, name string) string {
	if namespace == "" {
		return name
	}
	return namespace + "/" + name
}

// keyLess orders objects as kube-apiserver lists them: by the bytes of
// namespace/name (name alone for cluster-scoped objects), computed without
// building the strings.
func keyLess(a, b *Object) bool {
	aNS, aName, bNS, bName := a.Namespace(), a.Name(), b.Namespace(), b.Name()
	at := func(ns, name string, i int) (byte, bool) {
		if ns != "" {
			if i < len(ns) {
				return ns[i], true
			}
			if i == len(ns) {
				return '/', true
			}
			i -= len(ns) + 1
		}
		if i < len(name) {
			return name[i], true
		}
		return 0, false
	}
	for i := 0; ; i++ {
		x, okA := at(aNS, aName, i)
		y, okB := at(bNS, bName, i)
		switch {
		case !okA || !okB:
			return !okA && okB
		case x != y:
			return x < y
		}
	}
}

// fieldsOf returns what field selectors match on o, with the field labels
// kube-apiserver supports for the resource. It is computed on each call:
// neither the Store nor the Object keeps a copy (nor the function, which is
// the Store's), so that a Store holds little more per object than a
// client-go informer does.
func fieldsOf(attrs AttrsFunc, o *Object) fields.Set {
	if attrs == nil {
		return fields.Set{}
	}
	_, f, err := attrs(o.Obj)
	if err != nil {
		return fields.Set{}
	}
	return f
}

// AttrsFunc returns the label and field sets of an object, as
// kube-apiserver's registry computes them for selectors.
type AttrsFunc func(runtime.Object) (labels.Set, fields.Set, error)

// Predicate selects objects of a list.
type Predicate struct {
	// Namespace restricts to one namespace; empty means all.
	Namespace string
	Label     labels.Selector
	Field     fields.Selector
}

// matches reports whether o is selected; attrs computes its fields.
func (p Predicate) matches(attrs AttrsFunc, o *Object) bool {
	if p.Namespace != "" && o.Namespace() != p.Namespace {
		return false
	}
	if p.Label != nil && !p.Label.Empty() && !p.Label.Matches(o.Labels) {
		return false
	}
	if p.Field != nil && !p.Field.Empty() && !p.Field.Matches(fieldsOf(attrs, o)) {
		return false
	}
	return true
}

// Store holds the objects of one watched resource and the resource version
// the content is consistent at. A client-go Reflector fills it: it
// implements cache.ReflectorStore and cache.ResourceVersionUpdater, so
// bookmarks advance its RV too.
//
// Invariant: every object event the Store has applied has an RV ≤ RV(), and
// RV() never moves past an event it has not applied. So a Snapshot is the
// state of the resource at exactly the RV it returns.
type Store struct {
	// Fixed at construction.
	attrs    AttrsFunc
	prepare  func(runtime.Object) runtime.Object
	onChange func()

	mu sync.RWMutex // protects the fields below
	// objects by namespace and name.
	objects map[objectKey]*Object
	// sorted is objects in key order, rebuilt lazily; nil after a change.
	sorted   []*Object
	rv       uint64
	synced   bool
	replaces uint64
	// rvChanged is closed and replaced whenever rv or synced changes.
	rvChanged chan struct{}
}

var (
	_ toolscache.ReflectorStore         = (*Store)(nil)
	_ toolscache.ResourceVersionUpdater = (*Store)(nil)
)

// NewStore returns an empty, unsynced Store. attrs computes selector
// attributes; prepare (optional) is applied to each object before it is
// stored, for example to set its apiVersion and kind; onChange (optional)
// is called after each change, without the lock held.
func NewStore(attrs AttrsFunc, prepare func(runtime.Object) runtime.Object, onChange func()) *Store {
	return &Store{attrs: attrs, prepare: prepare, onChange: onChange,
		objects: map[objectKey]*Object{}, rvChanged: make(chan struct{})}
}

// ParseResourceVersion parses a resourceVersion as kube-apiserver's etcd3
// storage issues them.
func ParseResourceVersion(rv string) (uint64, error) {
	if rv == "" {
		return 0, fmt.Errorf("empty resourceVersion")
	}
	n, err := strconv.ParseUint(rv, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("resourceVersion %q is not a number: %w", rv, err)
	}
	return n, nil
}

// newObject wraps item and returns it with its resourceVersion.
func (s *Store) newObject(item any) (*Object, uint64, error) {
	obj, ok := item.(runtime.Object)
	if !ok {
		if d, isTomb := item.(toolscache.DeletedFinalStateUnknown); isTomb {
			obj, ok = d.Obj.(runtime.Object)
		}
		if !ok {
			return nil, 0, fmt.Errorf("store: unexpected item type %T", item)
		}
	}
	if s.prepare != nil {
		obj = s.prepare(obj)
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil, 0, err
	}
	var rv uint64
	if v := m.GetResourceVersion(); v != "" {
		if rv, err = ParseResourceVersion(v); err != nil {
			return nil, 0, err
		}
	}
	o := &Object{Obj: obj}
	if o.Labels, _, err = s.attrs(obj); err != nil {
		return nil, 0, err
	}
	return o, rv, nil
}

// setRVLocked advances the RV; it never goes back. Callers hold mu.
func (s *Store) setRVLocked(rv uint64) bool {
	if rv <= s.rv {
		return false
	}
	s.rv = rv
	close(s.rvChanged)
	s.rvChanged = make(chan struct{})
	return true
}

func (s *Store) put(item any, remove bool) error {
	o, rv, err := s.newObject(item)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if remove {
		delete(s.objects, keyOf(o))
	} else {
		s.objects[keyOf(o)] = o
	}
	s.sorted = nil
	// A watch event's object carries the RV of the change (for a delete,
	// the RV of the deletion).
	s.setRVLocked(rv)
	s.mu.Unlock()
	if s.onChange != nil {
		s.onChange()
	}
	return nil
}

// Add implements cache.ReflectorStore.
func (s *Store) Add(obj any) error { return s.put(obj, false) }

// Update implements cache.ReflectorStore.
func (s *Store) Update(obj any) error { return s.put(obj, false) }

// Delete implements cache.ReflectorStore.
func (s *Store) Delete(obj any) error { return s.put(obj, true) }

// Resync implements cache.ReflectorStore; there is nothing to resync.
func (s *Store) Resync() error { return nil }

// Replace implements cache.ReflectorStore: the result of a (re)list or the
// initial events of a watch-list, consistent at resourceVersion. The Store
// is synced from then on. Unlike event RVs, a relist may move the RV back
// (for example after etcd was restored); the list is the truth.
func (s *Store) Replace(items []any, resourceVersion string) error {
	objects := make(map[objectKey]*Object, len(items))
	for _, item := range items {
		o, _, err := s.newObject(item)
		if err != nil {
			return err
		}
		objects[keyOf(o)] = o
	}
	rv, err := ParseResourceVersion(resourceVersion)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.objects, s.sorted = objects, nil
	s.replaces++
	if rv != s.rv || !s.synced {
		s.rv, s.synced = rv, true
		close(s.rvChanged)
		s.rvChanged = make(chan struct{})
	}
	s.mu.Unlock()
	if s.onChange != nil {
		s.onChange()
	}
	return nil
}

// UpdateResourceVersion implements cache.ResourceVersionUpdater: the
// reflector calls it after each watch event and bookmark.
func (s *Store) UpdateResourceVersion(resourceVersion string) {
	rv, err := ParseResourceVersion(resourceVersion)
	if err != nil {
		return
	}
	s.mu.Lock()
	changed := s.setRVLocked(rv)
	s.mu.Unlock()
	if changed && s.onChange != nil {
		s.onChange()
	}
}

// Synced reports whether the Store has been filled by a list or the
// initial events of a watch-list.
func (s *Store) Synced() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.synced
}

// Replaces returns how many times Replace has been called.
func (s *Store) Replaces() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.replaces
}

// ResourceVersion returns the RV the content is consistent at (0 before the
// first sync).
func (s *Store) ResourceVersion() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.rv
}

// Len returns the number of objects.
func (s *Store) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.objects)
}

// Get returns the object namespace/name (namespace empty for
// cluster-scoped resources) and the RV the answer is consistent at.
func (s *Store) Get(namespace, name string) (o *Object, rv uint64, ok bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	o, ok = s.objects[objectKey{namespace, name}]
	return o, s.rv, ok
}

// Snapshot returns the objects p selects, in kube-apiserver's list order
// (by key: namespace/name, bytewise), and the RV the result is consistent
// at. The slice is the caller's; the Objects are shared and immutable.
func (s *Store) Snapshot(p Predicate) ([]*Object, uint64) {
	all, rv := s.sortedSnapshot()
	out := make([]*Object, 0, len(all))
	for _, o := range all {
		if p.matches(s.attrs, o) {
			out = append(out, o)
		}
	}
	return out, rv
}

// sortedSnapshot returns every object in key order and the RV, sorting at
// most once per change.
func (s *Store) sortedSnapshot() ([]*Object, uint64) {
	s.mu.RLock()
	sorted, rv := s.sorted, s.rv
	s.mu.RUnlock()
	if sorted != nil {
		return sorted, rv
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sorted == nil {
		sorted := make([]*Object, 0, len(s.objects))
		for _, o := range s.objects {
			sorted = append(sorted, o)
		}
		sort.Slice(sorted, func(i, j int) bool { return keyLess(sorted[i], sorted[j]) })
		s.sorted = sorted
	}
	return s.sorted, s.rv
}

// WaitForResourceVersion blocks until the Store is synced at an RV ≥ rv,
// or ctx ends (then it returns ctx's error).
func (s *Store) WaitForResourceVersion(ctx context.Context, rv uint64) error {
	for {
		s.mu.RLock()
		ok, ch := s.synced && s.rv >= rv, s.rvChanged
		s.mu.RUnlock()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}
