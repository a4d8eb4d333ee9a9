package lockside_test

import (
	"errors"
	"testing"
	"time"

	"github.com/lockside/lockside/clients/go"
)

// Issue 32: a sidecar killed right after a grant gives the lock back on resume.
func TestASidecarKilledRightAfterAGrantGivesTheLockBackOnResume(t *testing.T) {
	redis := startRedis(t)
	sc := startSidecar(t, redis.url())
	c := connect(t, sc.addr)
	ctx := within(t, 30*time.Second)
	l, err := c.Lock(ctx, "granted/killed", lockside.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	token := l.FencingToken()
	// Killed right after the grant: the sidecar names a grant in the session's record
	// before it answers Granted (issue 32, item 3), so the lock comes back.
	sc.kill()
	awaitState(t, l, lockside.Suspended, 5*time.Second)
	sc.start()
	awaitState(t, l, lockside.Held, 10*time.Second)
	if l.FencingToken() != token {
		t.Fatalf("restored with token %d, want %d", l.FencingToken(), token)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// Issue 32: a session the sidecar does not know (refused with lockside-resume-refused
// "unknown") loses its locks at once, and the same client locks another key on a new
// session within a second of the sidecar being back, not after the lock's TTL.
func TestAfterAnUnknownSessionTheSameClientLocksAnotherKeyWithinASecond(t *testing.T) {
	redis := startRedis(t)
	sc := startSidecar(t, redis.url())
	c := connect(t, sc.addr)
	ctx := within(t, 30*time.Second)
	l, err := c.Lock(ctx, "forgotten/held", lockside.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	before := c.SessionID()
	sc.kill()
	awaitState(t, l, lockside.Suspended, 5*time.Second)
	if _, err := redis.do("FLUSHALL"); err != nil { // the session's record is gone: its token is unknown
		t.Fatal(err)
	}
	sc.start()
	back := time.Now()
	other, err := c.Lock(ctx, "forgotten/other", lockside.WithWait(5*time.Second))
	if err != nil {
		t.Fatalf("another key after the refused resume: %v", err)
	}
	if took := time.Since(back); took > time.Second {
		t.Fatalf("granted %v after the sidecar was back: it waited for the lock's TTL", took)
	}
	select {
	case <-l.Lost():
	case <-time.After(time.Second):
		t.Fatalf("the refused session's lock is %s, want lost", l.State())
	}
	if !errors.Is(l.Err(), lockside.ErrLost) || c.SessionID() == before {
		t.Fatalf("err %v, session %s (was %s)", l.Err(), c.SessionID(), before)
	}
	if err := other.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
