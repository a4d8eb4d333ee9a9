package lockside

import (
	"context"
	"fmt"
	"sort"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/lockside/lockside/clients/go/locksidepb"
)

// Resume attempts: the first pause, doubled up to the last. The sidecar is local and
// comes back within a second or two, or not in time.
const (
	firstResumeBackoff = 50 * time.Millisecond
	maxResumeBackoff   = 500 * time.Millisecond
	// How long one attempt may take to connect and hear which locks came back.
	resumeAttemptTimeout = 2 * time.Second
)

// broke handles the end of the session's stream (called by the reader). It returns
// true when the session is to be resumed.
//
// From the client's side a broken connection to a live sidecar looks like a dead
// sidecar, and a live sidecar releases a broken stream's locks at once. So from this
// moment every lock is suspended (nobody may count on it), until the resumed session
// lists it with its fencing token (restored) or it is known lost.
func (s *session) broke(err error) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cancel()
	if s.closing {
		s.end("client closed")
		return false
	}
	desc, resumable := streamEnding(err)
	if s.stallNote != "" {
		desc, resumable, s.stallNote = s.stallNote, true, ""
	}
	if s.state != sessionOpen {
		return false
	}
	// The sidecar does not resume waits in progress: their callers hear it now. A
	// release in flight is over too: a live sidecar lets go of a broken stream's locks,
	// and a resumed session that still holds the key gives it back (a grant nobody here
	// knows).
	for rid, p := range s.pending {
		switch {
		case p.kind == acquireRequest:
			delete(s.pending, rid)
			p.finish(nil, unavailable(err, "the stream to the sidecar at %s broke while waiting (%s): ask again", s.c.addr, desc))
		case p.kind == releaseRequest && p.lock.state == Released:
			delete(s.pending, rid)
			if s.held[holderKey{p.lock.holder, p.lock.key}] == p.lock {
				delete(s.held, holderKey{p.lock.holder, p.lock.key})
			}
			p.finish(nil, nil)
		}
	}
	switch {
	case len(s.held) == 0:
		s.end("the stream ended (" + desc + ")")
		return false
	case !resumable:
		s.end("the stream ended (" + desc + "); the sidecar released every lock")
		return false
	case s.token == "":
		s.end("the stream broke (" + desc + ") and the sidecar's store cannot resume sessions")
		return false
	}
	s.c.opts.logger.Warn("lockside: stream broke: locks suspended, resuming the session",
		"addr", s.c.addr, "session", s.id, "locks", len(s.held), "error", desc)
	for _, l := range s.held {
		l.setState(Suspended)
		l.expiry = time.AfterFunc(l.keep, func() { s.expire(l, desc) })
	}
	s.setState(sessionResuming)
	return true
}

// expire: l's TTL has passed since the stream broke and the session was not resumed
// with it: the store has surely let it go.
func (s *session) expire(l *Lock, desc string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.state != Suspended {
		return
	}
	s.lose(l, fmt.Sprintf("the stream broke (%s) and the session was not resumed within the lock's TTL (%v)", desc, l.keep))
	if s.state == sessionResuming && len(s.held) == 0 {
		s.end("the stream broke (" + desc + ") and no lock was resumed in time")
	}
}

// resume opens new streams with the resume token, with backoff, until one answers
// with the session (returned, already reconciled) or the session ends (nil).
func (s *session) resume() pb.LockService_LeaseClient {
	backoff := firstResumeBackoff
	for {
		s.mu.Lock()
		if s.state != sessionResuming {
			s.mu.Unlock()
			return nil
		}
		token := s.token
		sctx, cancel := context.WithCancel(context.Background())
		s.attemptCancel = cancel
		changed := s.changed
		s.mu.Unlock()

		stream, started, greeting, refused, err := s.attempt(sctx, cancel, token)
		if err == nil {
			if s.resumed(stream, cancel, started, greeting) {
				return stream
			}
			cancel()
			return nil
		}
		cancel()
		code := status.Code(err)
		switch code {
		case codes.Unimplemented, codes.Unauthenticated, codes.PermissionDenied, codes.InvalidArgument:
			// Retrying will not help: the store cannot resume, or this client is refused.
			s.mu.Lock()
			s.end(fmt.Sprintf("resuming the session failed: %v", err))
			s.mu.Unlock()
			return nil
		}
		if code == codes.FailedPrecondition && refused == refusedUnknown {
			// The sidecar does not know the session (its record was never written, was
			// spent or expired): it is gone, and nothing is gained by asking again. Its
			// locks are lost now, and the next lock opens a new session at once.
			s.mu.Lock()
			s.c.opts.logger.Warn("lockside: the session cannot be resumed: the sidecar does not know it; its locks are lost",
				"addr", s.c.addr, "session", s.id, "locks", len(s.held))
			s.end("the stream broke and the sidecar refused to resume the session: it does not know it (never recorded, spent or expired)")
			s.mu.Unlock()
			return nil
		}
		// FAILED_PRECONDITION is retried otherwise: "attached" (a restarted sidecar
		// refuses while the dead one's attachment lives, --attachment-ttl), or a sidecar
		// that does not say which. Each lock's TTL bounds the retries.
		s.c.opts.logger.Debug("lockside: a resume attempt failed", "addr", s.c.addr,
			"session", s.id, "error", err, "refused", refused, "again_in", backoff)
		select {
		case <-time.After(backoff):
		case <-changed:
		}
		backoff = min(2*backoff, maxResumeBackoff)
	}
}

// The trailer a sidecar ends a refused resume with (FAILED_PRECONDITION), and its values.
const (
	refusedTrailer = "lockside-resume-refused"
	// The session is gone (never recorded, spent, expired, malformed): do not retry.
	refusedUnknown = "unknown"
	// Still attached to a live stream elsewhere: retry until that is released.
	refusedAttached = "attached"
)

// attempt opens one resumed stream and reads SessionStarted and the locks it lists.
// When the sidecar refuses, refused is its lockside-resume-refused trailer ("" if none).
func (s *session) attempt(sctx context.Context, cancel context.CancelFunc, token string) (
	stream pb.LockService_LeaseClient, started *pb.SessionStarted, greeting []*pb.LeaseResponse, refused string, err error,
) {
	timer := time.AfterFunc(resumeAttemptTimeout, cancel)
	stream, err = s.c.rpc.Lease(s.c.outgoing(sctx, token), grpc.WaitForReady(true))
	if err != nil {
		timer.Stop()
		return nil, nil, nil, "", err
	}
	first, err := stream.Recv()
	if err != nil {
		timer.Stop()
		if v := stream.Trailer().Get(refusedTrailer); len(v) > 0 {
			refused = v[0]
		}
		return nil, nil, nil, refused, err
	}
	started = first.GetStarted()
	if started == nil {
		timer.Stop()
		return nil, nil, nil, "", fmt.Errorf("protocol error: a resumed stream opened with %T", first.GetEvent())
	}
	if t := started.GetResumeToken(); t != "" {
		s.mu.Lock()
		s.token = t // a resume answers with a new token: the old one is spent
		s.mu.Unlock()
	}
	greeting = make([]*pb.LeaseResponse, 0, started.GetResumedLocks())
	for range started.GetResumedLocks() {
		msg, err := stream.Recv()
		if err != nil {
			timer.Stop()
			return nil, nil, nil, "", fmt.Errorf("the resumed stream broke before it listed its locks: %w", err)
		}
		greeting = append(greeting, msg)
	}
	if !timer.Stop() {
		return nil, nil, nil, "", status.Error(codes.DeadlineExceeded, "the resumed stream did not list its locks in time")
	}
	return stream, started, greeting, "", nil
}

// resumed takes the resumed stream: restores the locks it lists with their fencing
// tokens, loses the others, gives back grants nobody here knows, and sends again the
// releases and proclaims the old stream may not have delivered. False when the
// session ended meanwhile.
func (s *session) resumed(stream pb.LockService_LeaseClient, cancel context.CancelFunc,
	started *pb.SessionStarted, greeting []*pb.LeaseResponse,
) bool {
	s.sendMu.Lock() // nothing goes out on the new stream before what is sent again
	defer s.sendMu.Unlock()
	s.mu.Lock()
	if s.state != sessionResuming {
		s.mu.Unlock()
		return false
	}
	if started.GetSessionId() != s.id {
		s.end("a resume answered with another session")
		s.mu.Unlock()
		return false
	}
	listed := make(map[holderKey]*pb.Granted)
	lost := make(map[holderKey]string)
	for _, msg := range greeting {
		if g := msg.GetGranted(); g != nil {
			listed[holderKey{g.GetHolder(), g.GetKey()}] = g
		} else if l := msg.GetLost(); l != nil {
			lost[holderKey{l.GetHolder(), l.GetKey()}] = l.GetReason()
		}
	}
	var out []*pb.LeaseRequest
	restored, heldBefore := 0, len(s.held)
	for hk, l := range s.held {
		g := listed[hk]
		delete(listed, hk)
		if g != nil && g.GetFencingToken() == l.token {
			l.stopExpiry()
			l.setState(Held)
			restored++
			continue
		}
		_, reportedLost := lost[hk]
		if g == nil && !reportedLost && l.release != nil {
			// Its release was in flight when the stream broke and it did not come
			// back: released (or let go); either way it is not held any more.
			delete(s.held, hk)
			l.stopExpiry()
			l.setState(Released)
			continue
		}
		reason := "the resumed session did not list it"
		if reportedLost {
			reason = "the resumed session reported it lost: " + lost[hk]
		} else if g != nil {
			reason = fmt.Sprintf("the resumed session listed it with another fencing token (%d)", g.GetFencingToken())
		}
		s.lose(l, "lost while the stream was broken: "+reason)
		if g != nil {
			for range g.GetHoldCount() {
				out = append(out, s.giveBack(g.GetKey(), g.GetHolder()))
			}
		}
	}
	for _, g := range listed { // grants nobody here waits for (an answer lost in the break)
		for range g.GetHoldCount() {
			out = append(out, s.giveBack(g.GetKey(), g.GetHolder()))
		}
	}
	rids := make([]uint64, 0, len(s.pending))
	for rid := range s.pending {
		rids = append(rids, rid)
	}
	sort.Slice(rids, func(i, j int) bool { return rids[i] < rids[j] })
	for _, rid := range rids {
		p := s.pending[rid]
		switch {
		case p.lock.state == Held:
			out = append(out, p.req) // it may not have reached the old stream
			continue
		case p.kind == releaseRequest && p.lock.state == Released:
			p.finish(&pb.LeaseResponse{Event: &pb.LeaseResponse_Released{
				Released: &pb.Released{RequestId: rid, Key: p.key, Holder: p.holder},
			}}, nil)
		case p.lock.err != nil:
			p.finish(nil, p.lock.err)
		default:
			p.finish(nil, unavailable(nil, "the lock %s was released while the stream was broken", short(p.key)))
		}
		delete(s.pending, rid)
	}
	s.stream, s.cancel, s.attemptCancel = stream, cancel, nil
	s.setState(sessionOpen)
	log := s.c.opts.logger.Info
	if lostHere := heldBefore - restored; lostHere > 0 {
		log = s.c.opts.logger.Warn
	}
	log("lockside: session resumed", "addr", s.c.addr, "session", s.id,
		"restored", restored, "lost", heldBefore-restored, "sent_again", len(out))
	s.mu.Unlock()
	for _, req := range out {
		_ = stream.Send(req)
	}
	return true
}
