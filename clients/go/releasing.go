package lockside

import (
	"context"
	"sync"
	"time"
)

// Releases written and not answered yet, process-wide: what makes an Unlock that
// returns without waiting for its answer invisible to the rest of the process (the
// client core's rule, crates/lockside-client/src/releasing.rs).
//
// Unlock returns once its Release is on the stream. Every Lock call is a holder of its
// own, so a later Lock of the key (on this Client or another, here or on another
// sidecar) is not ordered after that Release by the sidecar, and neither is a
// Describe or a Watch: each waits here until the key's releases in flight are
// answered (or answerSlack has passed, or its ctx ended), so that within one process a
// key unlocked is free, exactly as if Unlock had waited.

// answerSlack bounds how long a request waits for releases in flight: the sidecar
// answers every release at once, so only a broken sidecar or network takes this long.
const answerSlack = 10 * time.Second

var releasing = struct {
	sync.Mutex
	keys     map[string]int // releases in flight by key
	answered chan struct{}  // closed (and replaced) when one is answered
}{keys: make(map[string]int), answered: make(chan struct{})}

// inFlight is one release of a key in flight; done (once) when it is answered or
// never will be.
type inFlight struct {
	key  string
	once sync.Once
}

func releaseSent(key string) *inFlight {
	releasing.Lock()
	releasing.keys[key]++
	releasing.Unlock()
	return &inFlight{key: key}
}

func (f *inFlight) done() {
	if f == nil {
		return
	}
	f.once.Do(func() {
		releasing.Lock()
		defer releasing.Unlock()
		if releasing.keys[f.key]--; releasing.keys[f.key] <= 0 {
			delete(releasing.keys, f.key)
		}
		close(releasing.answered)
		releasing.answered = make(chan struct{})
	})
}

// settled waits until no release of key is in flight, answerSlack at most; false when
// ctx ended first.
func settled(ctx context.Context, key string) bool {
	var timeout <-chan time.Time
	for {
		releasing.Lock()
		busy, answered := releasing.keys[key] > 0, releasing.answered
		releasing.Unlock()
		if !busy {
			return true
		}
		if timeout == nil {
			timer := time.NewTimer(answerSlack)
			defer timer.Stop()
			timeout = timer.C
		}
		select {
		case <-answered:
		case <-timeout:
			return true
		case <-ctx.Done():
			return false
		}
	}
}
