package store

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/watch"
)

// TestHistory drives the event window alone: positions by RV, eviction by
// count and by bytes (the floor follows the evicted events), a new epoch
// on reset and on an RV that goes back, and the ring growing and
// wrapping.
func TestHistory(t *testing.T) {
	ev := func(rv uint64, size int) *Event {
		return &Event{typ: watch.Modified, rv: rv, size: size, at: time.Unix(int64(rv), 0)}
	}
	h := newHistory(100, 1000)
	h.reset(10, true)
	for rv := uint64(11); rv <= 110; rv++ {
		h.add(ev(rv, 1))
	}
	if h.n != 100 || h.floor != 10 {
		t.Fatalf("n %d floor %d, want 100 events above 10", h.n, h.floor)
	}
	h.add(ev(111, 1))
	if h.n != 100 || h.floor != 11 {
		t.Fatalf("after one more: n %d floor %d, want 100 above 11", h.n, h.floor)
	}
	for _, tc := range []struct {
		rv     uint64
		wantRV uint64 // RV of the event at the position; 0: the end
		wantOK bool
	}{{10, 0, false}, {11, 12, true}, {50, 51, true}, {111, 0, true}, {500, 0, true}} {
		seq, ok := h.position(tc.rv)
		if ok != tc.wantOK {
			t.Errorf("position(%d) ok = %v", tc.rv, ok)
			continue
		}
		if !ok {
			continue
		}
		var got uint64
		if seq < h.seq {
			got = h.at(seq).rv
		}
		if got != tc.wantRV {
			t.Errorf("position(%d) is the event at %d, want %d", tc.rv, got, tc.wantRV)
		}
	}
	// Bytes: one big event pushes the small ones out, but never itself.
	h.add(ev(112, 995))
	if h.n != 6 || h.bytes != 1000 || h.floor != 106 {
		t.Errorf("after a big event: n %d bytes %d floor %d, want 6 events, 1000 bytes, floor 106", h.n, h.bytes, h.floor)
	}
	h.add(ev(113, 2000))
	if h.n != 1 || h.floor != 112 {
		t.Errorf("an event over the byte bound alone: n %d floor %d, want it kept alone above 112", h.n, h.floor)
	}
	// An RV that goes back starts a new epoch.
	epoch := h.epoch
	h.add(ev(100, 1))
	if h.epoch != epoch+1 || h.n != 1 || h.floor != 99 {
		t.Errorf("after an RV going back: epoch %d n %d floor %d", h.epoch, h.n, h.floor)
	}
	if oldest, _ := h.oldest(); !oldest.Equal(time.Unix(100, 0)) {
		t.Errorf("oldest %v", oldest)
	}
}
