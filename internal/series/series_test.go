package series

import (
	"sync"
	"testing"
)

// TestGet: each key's child is made once, however many callers ask for it
// at once, and each key gets its own.
func TestGet(t *testing.T) {
	var mu sync.Mutex
	made := map[string]int{}
	s := &Of[string, *int]{New: func(k string) *int {
		mu.Lock()
		defer mu.Unlock()
		made[k]++
		return new(int)
	}}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for _, k := range []string{"a", "b", "a"} {
				_ = s.Get(k)
			}
		})
	}
	wg.Wait()
	if made["a"] != 1 || made["b"] != 1 {
		t.Errorf("children made %v, want one per key", made)
	}
	if s.Get("a") == s.Get("b") {
		t.Errorf("two keys share a child")
	}
}
