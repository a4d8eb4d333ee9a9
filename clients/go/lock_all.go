package lockside

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/lockside/lockside/clients/go/locksidepb"
)

// LockSet is what LockAll holds: one *Lock per key, in the order asked. Each is a lock
// of its own afterwards, with its own fencing token, state, suspension and loss (see
// Lock); the set only gathers them. Its methods are safe for concurrent use.
type LockSet struct {
	locks []*Lock
	lost  chan struct{} // closed when the first of them is lost

	// Guarded by the session's mu.
	err      *LostError // the first loss
	lostSeen bool
}

// LockAll takes every key of keys at once and returns once all are held: all or none.
// It waits while any of them is busy, holding none of them meanwhile, so that callers
// asking for overlapping sets in any order never deadlock; with Fair, it is not
// overtaken by later requests for any of its keys. keys are 2 to 64 distinct keys.
//
// The options are Lock's, for every key: WithWait, WithTTL, Shared, Fair (WithLimit
// and WithValue are refused: semaphores and values are single keys). The errors are
// Lock's too: a *NotAcquiredError (its Key one key that was not free; nothing is held),
// ctx.Err() (the wait is cancelled on the sidecar), a *RejectedError (no keys, one key,
// a duplicate, more than 64, a bad key), ErrUnavailable.
//
// Like Lock, every call is a holder of its own.
func (c *Client) LockAll(ctx context.Context, keys []string, opts ...LockOption) (*LockSet, error) {
	for _, key := range keys {
		if err := checkKey(key); err != nil {
			return nil, err
		}
	}
	var o lockOptions
	for _, opt := range opts {
		opt(&o)
	}
	if o.limit != 0 || o.value != nil {
		return nil, &RejectedError{Key: strings.Join(keys, ", "), Code: codes.InvalidArgument,
			Message: "LockAll takes neither WithLimit nor WithValue: semaphores and values are single keys"}
	}
	keys = slices.Clone(keys)
	// As Lock does: a release of one of the keys this process sent and the sidecar has
	// not answered yet goes first (releasing.go).
	for _, key := range keys {
		settled(ctx, key)
	}
	holder := c.nextHolder()
	for {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("lockside: lock all of %s: %w", short(strings.Join(keys, ", ")), err)
		}
		s, err := c.session(ctx)
		if err != nil {
			return nil, err
		}
		set, err, again := s.acquireAll(ctx, keys, holder, o)
		if !again {
			return set, err
		}
	}
}

// TryLockAll takes every key if all are free, without waiting: LockAll with WithWait(0).
func (c *Client) TryLockAll(ctx context.Context, keys []string, opts ...LockOption) (*LockSet, error) {
	return c.LockAll(ctx, keys, append(opts, WithWait(0))...)
}

// acquireAll asks for keys on this session, as acquire does for one key.
func (s *session) acquireAll(ctx context.Context, keys []string, holder string, o lockOptions) (*LockSet, error, bool) {
	wait := maxWait
	if o.waitSet {
		wait = min(max(o.wait, 0), maxWait)
	}
	if deadline, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(deadline))
	}
	acq := &pb.AcquireAll{Keys: keys, Holder: holder, Fair: o.fair, Mode: pb.LockMode_LOCK_MODE_EXCLUSIVE}
	if wait > 0 {
		acq.WaitTimeout = durationpb.New(wait)
	}
	if o.ttl > 0 {
		acq.Ttl = durationpb.New(o.ttl)
	}
	if o.shared {
		acq.Mode = pb.LockMode_LOCK_MODE_SHARED
	}
	p := &pending{kind: acquireRequest, keys: keys, holder: holder, keep: o.ttl}

	s.mu.Lock()
	if s.state != sessionOpen {
		s.mu.Unlock()
		return nil, nil, true
	}
	if p.keep <= 0 {
		p.keep = s.defaultTTL
	}
	rid, stream := s.register(p)
	acq.RequestId = rid
	s.mu.Unlock()
	s.send(stream, &pb.LeaseRequest{Command: &pb.LeaseRequest_AcquireAll{AcquireAll: acq}})

	select {
	case <-p.done:
	case <-ctx.Done():
		s.abandonAll(rid, p)
		return nil, fmt.Errorf("lockside: lock all of %s: %w", short(strings.Join(keys, ", ")), ctx.Err()), false
	}
	if p.err != nil {
		return nil, p.err, false
	}
	switch ev := p.resp.GetEvent().(type) {
	case *pb.LeaseResponse_GrantedAll:
		if len(p.set.locks) != len(keys) || len(keys) == 0 {
			err := unavailable(nil, "protocol error: %d grants answered an AcquireAll of %d keys", len(p.set.locks), len(keys))
			return nil, errors.Join(err, p.set.Unlock(context.WithoutCancel(ctx))), false
		}
		return p.set, nil, false
	case *pb.LeaseResponse_NotAcquired:
		reason := ReasonBusy
		switch ev.NotAcquired.GetReason() {
		case pb.NotAcquired_REASON_TIMEOUT:
			reason = ReasonTimeout
		case pb.NotAcquired_REASON_CANCELLED:
			reason = ReasonCancelled
		}
		return nil, &NotAcquiredError{Key: ev.NotAcquired.GetKey(), Reason: reason}, false
	case *pb.LeaseResponse_Rejected:
		r := rejected(ev.Rejected.GetKey(), ev.Rejected)
		if r.Key == "" {
			r.Key = strings.Join(keys, ", ")
		}
		return nil, r, false
	}
	return nil, unavailable(nil, "protocol error: %T answered an AcquireAll", p.resp.GetEvent()), false
}

// grantedAll makes the locks of a GrantedAll (s.mu held), one per grant, in its order
// (the order asked).
func (s *session) grantedAll(p *pending, all *pb.GrantedAll) {
	set := &LockSet{lost: make(chan struct{})}
	for _, g := range all.GetGrants() {
		l := &Lock{
			s:       s,
			key:     g.GetKey(),
			holder:  p.holder,
			token:   g.GetFencingToken(),
			ttl:     g.GetTtl().AsDuration(),
			keep:    max(p.keep, g.GetTtl().AsDuration()),
			changed: make(chan struct{}),
			lost:    make(chan struct{}),
			set:     set,
		}
		s.held[holderKey{p.holder, l.key}] = l
		set.locks = append(set.locks, l)
	}
	p.set = set
}

// abandonAll: the caller of acquireAll gave up. A Release of every key cancels the
// wait (one is enough; the others are refused, not held), or gives back each grant if
// the GrantedAll crossed them. A GrantedAll that already arrived is given back.
func (s *session) abandonAll(rid uint64, p *pending) {
	s.mu.Lock()
	if s.pending[rid] == p {
		delete(s.pending, rid)
	} else if p.set != nil {
		for _, l := range p.set.locks {
			if l.state != Lost && l.state != Released {
				delete(s.held, holderKey{l.holder, l.key})
				l.stopExpiry()
				l.setState(Released)
			}
		}
	} else {
		s.mu.Unlock()
		return
	}
	open, stream := s.state == sessionOpen, s.stream
	reqs := make([]*pb.LeaseRequest, 0, len(p.keys))
	for _, key := range p.keys {
		reqs = append(reqs, s.giveBack(key, p.holder))
	}
	s.mu.Unlock()
	if open {
		for _, req := range reqs {
			s.send(stream, req)
		}
	}
}

// lostOne: l, one of the set's locks, was lost (s.mu held).
func (set *LockSet) lostOne(l *Lock) {
	if set.lostSeen {
		return
	}
	set.lostSeen, set.err = true, l.err
	close(set.lost)
}

// Locks are the set's locks, one per key, in the order asked.
func (set *LockSet) Locks() []*Lock { return slices.Clone(set.locks) }

// Keys are the set's keys, in the order asked.
func (set *LockSet) Keys() []string {
	keys := make([]string, len(set.locks))
	for i, l := range set.locks {
		keys[i] = l.key
	}
	return keys
}

// Lock is the lock of key, or nil when key is not one of the set's.
func (set *LockSet) Lock(key string) *Lock {
	for _, l := range set.locks {
		if l.key == key {
			return l
		}
	}
	return nil
}

// FencingToken is the fencing token of key's grant (0 when key is not one of the
// set's): pass it with every write to that key's resource.
func (set *LockSet) FencingToken(key string) uint64 {
	if l := set.Lock(key); l != nil {
		return l.token
	}
	return 0
}

// FencingTokens are the fencing tokens of the keys, in the order asked.
func (set *LockSet) FencingTokens() []uint64 {
	tokens := make([]uint64, len(set.locks))
	for i, l := range set.locks {
		tokens[i] = l.token
	}
	return tokens
}

// Lost returns a channel closed when the first of the set's locks is lost: the work
// that needs all of them must stop. Err says which and why.
func (set *LockSet) Lost() <-chan struct{} { return set.lost }

// Err is the *LostError of the first lock of the set that was lost, nil before.
func (set *LockSet) Err() error {
	s := set.locks[0].s
	s.mu.Lock()
	defer s.mu.Unlock()
	if set.err == nil {
		return nil
	}
	return set.err
}

// Held reports whether every lock of the set is Held (or InJeopardy) now: the
// resources may be used. False while any is Suspended, and once any is Lost or Released.
func (set *LockSet) Held() bool {
	s := set.locks[0].s
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range set.locks {
		if l.state != Held && l.state != InJeopardy {
			return false
		}
	}
	return true
}

// Unlock gives back every lock of the set (all at once), as Lock.Unlock does each: it
// returns nil once all are released, else the errors of those that were not (a
// *LostError for a lock lost before, ctx.Err()), joined.
func (set *LockSet) Unlock(ctx context.Context) error {
	errs := make([]error, len(set.locks))
	var wg sync.WaitGroup
	for i, l := range set.locks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = l.Unlock(ctx)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
