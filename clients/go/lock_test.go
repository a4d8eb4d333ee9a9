package lockside_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lockside/lockside/clients/go"
)

func connect(t *testing.T, addr string, opts ...lockside.Option) *lockside.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := lockside.Connect(ctx, addr, opts...)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func within(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestLockAndUnlockGiveIncreasingFencingTokens(t *testing.T) {
	sc := startSidecar(t, "memory")
	c := connect(t, sc.addr)
	ctx := within(t, 10*time.Second)

	var last uint64
	for i := 0; i < 3; i++ {
		l, err := c.Lock(ctx, "tokens")
		if err != nil {
			t.Fatal(err)
		}
		if l.State() != lockside.Held || l.Suspended() {
			t.Fatalf("a new lock is %s", l.State())
		}
		if l.FencingToken() <= last {
			t.Fatalf("token %d after %d: not increasing", l.FencingToken(), last)
		}
		last = l.FencingToken()
		changed := l.Changed()
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case <-changed:
		default:
			t.Fatal("Unlock returned before the state changed")
		}
		if l.State() != lockside.Released {
			t.Fatalf("after Unlock the lock is %s", l.State())
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatalf("a second Unlock: %v", err)
		}
		select {
		case <-l.Lost():
			t.Fatal("Unlock closed Lost()")
		default:
		}
	}
}

func TestGoroutinesSharingOneClientExcludeEachOther(t *testing.T) {
	sc := startSidecar(t, "memory")
	c := connect(t, sc.addr)
	ctx := within(t, 30*time.Second)
	const workers, rounds = 6, 15

	var inside, most, total atomic.Int32
	var mu sync.Mutex
	var tokens []uint64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < rounds; i++ {
				l, err := c.Lock(ctx, "shared-client")
				if err != nil {
					errs <- err
					return
				}
				n := inside.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				mu.Lock()
				tokens = append(tokens, l.FencingToken())
				mu.Unlock()
				time.Sleep(200 * time.Microsecond) // the work: long enough to overlap if it could
				inside.Add(-1)
				total.Add(1)
				if err := l.Unlock(ctx); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if most.Load() != 1 || total.Load() != workers*rounds {
		t.Fatalf("at most %d inside at once (want 1), %d holds (want %d)", most.Load(), total.Load(), workers*rounds)
	}
	for i := 1; i < len(tokens); i++ { // appended in grant order, under exclusion
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("tokens not increasing in grant order: %v", tokens)
		}
	}
}

func TestAHolderIsExcludedByAnotherHolderOfTheSameClient(t *testing.T) {
	sc := startSidecar(t, "memory")
	c := connect(t, sc.addr)
	ctx := within(t, 10*time.Second)
	l, err := c.Lock(ctx, "one-client")
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.TryLock(ctx, "one-client")
	var na *lockside.NotAcquiredError
	if !errors.Is(err, lockside.ErrNotAcquired) || !errors.As(err, &na) || na.Reason != lockside.ReasonBusy {
		t.Fatalf("a second holder of one client: %v, want busy", err)
	}
	start := time.Now()
	_, err = c.Lock(ctx, "one-client", lockside.WithWait(150*time.Millisecond))
	if !errors.As(err, &na) || na.Reason != lockside.ReasonTimeout || time.Since(start) < 140*time.Millisecond {
		t.Fatalf("a bounded wait: %v after %v, want timeout after 150ms", err, time.Since(start))
	}
	// A wait given up through ctx is cancelled on the sidecar.
	wctx, cancel := context.WithCancel(ctx)
	go func() {
		for {
			if st, err := c.Describe(ctx, "one-client"); err != nil || st.Waiters > 0 {
				cancel()
				return
			}
		}
	}()
	if _, err := c.Lock(wctx, "one-client"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Lock with a cancelled ctx: %v", err)
	}
	for st, _ := c.Describe(ctx, "one-client"); st.Waiters != 0; st, _ = c.Describe(ctx, "one-client") {
		if ctx.Err() != nil {
			t.Fatal("the cancelled wait stayed on the sidecar")
		}
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	l2, err := c.TryLock(ctx, "one-client")
	if err != nil {
		t.Fatalf("after Unlock: %v", err)
	}
	l2.Unlock(ctx)
}

func TestASemaphoreOfTwoLetsTwoInAndNeverThree(t *testing.T) {
	sc := startSidecar(t, "memory")
	c := connect(t, sc.addr)
	ctx := within(t, 20*time.Second)
	const workers = 4

	var inside, most atomic.Int32
	entered := make(chan struct{}, workers)
	leave := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := c.Lock(ctx, "permits", lockside.WithLimit(2))
			if err != nil {
				errs <- err
				return
			}
			n := inside.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			entered <- struct{}{}
			<-leave
			inside.Add(-1)
			if err := l.Unlock(ctx); err != nil {
				errs <- err
			}
		}()
	}
	<-entered
	<-entered
	// Two inside: the other two wait on the sidecar.
	for {
		st, err := c.Describe(ctx, "permits")
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Holders) != 2 || st.Limit != 2 {
			t.Fatalf("describe: %d holders, limit %d; want 2 and 2", len(st.Holders), st.Limit)
		}
		if st.Waiters == 2 {
			break
		}
	}
	if n := inside.Load(); n != 2 {
		t.Fatalf("%d inside, want 2", n)
	}
	for i := 0; i < workers; i++ {
		leave <- struct{}{} // one out: the next waiter in
		if i < workers-2 {
			<-entered
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if most.Load() != 2 {
		t.Fatalf("at most %d inside at once, want 2", most.Load())
	}
}

func TestDescribeShowsEveryHolder(t *testing.T) {
	sc := startSidecar(t, "memory")
	c := connect(t, sc.addr, lockside.WithClientName("describe-test"))
	ctx := within(t, 10*time.Second)

	a, err := c.Lock(ctx, "readers", lockside.Shared(), lockside.WithValue([]byte("a")))
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Lock(ctx, "readers", lockside.Shared(), lockside.WithValue([]byte("b")))
	if err != nil {
		t.Fatal(err)
	}
	st, err := c.Describe(ctx, "readers")
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode != lockside.ModeShared || len(st.Holders) != 2 {
		t.Fatalf("describe: %+v", st)
	}
	seen := map[string]lockside.Holder{}
	for _, h := range st.Holders {
		if h.SessionID != c.SessionID() || h.ClientName != "describe-test" || h.HoldCount != 1 || h.TTLRemaining <= 0 {
			t.Fatalf("holder %+v (session %s)", h, c.SessionID())
		}
		seen[h.Holder] = h
	}
	for _, l := range []*lockside.Lock{a, b} {
		h, ok := seen[l.Holder()]
		if !ok || h.FencingToken != l.FencingToken() {
			t.Fatalf("holder %q with token %d not described: %+v", l.Holder(), l.FencingToken(), st.Holders)
		}
	}
	if string(seen[a.Holder()].Value) != "a" || string(seen[b.Holder()].Value) != "b" {
		t.Fatalf("values: %+v", st.Holders)
	}
	a.Unlock(ctx)
	b.Unlock(ctx)
	st, err = c.Describe(ctx, "readers")
	if err != nil || len(st.Holders) != 0 || st.FencingToken < b.FencingToken() {
		t.Fatalf("after unlock: %+v, %v", st, err)
	}
}

func TestInvalidKeysAreRefusedAndTheSessionGoesOn(t *testing.T) {
	sc := startSidecar(t, "memory")
	c := connect(t, sc.addr)
	ctx := within(t, 10*time.Second)
	held, err := c.Lock(ctx, "kept")
	if err != nil {
		t.Fatal(err)
	}
	session := c.SessionID()
	for _, key := range []string{"", strings.Repeat("k", 513), "bad\xffutf8", "line\nbreak", "nul\x00"} {
		_, err := c.Lock(ctx, key)
		var rej *lockside.RejectedError
		if !errors.As(err, &rej) || rej.Code != codes.InvalidArgument || status.Code(err) != codes.InvalidArgument {
			t.Fatalf("key %q: %v, want INVALID_ARGUMENT", short(key), err)
		}
		if len(err.Error()) > 300 {
			t.Fatalf("the error repeats the key: %d characters", len(err.Error()))
		}
		if _, err := c.Describe(ctx, key); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("describe %q: %v", short(key), err)
		}
	}
	if _, err := c.Lock(ctx, strings.Repeat("k", 512)); err != nil {
		t.Fatalf("a 512-byte key: %v", err)
	}
	// A value the sidecar refuses: its Rejected answer, and the session goes on.
	_, err = c.Lock(ctx, "big-value", lockside.WithValue(make([]byte, 5000)))
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a 5000-byte value: %v", err)
	}
	if c.SessionID() != session || held.State() != lockside.Held {
		t.Fatalf("the session changed (%s -> %s) or the held lock is %s", session, c.SessionID(), held.State())
	}
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func short(key string) string {
	if len(key) > 20 {
		return key[:20] + "..."
	}
	return key
}

func TestNothingListeningFailsFastNamingTheAddress(t *testing.T) {
	addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	start := time.Now()
	_, err := lockside.Connect(context.Background(), addr)
	if err == nil {
		t.Fatal("connected to nothing")
	}
	if !errors.Is(err, lockside.ErrUnavailable) || !strings.Contains(err.Error(), addr) {
		t.Fatalf("error %q: want ErrUnavailable naming %s", err, addr)
	}
	if time.Since(start) > 2*time.Second {
		t.Fatalf("took %v to fail", time.Since(start))
	}
}

func TestWaitForSidecarWaitsForOneToStart(t *testing.T) {
	port := freePort(t)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	connected := make(chan error, 1)
	go func() {
		c, err := lockside.Connect(context.Background(), addr, lockside.WithWaitForSidecar(10*time.Second))
		if err == nil {
			c.Close()
		}
		connected <- err
	}()
	select {
	case err := <-connected:
		t.Fatalf("Connect returned before any sidecar listened: %v", err)
	case <-time.After(300 * time.Millisecond): // the app starts first: that is the scenario
	}
	sc := &sidecar{t: t, store: "memory", addr: addr}
	sc.start()
	t.Cleanup(sc.kill)
	select {
	case err := <-connected:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Connect did not notice the sidecar start")
	}
}

func TestCampaignProclaimAndWatch(t *testing.T) {
	sc := startSidecar(t, "memory")
	c1 := connect(t, sc.addr)
	c2 := connect(t, sc.addr)
	ctx := within(t, 10*time.Second)

	states, err := c2.Watch(ctx, "leader")
	if err != nil {
		t.Fatal(err)
	}
	if st := <-states; len(st.Holders) != 0 {
		t.Fatalf("first state: %+v", st)
	}
	lead, err := c1.Campaign(ctx, "leader", []byte("one"))
	if err != nil {
		t.Fatal(err)
	}
	follow := func(value string) lockside.Holder {
		for st := range states {
			if h, ok := st.Leader(); ok && string(h.Value) == value {
				return h
			}
		}
		t.Fatalf("the watch ended before %q led", value)
		return lockside.Holder{}
	}
	if h := follow("one"); h.FencingToken != lead.FencingToken() {
		t.Fatalf("leader token %d, want %d", h.FencingToken, lead.FencingToken())
	}
	if err := lead.Proclaim(ctx, []byte("one/2")); err != nil {
		t.Fatal(err)
	}
	follow("one/2")
	next := make(chan *lockside.Leader, 1)
	go func() {
		l, err := c2.Campaign(ctx, "leader", []byte("two"))
		if err != nil {
			t.Error(err)
		}
		next <- l
	}()
	if err := lead.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	h := follow("two")
	second := <-next
	if second == nil || h.FencingToken != second.FencingToken() || second.FencingToken() <= lead.FencingToken() {
		t.Fatalf("second leader %+v", h)
	}
	second.Resign(ctx)
}

func TestAUnixSocketAddressAndLocksideAddr(t *testing.T) {
	sock := t.TempDir() + "/lockside.sock"
	sc := &sidecar{t: t, store: "memory", addr: "unix:" + sock}
	sc.start()
	t.Cleanup(sc.kill)
	t.Setenv("LOCKSIDE_ADDR", "unix:"+sock)
	c := connect(t, "") // "" reads $LOCKSIDE_ADDR
	if c.Addr() != "unix:"+sock {
		t.Fatalf("addr %q", c.Addr())
	}
	ctx := within(t, 5*time.Second)
	l, err := c.Lock(ctx, "over-a-socket")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
