package lockside_test

import (
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/lockside/lockside/clients/go"
)

// The release rule (issue 35): Unlock returns once its Release is on the stream, not
// when the sidecar answers. A frozen sidecar cannot answer: Unlock returns anyway.
func TestUnlockReturnsOnceTheReleaseIsSent(t *testing.T) {
	sc := startSidecar(t, "memory")
	c := connect(t, sc.addr)
	ctx := within(t, 20*time.Second)
	l, err := c.Lock(ctx, "release/sent")
	if err != nil {
		t.Fatal(err)
	}
	sc.signal(syscall.SIGSTOP)
	started := time.Now()
	err = l.Unlock(ctx)
	took := time.Since(started)
	sc.signal(syscall.SIGCONT)
	if err != nil {
		t.Fatal(err)
	}
	// (The client's health check would break the stream after about 1 s.)
	if took > 300*time.Millisecond {
		t.Fatalf("Unlock took %v: it waited for the frozen sidecar's answer", took)
	}
	if l.State() != lockside.Released {
		t.Fatalf("after Unlock the lock is %s", l.State())
	}
	// Answered after the thaw: the key is free.
	if _, err := c.Describe(ctx, "release/sent"); err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatalf("a second Unlock: %v", err)
	}
}

// What this process asks of a key after Unlock is ordered after the release: another
// Client's TryLock never finds the key busy, and Describe shows no holder.
func TestALockAfterAnUnlockInTheProcessFindsTheKeyFree(t *testing.T) {
	redis := startRedis(t)
	sc := startSidecar(t, redis.url())
	a, b := connect(t, sc.addr), connect(t, sc.addr)
	ctx := within(t, 30*time.Second)
	for round := 0; round < 30; round++ {
		key := fmt.Sprintf("release/ordered/%d", round%3)
		l, err := a.TryLock(ctx, key)
		if err != nil {
			t.Fatalf("round %d: a: %v", round, err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if round%2 == 1 {
			st, err := b.Describe(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if len(st.Holders) != 0 {
				t.Fatalf("round %d: Describe after Unlock shows %d holder(s)", round, len(st.Holders))
			}
		}
		next, err := b.TryLock(ctx, key)
		if errors.Is(err, lockside.ErrNotAcquired) {
			t.Fatalf("round %d: the key was busy right after Unlock", round)
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := next.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
