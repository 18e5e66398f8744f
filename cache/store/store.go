package store

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
)

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

// matches reports whether o is selected; attrs computes the selector
// attributes of objects that keep their decoded form.
func (p Predicate) matches(attrs AttrsFunc, o *Object) bool {
	if p.Namespace != "" && o.Namespace() != p.Namespace {
		return false
	}
	label := p.Label != nil && !p.Label.Empty()
	field := p.Field != nil && !p.Field.Empty()
	if !label && !field {
		return true
	}
	l, f := o.selectable(attrs)
	return (!label || p.Label.Matches(l)) && (!field || p.Field.Matches(f))
}

// Store holds the objects of one watched resource and the resource version
// the content is consistent at. A client-go Reflector fills it: it
// implements cache.ReflectorStore and cache.ResourceVersionUpdater, so
// bookmarks advance its RV too.
//
// Invariant: every object event the Store has applied has an RV ≤ RV(), and
// RV() never moves past an event it has not applied. So a Snapshot is the
// state of the resource at exactly the RV it returns. The one exception is
// an upstream whose RV went back (etcd restored from a backup): the Store
// follows it back, ends its watches so that their clients relist, and is
// whole again once its informer has relisted (history.go).
type Store struct {
	// Fixed at construction.
	attrs    AttrsFunc
	prepare  func(runtime.Object) runtime.Object
	onChange func()

	// codec decodes the stored protobuf messages; set by the first
	// built-in object, replaced if the type ever changes. fieldKeys is the
	// latest packed field-key list, shared by objects that have the same.
	codec     atomic.Pointer[protoCodec]
	fieldKeys atomic.Pointer[string]

	mu sync.RWMutex // protects the fields below
	// objects by key (namespace/name, or name).
	objects map[string]*Object
	// sorted is objects in key order, rebuilt lazily; nil after a change.
	sorted   []*Object
	rv       uint64
	synced   bool
	replaces uint64
	// closed: the Store's informer stopped; it will not change again.
	closed bool
	// rvChanged is closed and replaced whenever rv, synced or closed
	// changes, or an event is added to hist.
	rvChanged chan struct{}
	// hist is the window of recent events (history.go).
	hist *history
	// now stamps events; time.Now unless a test sets it.
	now func() time.Time
}

// NewStore returns an empty, unsynced Store. attrs computes selector
// attributes; prepare (optional) is applied to each object before it is
// stored, for example to set its apiVersion and kind; onChange (optional)
// is called after each change, without the lock held.
func NewStore(attrs AttrsFunc, prepare func(runtime.Object) runtime.Object, onChange func()) *Store {
	return &Store{attrs: attrs, prepare: prepare, onChange: onChange,
		objects: map[string]*Object{}, rvChanged: make(chan struct{}),
		hist: newHistory(0, 0), now: time.Now}
}

// SetHistoryBounds bounds the Store's event window to maxEvents events
// and maxBytes of objects (zero or less: the defaults). The window keeps
// the events it holds until the next one is added.
func (s *Store) SetHistoryBounds(maxEvents, maxBytes int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := newHistory(maxEvents, maxBytes)
	s.hist.maxEvents, s.hist.maxBytes = b.maxEvents, b.maxBytes
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
		return nil, 0, fmt.Errorf("store: unexpected item type %T", item)
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
	o, err := s.compact(obj, m.GetNamespace(), m.GetName())
	if err != nil {
		return nil, 0, err
	}
	o.rv = rv
	return o, rv, nil
}

// compact returns the Object of obj: a built-in object as its protobuf
// message with its packed selector attributes, anything else as it is.
func (s *Store) compact(obj runtime.Object, namespace, name string) (*Object, error) {
	o := &Object{key: Key(namespace, name)}
	po, isProto := obj.(protoObject)
	if !isProto {
		o.obj = obj
		return o, nil
	}
	var ls labels.Set
	var fs fields.Set
	if s.attrs != nil {
		var err error
		if ls, fs, err = s.attrs(obj); err != nil {
			return nil, err
		}
	}
	lp, okLabels := packMap(ls)
	keys, values, okFields := packFields(fs)
	if !okLabels || !okFields {
		o.obj = obj
		return o, nil
	}
	raw, err := po.Marshal()
	if err != nil {
		return nil, fmt.Errorf("encoding %s %s: %w", obj.GetObjectKind().GroupVersionKind().Kind, o.key, err)
	}
	codec := s.codec.Load()
	if !codec.matches(obj) {
		codec = &protoCodec{typ: reflect.TypeOf(obj).Elem(), gvk: obj.GetObjectKind().GroupVersionKind()}
		s.codec.Store(codec)
	}
	if k := s.fieldKeys.Load(); k != nil && *k == keys {
		keys = *k
	} else {
		s.fieldKeys.Store(&keys)
	}
	o.labels, o.fieldKeys, o.fieldValues, o.raw, o.codec = lp, keys, values, raw, codec
	return o, nil
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

func (s *Store) put(item any, typ watch.EventType) error {
	// A deletion's object is kept whole too: it is the DELETED event's.
	o, rv, err := s.newObject(item)
	if err != nil {
		return err
	}
	s.mu.Lock()
	prev := s.objects[o.key]
	if typ == watch.Deleted {
		delete(s.objects, o.key)
	} else {
		s.objects[o.key] = o
	}
	s.sorted = nil
	if s.synced && rv != 0 && rv <= s.rv {
		// The RV went back: the upstream's history is not the one the
		// Store followed (etcd restored from a backup). Like a relist
		// that goes back, it starts a new window at the event and ends
		// the watches of the old one with 410, so that their clients
		// relist; the Store's RV follows the upstream's, so that a watch
		// from now does not skip the events up to the old RV. (The
		// informer's watch has already been ended, and it relists:
		// healthWatch.)
		s.hist.wentBack(rv - 1)
		s.rv = rv
	}
	if s.synced {
		e := &Event{typ: typ, obj: o, prev: prev, rv: rv, at: s.now(), size: objectSize(o)}
		s.hist.add(e)
	}
	// A watch event's object carries the RV of the change (for a delete,
	// the RV of the deletion). Watches of the history wait on rvChanged.
	if !s.setRVLocked(rv) {
		close(s.rvChanged)
		s.rvChanged = make(chan struct{})
	}
	s.mu.Unlock()
	if s.onChange != nil {
		s.onChange()
	}
	return nil
}

// Add implements cache.ReflectorStore.
func (s *Store) Add(obj any) error { return s.put(obj, watch.Added) }

// Update implements cache.ReflectorStore.
func (s *Store) Update(obj any) error { return s.put(obj, watch.Modified) }

// Delete implements cache.ReflectorStore.
func (s *Store) Delete(obj any) error { return s.put(obj, watch.Deleted) }

// Resync implements cache.ReflectorStore; there is nothing to resync.
func (s *Store) Resync() error { return nil }

// Replace implements cache.ReflectorStore: the result of a (re)list or the
// initial events of a watch-list, consistent at resourceVersion. The Store
// is synced from then on. A relist may move the RV back (for example
// after etcd was restored); the list is the truth.
func (s *Store) Replace(items []any, resourceVersion string) error {
	objects := make(map[string]*Object, len(items))
	for _, item := range items {
		o, _, err := s.newObject(item)
		if err != nil {
			return err
		}
		objects[o.key] = o
	}
	rv, err := ParseResourceVersion(resourceVersion)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.objects, s.sorted = objects, nil
	s.replaces++
	// The events since the last list are not known: a new window starts
	// at the list, and the watches of the old one end; if the list is
	// older than the Store was, their clients must relist (history.go).
	if s.synced && rv < s.rv {
		s.hist.wentBack(rv)
	} else {
		s.hist.reset(rv, true)
	}
	// Waiters are woken even if the RV is the same: the watches of the
	// old window must see that it ended.
	s.rv, s.synced = rv, true
	close(s.rvChanged)
	s.rvChanged = make(chan struct{})
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

// Changed returns a channel closed at the Store's next change (an event,
// a list, a new RV or Close), and whether the Store is closed already.
func (s *Store) Changed() (<-chan struct{}, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.rvChanged, s.closed
}

// Matches reports whether the Store is synced and holds at least the state
// at rv: its RV is rv or later, or it holds exactly the objects of versions
// (key → resourceVersion, the upstream's state at rv), each at that
// resourceVersion.
func (s *Store) Matches(rv uint64, versions map[string]uint64) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if !s.synced {
		return false
	}
	if s.rv >= rv {
		return true
	}
	if len(s.objects) != len(versions) {
		return false
	}
	for key, o := range s.objects {
		if v, ok := versions[key]; !ok || v != o.rv {
			return false
		}
	}
	return true
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
	if namespace == "" {
		o, ok = s.objects[name]
		return o, s.rv, ok
	}
	var buf [128]byte
	key := append(append(append(buf[:0], namespace...), '/'), name...)
	o, ok = s.objects[string(key)]
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

// Selects reports whether p selects o, an object of the Store.
func (s *Store) Selects(p Predicate, o *Object) bool {
	return p.matches(s.attrs, o)
}

// Count returns the number of objects p selects.
func (s *Store) Count(p Predicate) int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	n := 0
	for _, o := range s.objects {
		if p.matches(s.attrs, o) {
			n++
		}
	}
	return n
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
	return s.sortedLocked(), s.rv
}

// sortedLocked returns every object in key order; s.mu must be held for
// writing.
func (s *Store) sortedLocked() []*Object {
	if s.sorted == nil {
		sorted := make([]*Object, 0, len(s.objects))
		for _, o := range s.objects {
			sorted = append(sorted, o)
		}
		// kube-apiserver lists by key, bytewise.
		slices.SortFunc(sorted, func(a, b *Object) int { return strings.Compare(a.key, b.key) })
		s.sorted = sorted
	}
	return s.sorted
}

// ErrStoreClosed is returned by WaitForResourceVersion once the Store's
// informer has stopped.
var ErrStoreClosed = errors.New("store: the informer filling it stopped")

// Close marks the Store as no longer filled: waits for a resourceVersion it
// has not reached end with ErrStoreClosed. Its content stays readable.
func (s *Store) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		close(s.rvChanged)
		s.rvChanged = make(chan struct{})
	}
}

// WaitForResourceVersion blocks until the Store is synced at an RV ≥ rv,
// or ctx ends (then it returns ctx's error), or the Store is closed (then
// it returns ErrStoreClosed).
func (s *Store) WaitForResourceVersion(ctx context.Context, rv uint64) error {
	for {
		s.mu.RLock()
		ok, closed, ch := s.synced && s.rv >= rv, s.closed, s.rvChanged
		s.mu.RUnlock()
		if ok {
			return nil
		}
		if closed {
			return ErrStoreClosed
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}
