package rewriting

import (
	"crypto/sha256"
	"sync"
)

// memos are a profile's memos: rewritten objects (whole answers) and
// rewritten watch events apart, since the same bytes are rewritten
// differently as one or the other.
type memos struct {
	objects, events *memo
}

// defaultMemoBytes bounds each of a profile's memos.
const defaultMemoBytes = 32 << 20

// memo keeps the rewritten form of recent objects and events of one
// profile, by the SHA-256 of their bytes: an object the cache serves to
// many selected callers, or an event fanned out to many selected
// watchers, is rewritten once, not once per request. When the memo is
// full it starts over.
type memo struct {
	mu    sync.Mutex // protects the fields below
	max   int
	bytes int
	m     map[[sha256.Size]byte][]byte
}

func newMemo(max int) *memo {
	return &memo{max: max, m: map[[sha256.Size]byte][]byte{}}
}

// memoMaxObjectBytes bounds the inputs kept in a memo: single objects
// and events, not lists.
const memoMaxObjectBytes = 256 << 10

// do returns fn(in), from the memo when in was rewritten before; inputs
// larger than memoMaxObjectBytes are always rewritten. The answer is
// shared: callers must not change it.
func (m *memo) do(in []byte, fn func([]byte) ([]byte, error)) ([]byte, error) {
	if m == nil || len(in) > memoMaxObjectBytes {
		return fn(in)
	}
	key := sha256.Sum256(in)
	m.mu.Lock()
	out, ok := m.m[key]
	m.mu.Unlock()
	if ok {
		return out, nil
	}
	out, err := fn(in)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.bytes+len(out) > m.max {
		clear(m.m)
		m.bytes = 0
	}
	if len(out) <= m.max {
		m.m[key] = out
		m.bytes += len(out)
	}
	return out, nil
}
