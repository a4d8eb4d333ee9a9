package lockside_test

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/lockside/lockside/clients/go"
)

func TestASidecarRestartOnRedisSuspendsThenRestoresTheLock(t *testing.T) {
	redis := startRedis(t)
	sc := startSidecar(t, redis.url())
	c := connect(t, sc.addr)
	ctx := within(t, 20*time.Second)

	l, err := c.Lock(ctx, "survivor", lockside.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	token, session := l.FencingToken(), c.SessionID()
	awaitRecorded(t, redis, session, l)
	sc.kill()
	awaitState(t, l, lockside.Suspended, time.Second)
	if !l.Suspended() {
		t.Fatalf("after the kill the lock is %s, want suspended", l.State())
	}
	sc.start() // the same address
	awaitState(t, l, lockside.Held, 4*time.Second)
	if l.FencingToken() != token || c.SessionID() != session {
		t.Fatalf("restored with token %d in session %s, want %d in %s", l.FencingToken(), c.SessionID(), token, session)
	}
	// Held for real: the restarted sidecar renews it and nobody else gets it.
	other := connect(t, sc.addr)
	if _, err := other.TryLock(ctx, "survivor"); !errors.Is(err, lockside.ErrNotAcquired) {
		t.Fatalf("another client got a restored lock: %v", err)
	}
	st, err := other.Describe(ctx, "survivor")
	if err != nil || len(st.Holders) != 1 || st.Holders[0].FencingToken != token || st.Holders[0].Holder != l.Holder() {
		t.Fatalf("describe after the resume: %+v, %v", st, err)
	}
	// The session works as before.
	l2, err := c.Lock(ctx, "after-resume")
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range []*lockside.Lock{l, l2} {
		if err := x.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := other.TryLock(ctx, "survivor"); err != nil {
		t.Fatalf("after Unlock: %v", err)
	}
}

// The memory store dies with its sidecar: nothing can be resumed. (A store that
// cannot resume at all sends an empty resume token, and the lock is lost at once; this
// sidecar's memory store sends one, refuses it after the restart, and the lock is lost
// when its TTL has passed since the break.)
func TestASidecarKillWithTheMemoryStoreLosesTheLock(t *testing.T) {
	sc := startSidecar(t, "memory")
	c := connect(t, sc.addr)
	ctx := within(t, 10*time.Second)
	l, err := c.Lock(ctx, "ephemeral", lockside.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	sc.kill()
	sc.start()
	select {
	case <-l.Lost():
	case <-time.After(2 * time.Second):
		t.Fatalf("not lost 2 s after the kill: %s", l.State())
	}
	if l.State() != lockside.Lost || !errors.Is(l.Err(), lockside.ErrLost) {
		t.Fatalf("state %s, err %v", l.State(), l.Err())
	}
	if err := l.Unlock(ctx); !errors.Is(err, lockside.ErrLost) {
		t.Fatalf("Unlock of a lost lock: %v", err)
	}
	// The next Lock opens a new session.
	l2, err := c.Lock(ctx, "ephemeral")
	if err != nil {
		t.Fatal(err)
	}
	if l2.FencingToken() == 0 {
		t.Fatal("no token")
	}
}

func TestASidecarGoneForLongerThanTheTTLLosesTheLock(t *testing.T) {
	redis := startRedis(t)
	sc := startSidecar(t, redis.url())
	c := connect(t, sc.addr)
	ctx := within(t, 10*time.Second)
	l, err := c.Lock(ctx, "gone", lockside.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	broke := time.Now()
	sc.kill()
	awaitState(t, l, lockside.Suspended, 2*time.Second)
	select {
	case <-l.Lost():
	case <-time.After(3 * time.Second):
		t.Fatalf("still %s 3 s after the break", l.State())
	}
	if since := time.Since(broke); since < 900*time.Millisecond {
		t.Fatalf("lost %v after the break, before the TTL passed", since)
	}
}

func TestALostEventFromTheSidecarReachesTheLock(t *testing.T) {
	redis := startRedis(t)
	sc := startSidecar(t, redis.url())
	c := connect(t, sc.addr)
	ctx := within(t, 10*time.Second)
	l, err := c.Lock(ctx, "flushed", lockside.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// The lock vanishes from the store: the next renewal (every TTL/3) finds it gone.
	if reply, err := redis.do("FLUSHALL"); err != nil || reply != "+OK" {
		t.Fatalf("FLUSHALL: %q %v", reply, err)
	}
	select {
	case <-l.Lost():
	case <-time.After(3 * time.Second):
		t.Fatalf("no Lost 3 s after the flush: %s", l.State())
	}
	var lost *lockside.LostError
	if !errors.As(l.Err(), &lost) || lost.Key != "flushed" || lost.FencingToken != l.FencingToken() || lost.Reason == "" {
		t.Fatalf("Err: %v", l.Err())
	}
	// The session goes on.
	l2, err := c.Lock(ctx, "flushed")
	if err != nil {
		t.Fatal(err)
	}
	if l2.FencingToken() <= l.FencingToken() {
		t.Fatalf("token %d after %d", l2.FencingToken(), l.FencingToken())
	}
}

func TestAResetConnectionSuspendsTheLockAndAWaiterElsewhereGetsIt(t *testing.T) {
	redis := startRedis(t)
	sc := startSidecar(t, redis.url())
	px := startProxy(t, sc.addr)
	a := connect(t, px.addr)
	b := connect(t, sc.addr)
	ctx := within(t, 15*time.Second)

	l, err := a.Lock(ctx, "reset", lockside.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	granted := make(chan *lockside.Lock, 1)
	go func() {
		l, err := b.Lock(ctx, "reset")
		if err != nil {
			t.Error(err)
		}
		granted <- l
	}()
	for st, _ := b.Describe(ctx, "reset"); st.Waiters == 0; st, _ = b.Describe(ctx, "reset") {
	}
	px.reset() // both ends live: the sidecar releases at once
	other := <-granted
	if other == nil {
		t.FailNow()
	}
	if s := l.State(); s == lockside.Held || s == lockside.InJeopardy {
		// The waiter elsewhere holds it: this one must not count on it. (The break
		// reaches both ends together; give the client's reader its moment.)
		awaitState(t, l, lockside.Suspended, time.Second)
	}
	// The resumed session (through the proxy, now relaying again) cannot list it.
	select {
	case <-l.Lost():
	case <-time.After(5 * time.Second):
		t.Fatalf("still %s 5 s after the reset", l.State())
	}
	if other.State() != lockside.Held {
		t.Fatalf("the other holder's lock is %s", other.State())
	}
}

func TestAFrozenSidecarSuspendsTheLockWithinTheKeepalive(t *testing.T) {
	redis := startRedis(t)
	sc := startSidecar(t, redis.url())
	c := connect(t, sc.addr)
	ctx := within(t, 15*time.Second)
	l, err := c.Lock(ctx, "frozen", lockside.WithTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	sc.signal(syscall.SIGSTOP)
	t.Cleanup(func() { sc.signal(syscall.SIGCONT) })
	stopped := time.Now()
	awaitState(t, l, lockside.Suspended, 3500*time.Millisecond)
	if d := time.Since(stopped); d > 3*time.Second {
		t.Fatalf("suspended %v after the freeze", d)
	}
	sc.signal(syscall.SIGCONT)
	// The thawed sidecar sees the cancelled stream and releases: the lock cannot come
	// back with its token held by this session unless the sidecar kept it.
	ctx2, cancel := context.WithTimeout(ctx, 6*time.Second)
	defer cancel()
	for {
		changed := l.Changed()
		s := l.State()
		if s == lockside.Lost {
			break
		}
		if s == lockside.Held {
			st, err := c.Describe(ctx, "frozen")
			if err != nil || len(st.Holders) != 1 || st.Holders[0].FencingToken != l.FencingToken() {
				t.Fatalf("restored, but the store says %+v (%v)", st, err)
			}
			break
		}
		select {
		case <-changed:
		case <-ctx2.Done():
			t.Fatalf("still %s after the thaw", s)
		}
	}
}

// awaitRecorded waits until the session's record in Redis lists the lock: the sidecar
// writes it off the lock path, a few ms after the grant, and a lock granted just
// before its sidecar died may be in no record (the proto says so).
func awaitRecorded(t *testing.T, redis *redisServer, session string, l *lockside.Lock) {
	t.Helper()
	record := "{lockside:session/" + session + "}:s"
	field := "k:" + l.Key() + "\x00" + l.Holder() // the record's field of one grant
	deadline := time.Now().Add(3 * time.Second)
	for {
		reply, err := redis.do("HEXISTS", record, field)
		if err == nil && reply == ":1" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the session record %s never listed %q (%q, %v)", record, field, reply, err)
		}
	}
}
