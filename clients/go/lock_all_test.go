package lockside_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/lockside/lockside/clients/go"
)

// holdersOf is Describe's holders of key, failing the test on an error.
func holdersOf(t *testing.T, c *lockside.Client, key string) []lockside.Holder {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := c.Describe(ctx, key)
	if err != nil {
		t.Fatalf("describe %s: %v", key, err)
	}
	return st.Holders
}

func TestLockAllHoldsEveryKeyWithATokenPerKeyInTheOrderAsked(t *testing.T) {
	sc := startSidecar(t, "memory")
	c := connect(t, sc.addr)
	ctx := within(t, 10*time.Second)
	// "acct/b" has a history of its own before the set takes it.
	for i := 0; i < 3; i++ {
		l, err := c.Lock(ctx, "acct/b")
		if err != nil {
			t.Fatal(err)
		}
		l.Unlock(ctx)
	}
	before := map[string]uint64{}
	for _, k := range []string{"acct/a", "acct/b"} {
		st, err := c.Describe(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		before[k] = st.FencingToken
	}

	set, err := c.LockAll(ctx, []string{"acct/b", "acct/a"})
	if err != nil {
		t.Fatal(err)
	}
	if got := set.Keys(); !slices.Equal(got, []string{"acct/b", "acct/a"}) {
		t.Fatalf("keys %v, want the order asked", got)
	}
	tokens := set.FencingTokens()
	for i, l := range set.Locks() {
		if l.State() != lockside.Held || tokens[i] != l.FencingToken() || set.FencingToken(l.Key()) != l.FencingToken() {
			t.Fatalf("lock %d: %s %s token %d, tokens %v", i, l.Key(), l.State(), l.FencingToken(), tokens)
		}
		if l.FencingToken() <= before[l.Key()] {
			t.Fatalf("%s: token %d after %d", l.Key(), l.FencingToken(), before[l.Key()])
		}
		h := holdersOf(t, c, l.Key())
		if len(h) != 1 || h[0].FencingToken != l.FencingToken() || h[0].Holder != l.Holder() || h[0].HoldCount != 1 {
			t.Fatalf("%s described as %+v, want the lock's token %d", l.Key(), h, l.FencingToken())
		}
	}
	if !set.Held() || set.Lock("acct/c") != nil || set.FencingToken("acct/c") != 0 || set.Err() != nil {
		t.Fatal("a held set's accessors")
	}
	if err := set.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for _, l := range set.Locks() {
		if l.State() != lockside.Released || len(holdersOf(t, c, l.Key())) != 0 {
			t.Fatalf("%s after Unlock: %s, %+v", l.Key(), l.State(), holdersOf(t, c, l.Key()))
		}
	}
	if set.Held() {
		t.Fatal("a released set is Held")
	}
	again, err := c.TryLockAll(ctx, []string{"acct/a", "acct/b"})
	if err != nil {
		t.Fatal(err)
	}
	if again.FencingToken("acct/a") <= set.FencingToken("acct/a") || again.FencingToken("acct/b") <= set.FencingToken("acct/b") {
		t.Fatalf("tokens %v after %v", again.FencingTokens(), set.FencingTokens())
	}
}

func TestLockAllIsAllOrNoneAfterBusyTimeoutAndCancel(t *testing.T) {
	redis := startRedis(t)
	holderSide := connect(t, startSidecar(t, redis.url()).addr)
	sc := startSidecar(t, redis.url())
	c := connect(t, sc.addr)
	ctx := within(t, 20*time.Second)
	keys := []string{"all/a", "all/b", "all/c"}
	busy, err := holderSide.Lock(ctx, "all/b")
	if err != nil {
		t.Fatal(err)
	}
	nothingHeld := func(when string) {
		t.Helper()
		for _, k := range []string{"all/a", "all/c"} {
			if h := holdersOf(t, c, k); len(h) != 0 {
				t.Fatalf("%s: %s is held by %+v", when, k, h)
			}
		}
		// And nothing is left that keeps anyone else from them.
		l, err := holderSide.TryLockAll(ctx, []string{"all/a", "all/c"})
		if err != nil {
			t.Fatalf("%s: the other keys are not free: %v", when, err)
		}
		l.Unlock(ctx)
	}

	var na *lockside.NotAcquiredError
	_, err = c.TryLockAll(ctx, keys)
	if !errors.As(err, &na) || na.Reason != lockside.ReasonBusy || na.Key != "all/b" || !errors.Is(err, lockside.ErrNotAcquired) {
		t.Fatalf("busy: %v, want not acquired (busy) naming all/b", err)
	}
	nothingHeld("after busy")

	start := time.Now()
	_, err = c.LockAll(ctx, keys, lockside.WithWait(200*time.Millisecond))
	if !errors.As(err, &na) || na.Reason != lockside.ReasonTimeout || time.Since(start) < 190*time.Millisecond {
		t.Fatalf("a bounded wait: %v after %v, want timeout after 200ms", err, time.Since(start))
	}
	nothingHeld("after a timeout")

	// A wait given up through ctx is cancelled on the sidecar.
	wctx, cancel := context.WithCancel(ctx)
	waited := make(chan error, 1)
	go func() {
		_, err := c.LockAll(wctx, keys)
		waited <- err
	}()
	awaitWaiters(t, holderSide, "all/b", 1)
	cancel()
	if err := <-waited; !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled wait: %v", err)
	}
	awaitWaiters(t, holderSide, "all/b", 0)
	nothingHeld("after a cancelled wait")

	// A wait that is answered: granted as soon as the busy key is freed.
	got := make(chan *lockside.LockSet, 1)
	go func() {
		set, err := c.LockAll(ctx, keys)
		if err != nil {
			t.Error(err)
		}
		got <- set
	}()
	awaitWaiters(t, holderSide, "all/b", 1)
	select {
	case <-got:
		t.Fatal("granted while all/b is held")
	default:
	}
	if err := busy.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	set := <-got
	if set == nil {
		return
	}
	if set.FencingToken("all/b") <= busy.FencingToken() || !set.Held() {
		t.Fatalf("granted %v after token %d", set.FencingTokens(), busy.FencingToken())
	}
	if _, err := holderSide.TryLock(ctx, "all/c"); !errors.Is(err, lockside.ErrNotAcquired) {
		t.Fatalf("all/c is not held by the granted set: %v", err)
	}
	if err := set.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// awaitWaiters waits until Describe counts n waiters on key.
func awaitWaiters(t *testing.T, c *lockside.Client, key string, n uint32) {
	t.Helper()
	awaitDescribed(t, c, key, fmt.Sprintf("%d waiters", n), func(st lockside.State) bool { return st.Waiters == n })
}

// awaitDescribed waits until Describe's state of key is as want says (what is wanted).
func awaitDescribed(t *testing.T, c *lockside.Client, key, what string, want func(lockside.State) bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := c.Describe(context.Background(), key)
		if err == nil && want(st) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s after 5 s: %+v (%v), want %s", key, st, err, what)
		}
		time.Sleep(5 * time.Millisecond) // Describe is the only way to see another's wait
	}
}

// Goroutines on two sidecars of one Redis take overlapping pairs of keys, each in an
// order of its own (the dining philosophers): each takes its forks, eats, and puts
// them back, some rounds. Taken one after another in these orders, the forks would
// deadlock; with LockAll every philosopher eats every round, no fork has two holders
// at once, and each fork's tokens increase in grant order.
func TestOverlappingSetsInOppositeOrdersDoNotDeadlock(t *testing.T) {
	redis := startRedis(t)
	clients := []*lockside.Client{
		connect(t, startSidecar(t, redis.url()).addr),
		connect(t, startSidecar(t, redis.url()).addr),
	}
	ctx := within(t, 60*time.Second)
	const philosophers, rounds = 5, 12
	forks := make([]string, philosophers)
	for i := range forks {
		forks[i] = fmt.Sprintf("fork/%d", i)
	}

	var mu sync.Mutex
	holding := map[string]int{}
	tokens := map[string][]uint64{}
	eaten := make([]int, philosophers)
	var wg sync.WaitGroup
	for p := 0; p < philosophers; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clients[p%len(clients)]
			rng := rand.New(rand.NewSource(int64(p)))
			for r := 0; r < rounds; r++ {
				pair := []string{forks[p], forks[(p+1)%philosophers]}
				if rng.Intn(2) == 0 || p == 0 { // philosopher 0 always reverses: a cycle
					pair[0], pair[1] = pair[1], pair[0]
				}
				set, err := c.LockAll(ctx, pair)
				if err != nil {
					t.Errorf("philosopher %d round %d: %v", p, r, err)
					return
				}
				mu.Lock()
				for _, k := range pair {
					holding[k]++
					if holding[k] > 1 {
						t.Errorf("%s has %d holders", k, holding[k])
					}
					tokens[k] = append(tokens[k], set.FencingToken(k))
				}
				mu.Unlock()
				time.Sleep(time.Millisecond) // eating: long enough to overlap if it could
				mu.Lock()
				for _, k := range pair {
					holding[k]--
				}
				eaten[p]++
				mu.Unlock()
				if err := set.Unlock(ctx); err != nil {
					t.Errorf("philosopher %d: unlock: %v", p, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for p, n := range eaten {
		if n != rounds {
			t.Fatalf("philosopher %d ate %d times of %d: %v", p, n, rounds, eaten)
		}
	}
	for k, ts := range tokens {
		for i := 1; i < len(ts); i++ { // appended in grant order, under exclusion
			if ts[i] <= ts[i-1] {
				t.Fatalf("%s: tokens not increasing in grant order: %v", k, ts)
			}
		}
	}
}

func TestLockAllTakesSharedAndFairAsLockDoes(t *testing.T) {
	sc := startSidecar(t, "memory")
	c := connect(t, sc.addr)
	other := connect(t, sc.addr)
	ctx := within(t, 20*time.Second)

	r1, err := c.LockAll(ctx, []string{"doc/1", "doc/2"}, lockside.Shared())
	if err != nil {
		t.Fatal(err)
	}
	r2, err := other.TryLockAll(ctx, []string{"doc/2", "doc/1"}, lockside.Shared())
	if err != nil {
		t.Fatalf("a second reader: %v", err)
	}
	if _, err := other.TryLock(ctx, "doc/1"); !errors.Is(err, lockside.ErrNotAcquired) {
		t.Fatalf("a writer beside two readers: %v", err)
	}
	if st, _ := c.Describe(ctx, "doc/1"); st.Mode != lockside.ModeShared || len(st.Holders) != 2 {
		t.Fatalf("doc/1: %+v", st)
	}
	r1.Unlock(ctx)
	r2.Unlock(ctx)

	// Fair: a fair LockAll that waits for f/a is first in line for f/b too, so a fair
	// Lock of the free f/b that comes later waits behind it.
	first, err := other.Lock(ctx, "f/a")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *lockside.LockSet, 1)
	go func() {
		set, err := c.LockAll(ctx, []string{"f/a", "f/b"}, lockside.Fair(), lockside.WithTTL(3*time.Second))
		if err != nil {
			t.Error(err)
		}
		got <- set
	}()
	awaitDescribed(t, other, "f/b", "the fair LockAll in the queue", func(st lockside.State) bool { return len(st.Queue) == 1 })
	later := make(chan *lockside.Lock, 1)
	go func() {
		l, err := other.Lock(ctx, "f/b", lockside.Fair())
		if err != nil {
			t.Error(err)
		}
		later <- l
	}()
	awaitDescribed(t, other, "f/b", "the later Lock in the queue", func(st lockside.State) bool { return len(st.Queue) == 2 })
	first.Unlock(ctx)
	set := <-got
	if set == nil {
		return
	}
	if ttl := set.Lock("f/b").TTL(); ttl <= time.Second || ttl > 3*time.Second {
		t.Fatalf("granted with TTL %v, want WithTTL's 3s", ttl)
	}
	select {
	case l := <-later:
		t.Fatalf("the later fair Lock of f/b got it (token %d) before the fair LockAll let go", l.FencingToken())
	default:
	}
	set.Unlock(ctx)
	if l := <-later; l == nil || l.FencingToken() <= set.FencingToken("f/b") {
		t.Fatalf("the later fair Lock: %v", l)
	}
}

func TestBadLockAllRequestsAreRefusedAndTheSessionGoesOn(t *testing.T) {
	sc := startSidecar(t, "memory")
	c := connect(t, sc.addr)
	ctx := within(t, 10*time.Second)
	kept, err := c.Lock(ctx, "kept")
	if err != nil {
		t.Fatal(err)
	}
	many := make([]string, 65)
	for i := range many {
		many[i] = fmt.Sprintf("k%d", i)
	}
	for name, call := range map[string]func() error{
		"no keys":   func() error { _, err := c.LockAll(ctx, nil); return err },
		"one key":   func() error { _, err := c.LockAll(ctx, []string{"x"}); return err },
		"duplicate": func() error { _, err := c.LockAll(ctx, []string{"x", "y", "x"}); return err },
		"65 keys":   func() error { _, err := c.LockAll(ctx, many); return err },
		"empty key": func() error { _, err := c.LockAll(ctx, []string{"x", ""}); return err },
		"limit":     func() error { _, err := c.LockAll(ctx, []string{"x", "y"}, lockside.WithLimit(2)); return err },
		"value": func() error {
			_, err := c.LockAll(ctx, []string{"x", "y"}, lockside.WithValue([]byte("v")))
			return err
		},
	} {
		var rej *lockside.RejectedError
		if got := call(); !errors.As(got, &rej) || rej.Code != codes.InvalidArgument || rej.Message == "" {
			t.Fatalf("%s: %v, want rejected INVALID_ARGUMENT", name, got)
		}
	}
	for _, k := range append([]string{"x", "y"}, many...) {
		if h := holdersOf(t, c, k); len(h) != 0 {
			t.Fatalf("%s held after refusals: %+v", k, h)
		}
	}
	if kept.State() != lockside.Held {
		t.Fatalf("the session's lock is %s after refusals", kept.State())
	}
	set, err := c.LockAll(ctx, []string{"x", "y"})
	if err != nil {
		t.Fatalf("after refusals: %v", err)
	}
	set.Unlock(ctx)
}

func TestLockAllLocksAreSuspendedRestoredAndLostEachAsOneLock(t *testing.T) {
	redis := startRedis(t)
	sc := startSidecar(t, redis.url())
	c := connect(t, sc.addr)
	ctx := within(t, 20*time.Second)

	set, err := c.LockAll(ctx, []string{"move/from", "move/to"}, lockside.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	tokens, session := set.FencingTokens(), c.SessionID()
	for _, l := range set.Locks() {
		awaitRecorded(t, redis, session, l)
	}
	sc.kill()
	for _, l := range set.Locks() {
		awaitState(t, l, lockside.Suspended, time.Second)
	}
	if set.Held() {
		t.Fatal("a suspended set is Held")
	}
	sc.start()
	for _, l := range set.Locks() {
		awaitState(t, l, lockside.Held, 4*time.Second)
	}
	if !slices.Equal(set.FencingTokens(), tokens) || !set.Held() || set.Err() != nil {
		t.Fatalf("restored with tokens %v, want %v", set.FencingTokens(), tokens)
	}

	// Lost: the keys vanish from the store; the set hears the first loss.
	if reply, err := redis.do("FLUSHALL"); err != nil || reply != "+OK" {
		t.Fatalf("FLUSHALL: %q %v", reply, err)
	}
	select {
	case <-set.Lost():
	case <-time.After(4 * time.Second):
		t.Fatalf("no Lost 4 s after the flush: %v", set.Locks())
	}
	var lost *lockside.LostError
	if !errors.As(set.Err(), &lost) || set.Lock(lost.Key) == nil || lost.FencingToken != set.FencingToken(lost.Key) {
		t.Fatalf("Err: %v", set.Err())
	}
	for _, l := range set.Locks() {
		awaitState(t, l, lockside.Lost, 4*time.Second)
	}
	if err := set.Unlock(ctx); !errors.Is(err, lockside.ErrLost) || !strings.Contains(err.Error(), "move/to") {
		t.Fatalf("Unlock of a lost set: %v", err)
	}
}
