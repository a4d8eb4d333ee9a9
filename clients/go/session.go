package lockside

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/lockside/lockside/clients/go/locksidepb"
)

type sessionState int

const (
	sessionOpen     sessionState = iota // requests go out on the stream
	sessionResuming                     // the stream broke; locks are suspended
	sessionEnded                        // every lock is lost; the Client opens a new session
)

// holderKey names one grant inside a session: who holds which key.
type holderKey struct{ holder, key string }

type requestKind int

const (
	acquireRequest requestKind = iota
	releaseRequest
	proclaimRequest
)

// pending is a request waiting for its answer.
type pending struct {
	kind   requestKind
	key    string
	holder string
	keep   time.Duration     // an acquire's TTL (asked, or the session's default)
	req    *pb.LeaseRequest  // a release or proclaim, sent again after a resume
	lock   *Lock             // the lock a release or proclaim is about; an acquire's grant
	resp   *pb.LeaseResponse // the answer
	err    error             // or why there will be none
	done   chan struct{}     // closed once resp or err is set
	keys   []string          // an AcquireAll's keys (lock_all.go); nil for one key
	set    *LockSet          // an AcquireAll's grants
	flight *inFlight         // a release's entry among the releases in flight
}

// finish resolves p (s.mu held; p already out of s.pending).
func (p *pending) finish(resp *pb.LeaseResponse, err error) {
	p.resp, p.err = resp, err
	p.flight.done()
	close(p.done)
}

// session is one Lease stream and what it holds. One goroutine (run) reads the
// stream, routes answers by request_id and events by (holder, key), and resumes the
// session when the stream breaks. Callers register a pending request under mu, then
// send it (sendMu) without mu: a blocked send never stops the reader.
type session struct {
	c          *Client
	id         string
	defaultTTL time.Duration

	sendMu sync.Mutex // grpc-go allows one SendMsg at a time; taken before mu, never after

	mu            sync.Mutex
	state         sessionState
	changed       chan struct{} // closed (and replaced) at every state change
	token         string        // the resume token; empty when the store cannot resume
	stream        pb.LockService_LeaseClient
	cancel        context.CancelFunc // of stream
	attemptCancel context.CancelFunc // of a resume attempt in flight
	stallNote     string             // why the client broke the stream itself
	nextID        uint64
	pending       map[uint64]*pending
	held          map[holderKey]*Lock
	closing       bool
	ended         error         // why the session ended
	done          chan struct{} // closed when the reader is gone
}

// openSession opens a Lease stream and waits for SessionStarted. Without waitReady
// it fails at once when nothing listens at the address.
func openSession(ctx context.Context, c *Client, waitReady bool) (*session, error) {
	sctx, cancel := context.WithCancel(context.Background()) // the stream outlives ctx
	stream, err := c.rpc.Lease(c.outgoing(sctx, ""), grpc.WaitForReady(waitReady))
	if err != nil {
		cancel()
		return nil, noSidecar(c.addr, err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var stop context.CancelFunc
		ctx, stop = context.WithTimeout(ctx, connectTimeout)
		defer stop()
	}
	first, err := recvWithin(ctx, stream, cancel)
	if err != nil {
		cancel()
		return nil, noSidecar(c.addr, err)
	}
	started := first.GetStarted()
	if started == nil {
		cancel()
		return nil, unavailable(nil, "protocol error: the sidecar at %s opened the stream with %T", c.addr, first.GetEvent())
	}
	s := &session{
		c:          c,
		id:         started.GetSessionId(),
		defaultTTL: started.GetDefaultTtl().AsDuration(),
		changed:    make(chan struct{}),
		token:      started.GetResumeToken(),
		stream:     stream,
		cancel:     cancel,
		pending:    make(map[uint64]*pending),
		held:       make(map[holderKey]*Lock),
		done:       make(chan struct{}),
	}
	go s.run(stream)
	return s, nil
}

// recvWithin receives one message, giving up (and cancelling the stream) when ctx
// ends first.
func recvWithin(ctx context.Context, stream pb.LockService_LeaseClient, cancel context.CancelFunc) (*pb.LeaseResponse, error) {
	type result struct {
		msg *pb.LeaseResponse
		err error
	}
	got := make(chan result, 1)
	go func() {
		msg, err := stream.Recv()
		got <- result{msg, err}
	}()
	select {
	case r := <-got:
		return r.msg, r.err
	case <-ctx.Done():
		cancel()
		return nil, ctx.Err()
	}
}

func noSidecar(addr string, err error) error {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return unavailable(err, "no session with the sidecar at %s: %v", addr, err)
	}
	st, _ := status.FromError(err)
	if st.Code() == codes.Unavailable {
		return unavailable(err, "nothing answers at %s (is the sidecar running?): %s", addr, st.Message())
	}
	if st.Code() == codes.DeadlineExceeded || st.Code() == codes.Canceled {
		return unavailable(err, "no session with the sidecar at %s: %s", addr, st.Message())
	}
	return &RejectedError{Code: st.Code(), Message: fmt.Sprintf("the sidecar at %s refused the session: %s", addr, st.Message())}
}

// status is the session's state and a channel closed at its next change. A nil
// session counts as ended.
func (s *session) status() (sessionState, <-chan struct{}) {
	if s == nil {
		return sessionEnded, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state, s.changed
}

// setState changes the state and wakes whoever waits for a change (s.mu held).
func (s *session) setState(state sessionState) {
	s.state = state
	close(s.changed)
	s.changed = make(chan struct{})
}

// register reserves a request id for p (s.mu held) and returns the stream to send on.
func (s *session) register(p *pending) (uint64, pb.LockService_LeaseClient) {
	s.nextID++
	p.done = make(chan struct{})
	s.pending[s.nextID] = p
	return s.nextID, s.stream
}

// send sends req on stream. A failed send is not reported here: it means the stream
// broke, and the reader sees that and deals with every pending request.
func (s *session) send(stream pb.LockService_LeaseClient, req *pb.LeaseRequest) {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	_ = stream.Send(req)
}

// giveBack sends a Release nobody waits for (s.mu held; sent after, by the caller).
func (s *session) giveBack(key, holder string) *pb.LeaseRequest {
	s.nextID++
	return releaseMsg(s.nextID, key, holder)
}

func releaseMsg(rid uint64, key, holder string) *pb.LeaseRequest {
	return &pb.LeaseRequest{Command: &pb.LeaseRequest_Release{
		Release: &pb.Release{RequestId: rid, Key: key, Holder: holder},
	}}
}

// run reads the session's streams until the session ends.
func (s *session) run(stream pb.LockService_LeaseClient) {
	defer close(s.done)
	for stream != nil {
		err := s.pump(stream)
		if !s.broke(err) {
			return
		}
		stream = s.resume()
	}
}

func (s *session) pump(stream pb.LockService_LeaseClient) error {
	for {
		msg, err := stream.Recv()
		if err != nil {
			return err
		}
		s.mu.Lock()
		s.dispatch(msg)
		s.mu.Unlock()
	}
}

// dispatch routes one message (s.mu held).
func (s *session) dispatch(msg *pb.LeaseResponse) {
	switch ev := msg.GetEvent().(type) {
	case *pb.LeaseResponse_Granted:
		s.answered(ev.Granted.GetRequestId(), msg)
	case *pb.LeaseResponse_GrantedAll:
		s.answered(ev.GrantedAll.GetRequestId(), msg)
	case *pb.LeaseResponse_NotAcquired:
		s.answered(ev.NotAcquired.GetRequestId(), msg)
	case *pb.LeaseResponse_Rejected:
		s.answered(ev.Rejected.GetRequestId(), msg)
	case *pb.LeaseResponse_Released:
		s.answered(ev.Released.GetRequestId(), msg)
	case *pb.LeaseResponse_Proclaimed:
		s.answered(ev.Proclaimed.GetRequestId(), msg)
	case *pb.LeaseResponse_Lost:
		reason := ev.Lost.GetReason()
		if reason == "" {
			reason = "the sidecar sent Lost"
		}
		for _, l := range s.locksOf(ev.Lost.GetHolder(), ev.Lost.GetKey()) {
			s.lose(l, reason)
		}
	case *pb.LeaseResponse_Jeopardy:
		left := ev.Jeopardy.GetTtlRemaining().AsDuration()
		for _, l := range s.locksOf(ev.Jeopardy.GetHolder(), ev.Jeopardy.GetKey()) {
			if l.state == Held {
				s.c.opts.logger.Warn("lockside: lock in jeopardy: renewals failing",
					"key", l.key, "holder", l.holder, "validity_left", left)
				l.setState(InJeopardy)
			}
		}
	case *pb.LeaseResponse_Restored:
		for _, l := range s.locksOf(ev.Restored.GetHolder(), ev.Restored.GetKey()) {
			if l.state == InJeopardy {
				l.setState(Held)
			}
		}
	}
	// Waiting, and events newer than this client, need nothing.
}

// locksOf is the lock of (holder, key); holder "" (a sidecar without holders) names
// every holder of key.
func (s *session) locksOf(holder, key string) []*Lock {
	if holder != "" {
		if l := s.held[holderKey{holder, key}]; l != nil {
			return []*Lock{l}
		}
		return nil
	}
	var out []*Lock
	for hk, l := range s.held {
		if hk.key == key {
			out = append(out, l)
		}
	}
	return out
}

// answered routes an answer to its request (s.mu held).
func (s *session) answered(rid uint64, msg *pb.LeaseResponse) {
	p := s.pending[rid]
	if p == nil {
		// The answer to a Release nobody waits for (a wait given up, a grant given
		// back), or a grant of request_id 0 outside a resume: nothing to do.
		return
	}
	delete(s.pending, rid)
	switch p.kind {
	case acquireRequest:
		if all := msg.GetGrantedAll(); all != nil && p.keys != nil {
			s.grantedAll(p, all)
		} else if g := msg.GetGranted(); g != nil && p.keys == nil {
			keep := max(p.keep, g.GetTtl().AsDuration())
			l := &Lock{
				s:       s,
				key:     p.key,
				holder:  p.holder,
				token:   g.GetFencingToken(),
				ttl:     g.GetTtl().AsDuration(),
				keep:    keep,
				changed: make(chan struct{}),
				lost:    make(chan struct{}),
			}
			s.held[holderKey{p.holder, p.key}] = l
			p.lock = l
		}
	case releaseRequest:
		// Unlock returned when it sent the Release (the lock is Released since): the
		// session stops counting it now. A refusal comes after Unlock returned, so it is
		// logged; FAILED_PRECONDITION is a Lost that crossed the Release.
		l := p.lock
		if s.held[holderKey{l.holder, l.key}] == l {
			delete(s.held, holderKey{l.holder, l.key})
		}
		l.stopExpiry()
		if r := msg.GetRejected(); r != nil && codes.Code(r.GetCode()) != codes.FailedPrecondition {
			s.c.opts.logger.Warn("lockside: the release of a lock was refused", "key", l.key,
				"holder", l.holder, "code", codes.Code(r.GetCode()), "message", r.GetMessage())
		}
	}
	p.finish(msg, nil)
}

// lose marks l lost (s.mu held).
func (s *session) lose(l *Lock, reason string) {
	if l.state == Lost || l.state == Released {
		return
	}
	delete(s.held, holderKey{l.holder, l.key})
	l.stopExpiry()
	l.err = &LostError{Key: l.key, FencingToken: l.token, Reason: reason}
	if !s.closing { // Close loses every lock on purpose: nothing to warn about
		s.c.opts.logger.Warn("lockside: lock lost", "key", l.key, "holder", l.holder,
			"fencing_token", l.token, "reason", reason)
	}
	close(l.lost)
	if l.set != nil {
		l.set.lostOne(l)
	}
	l.setState(Lost)
}

// end ends the session (s.mu held): every pending request fails, every lock is lost.
func (s *session) end(reason string) {
	if s.state == sessionEnded {
		return
	}
	s.ended = unavailable(nil, "the session with the sidecar at %s ended: %s", s.c.addr, reason)
	if s.closing {
		s.ended = ErrClosed
	}
	for rid, p := range s.pending {
		delete(s.pending, rid)
		p.finish(nil, s.ended)
	}
	for _, l := range s.held {
		s.lose(l, reason)
	}
	if s.attemptCancel != nil {
		s.attemptCancel()
	}
	s.setState(sessionEnded)
}

// stalled: the sidecar did not answer a health check in time. Break the stream, so
// that the reader suspends the locks and resumes the session.
func (s *session) stalled(timeout time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != sessionOpen || s.closing {
		return
	}
	s.stallNote = fmt.Sprintf("the sidecar did not answer a health check within %v", timeout)
	s.cancel()
}

// close ends the session cleanly: a half-close makes the sidecar release every lock
// and end the stream; the stream is cancelled after at most 2 s.
func (s *session) close() {
	s.mu.Lock()
	s.closing = true
	if s.state == sessionResuming {
		s.end("client closed")
	}
	stream, open := s.stream, s.state == sessionOpen
	s.mu.Unlock()
	if open {
		s.sendMu.Lock()
		_ = stream.CloseSend()
		s.sendMu.Unlock()
		select {
		case <-s.done:
		case <-time.After(2 * time.Second):
		}
	}
	s.mu.Lock()
	s.cancel()
	s.end("client closed")
	s.mu.Unlock()
}

// streamEnding describes how a stream ended, and whether the session may be resumed
// after it: only an ending that may mean the sidecar died. An end the sidecar chose
// (a clean end, a refusal, a shutdown that already sent Lost for every lock) released
// everything.
func streamEnding(err error) (string, bool) {
	if errors.Is(err, io.EOF) {
		return "the sidecar ended the stream", false
	}
	st, _ := status.FromError(err)
	desc := fmt.Sprintf("%s: %s", st.Code(), st.Message())
	switch st.Code() {
	case codes.Unavailable:
		if containsFold(st.Message(), "shutting down") {
			return desc, false
		}
		return desc, true
	case codes.Internal, codes.Unknown, codes.Canceled, codes.DeadlineExceeded:
		return desc, true
	}
	return desc, false
}

func containsFold(s, sub string) bool {
	return strings.Contains(strings.ToLower(s), strings.ToLower(sub))
}
