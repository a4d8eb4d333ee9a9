package lockside

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/lockside/lockside/clients/go/locksidepb"
)

// maxWait is the longest wait the sidecar accepts: a Lock without WithWait and
// without a ctx deadline waits this long.
const maxWait = 24 * time.Hour

// LockState is where a lock stands. Only Held (and InJeopardy, briefly) allow using
// the resource.
type LockState int

const (
	// Held: the lock is held and renewed by the sidecar. Use the resource, passing
	// the fencing token along.
	Held LockState = iota
	// InJeopardy: the sidecar's renewals are failing; the lock is still held, for a
	// short while at most. Finish or pause critical work; Held again when a renewal
	// succeeds, else Lost.
	InJeopardy
	// Suspended: the stream to the sidecar broke. Stop using the resource now: a live
	// sidecar released the lock the moment it saw the stream end, and from here a
	// broken connection looks like a dead sidecar. The client resumes the session; the
	// lock becomes Held again if the resumed session still holds it (same fencing
	// token), Lost otherwise.
	Suspended
	// Lost: the lock is not held any more (final). Stop using the resource.
	Lost
	// Released: Unlock gave it back (final).
	Released
)

func (s LockState) String() string {
	switch s {
	case Held:
		return "held"
	case InJeopardy:
		return "in jeopardy"
	case Suspended:
		return "suspended"
	case Lost:
		return "lost"
	case Released:
		return "released"
	}
	return fmt.Sprintf("LockState(%d)", int(s))
}

// Lock is a held lock: one holder's grant of one key. Its methods are safe for
// concurrent use.
//
// A lock's state changes under it (see LockState): State reads it, Changed returns a
// channel closed at the next change, Lost one closed when it is lost. A worker reads
// Changed before State, so no change slips in between:
//
//	for {
//		changed := lock.Changed()
//		switch lock.State() {
//		case lockside.Held, lockside.InJeopardy:
//			// work with lock.FencingToken() until <-changed
//		case lockside.Suspended:
//			<-changed // stopped: wait until Held again or Lost
//		default: // Lost or Released
//			return
//		}
//	}
type Lock struct {
	s      *session
	key    string
	holder string
	token  uint64
	ttl    time.Duration // validity when granted
	keep   time.Duration // the lock's TTL: how long resuming may try after a break

	// Guarded by s.mu.
	state   LockState
	changed chan struct{}
	lost    chan struct{}
	err     *LostError
	expiry  *time.Timer // while suspended: when the TTL has passed since the break
	release *pending    // the release Unlock sent, while it is not answered
	set     *LockSet    // the LockAll it came from, if any
}

// Key is the lock's name.
func (l *Lock) Key() string { return l.key }

// Holder is the lock's holder inside the session (as Describe shows it).
func (l *Lock) Holder() string { return l.holder }

// FencingToken is the grant's token: strictly greater than every token issued before
// for the key. Pass it to the resource you protect and have it reject lower ones.
func (l *Lock) FencingToken() uint64 { return l.token }

// TTL is the validity the sidecar reported with the grant; it renews the lock for as
// long as the session lives.
func (l *Lock) TTL() time.Duration { return l.ttl }

// SessionID is the session that holds the lock (it stays the same across a resume).
func (l *Lock) SessionID() string { return l.s.id }

// State is the lock's state now.
func (l *Lock) State() LockState {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	return l.state
}

// Suspended reports whether the lock is suspended now (the stream broke and the
// session is being resumed): do not use the resource until it is Held again.
func (l *Lock) Suspended() bool { return l.State() == Suspended }

// Changed returns a channel that is closed at the lock's next state change. Call it
// again after each change: every change has a channel of its own. Lost and Released
// are final: after them the channel never closes.
func (l *Lock) Changed() <-chan struct{} {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	return l.changed
}

// Lost returns a channel closed when the lock is lost: the sidecar sent Lost, the
// session could not be resumed with the lock after a broken stream, or the Client
// was closed. Stop using the resource at once. Err says why. Unlock does not close it.
func (l *Lock) Lost() <-chan struct{} { return l.lost }

// Err is a *LostError once the lock is lost, nil before.
func (l *Lock) Err() error {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	if l.err == nil {
		return nil
	}
	return l.err
}

// setState changes the state and closes the channel of the change (s.mu held).
func (l *Lock) setState(state LockState) {
	if l.state == state {
		return
	}
	l.state = state
	close(l.changed)
	l.changed = make(chan struct{})
}

func (l *Lock) stopExpiry() {
	if l.expiry != nil {
		l.expiry.Stop()
		l.expiry = nil
	}
}

// Lock takes key and returns once it is held. It waits while the key is busy: as
// long as ctx allows, or at most WithWait's duration (WithWait(0): not at all). A
// busy key that stays busy gives a *NotAcquiredError (errors.Is ErrNotAcquired); a
// ctx that ends first gives ctx.Err() (the wait is cancelled on the sidecar); a
// refusal (a bad key, a mode or limit that disagrees with the holders') a
// *RejectedError; a sidecar that cannot be reached ErrUnavailable.
//
// Every call is a holder of its own: two calls on one key exclude each other, even
// from one goroutine (no reentrancy), as they would from two processes.
func (c *Client) Lock(ctx context.Context, key string, opts ...LockOption) (*Lock, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	var o lockOptions
	for _, opt := range opts {
		opt(&o)
	}
	holder := c.nextHolder()
	// An Unlock of key in this process that is not answered yet comes first.
	settled(ctx, key)
	for {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("lockside: lock %s: %w", short(key), err)
		}
		s, err := c.session(ctx)
		if err != nil {
			return nil, err
		}
		l, err, again := s.acquire(ctx, key, holder, o)
		if !again {
			return l, err
		}
	}
}

// TryLock takes key if it is free, without waiting: Lock with WithWait(0).
func (c *Client) TryLock(ctx context.Context, key string, opts ...LockOption) (*Lock, error) {
	return c.Lock(ctx, key, append(opts, WithWait(0))...)
}

// acquire asks for key on this session. again: the session is not open any more,
// ask the Client for one.
func (s *session) acquire(ctx context.Context, key, holder string, o lockOptions) (*Lock, error, bool) {
	wait := maxWait
	if o.waitSet {
		wait = min(max(o.wait, 0), maxWait)
	}
	if deadline, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(deadline))
	}
	acq := &pb.Acquire{Key: key, Holder: holder, Limit: o.limit, Fair: o.fair, Value: o.value,
		Mode: pb.LockMode_LOCK_MODE_EXCLUSIVE}
	if wait > 0 {
		acq.WaitTimeout = durationpb.New(wait)
	}
	if o.ttl > 0 {
		acq.Ttl = durationpb.New(o.ttl)
	}
	if o.shared {
		acq.Mode = pb.LockMode_LOCK_MODE_SHARED
	}
	p := &pending{kind: acquireRequest, key: key, holder: holder, keep: o.ttl}

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
	s.send(stream, &pb.LeaseRequest{Command: &pb.LeaseRequest_Acquire{Acquire: acq}})

	select {
	case <-p.done:
	case <-ctx.Done():
		s.abandon(rid, p)
		return nil, fmt.Errorf("lockside: lock %s: %w", short(key), ctx.Err()), false
	}
	if p.err != nil {
		return nil, p.err, false
	}
	switch ev := p.resp.GetEvent().(type) {
	case *pb.LeaseResponse_Granted:
		return p.lock, nil, false
	case *pb.LeaseResponse_NotAcquired:
		reason := ReasonBusy
		switch ev.NotAcquired.GetReason() {
		case pb.NotAcquired_REASON_TIMEOUT:
			reason = ReasonTimeout
		case pb.NotAcquired_REASON_CANCELLED:
			reason = ReasonCancelled
		}
		return nil, &NotAcquiredError{Key: key, Reason: reason}, false
	case *pb.LeaseResponse_Rejected:
		return nil, rejected(key, ev.Rejected), false
	}
	return nil, unavailable(nil, "protocol error: %T answered an acquire", p.resp.GetEvent()), false
}

// abandon: the caller of an acquire gave up. A Release of (holder, key) cancels the
// wait, or gives back the grant if it crossed the Release: the holder is this call's
// own, so either way nothing stays held. A grant that already arrived is given back.
func (s *session) abandon(rid uint64, p *pending) {
	s.mu.Lock()
	if s.pending[rid] == p {
		delete(s.pending, rid)
	} else if l := p.lock; l != nil && l.state != Lost && l.state != Released {
		// Granted meanwhile (perhaps suspended since): nobody will use it. If the
		// stream is broken, the resumed session lists it and it is given back then.
		delete(s.held, holderKey{l.holder, l.key})
		l.stopExpiry()
		l.setState(Released)
	} else {
		s.mu.Unlock()
		return
	}
	open, stream := s.state == sessionOpen, s.stream
	req := s.giveBack(p.key, p.holder)
	s.mu.Unlock()
	if open {
		s.send(stream, req)
	}
}

func rejected(key string, r *pb.Rejected) *RejectedError {
	return &RejectedError{Key: key, Code: codes.Code(r.GetCode()), Message: r.GetMessage()}
}

// Unlock gives the lock back. It returns once the Release is on the session's stream,
// without waiting for the answer: the lock is Released from then on, and whatever this
// process asks of the key afterwards (another Lock, on any Client, a Describe, a
// Watch) waits for that answer first, so it finds the key free as if Unlock had
// waited (releasing.go). A refusal that comes later is logged. It returns nil (also
// when the lock was released already), and the *LostError when the lock was lost
// before (the work done under it may have overlapped with another holder's: the
// fencing token is what protects the resource then). While the lock is suspended it
// waits for the resume's outcome, or for ctx to end (ctx.Err()).
func (l *Lock) Unlock(ctx context.Context) error {
	s := l.s
	for {
		s.mu.Lock()
		switch l.state {
		case Released:
			s.mu.Unlock()
			return nil
		case Lost:
			s.mu.Unlock()
			return l.err
		case Suspended:
			changed := l.changed
			s.mu.Unlock()
			select {
			case <-changed:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		p := &pending{kind: releaseRequest, key: l.key, holder: l.holder, lock: l}
		rid, stream := s.register(p)
		p.req = releaseMsg(rid, l.key, l.holder)
		p.flight = releaseSent(l.key)
		l.release = p
		l.setState(Released)
		s.mu.Unlock()
		s.send(stream, p.req)
		return nil
	}
}

// Proclaim replaces the lock's value (what Describe and Watch show of this holder): a
// leader telling followers where it now is, without giving up the lock. While the
// lock is suspended it waits for the resume's outcome. It returns the *LostError when
// the lock is lost, a *RejectedError for a value over 4096 bytes or a store the
// sidecar cannot reach.
func (l *Lock) Proclaim(ctx context.Context, value []byte) error {
	s := l.s
	for {
		s.mu.Lock()
		switch l.state {
		case Released:
			s.mu.Unlock()
			return &RejectedError{Key: l.key, Code: codes.FailedPrecondition, Message: "the lock was released"}
		case Lost:
			s.mu.Unlock()
			return l.err
		case Suspended:
			changed := l.changed
			s.mu.Unlock()
			select {
			case <-changed:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		p := &pending{kind: proclaimRequest, key: l.key, holder: l.holder, lock: l}
		rid, stream := s.register(p)
		p.req = &pb.LeaseRequest{Command: &pb.LeaseRequest_Proclaim{
			Proclaim: &pb.Proclaim{RequestId: rid, Key: l.key, Value: value, Holder: l.holder},
		}}
		s.mu.Unlock()
		s.send(stream, p.req)
		select {
		case <-p.done:
		case <-ctx.Done():
			return ctx.Err()
		}
		if lostErr := l.Err(); lostErr != nil {
			return lostErr // the sidecar sends Lost before refusing the proclaim
		}
		switch {
		case p.err != nil:
			return p.err
		case p.resp.GetProclaimed() != nil:
			return nil
		case p.resp.GetRejected() != nil:
			return rejected(l.key, p.resp.GetRejected())
		}
		return unavailable(nil, "protocol error: %T answered a proclaim", p.resp.GetEvent())
	}
}
