// Package lockside is a small client for the Lockside sidecar.
//
// A Client is one session: all its locks share one Lease stream, opened by the
// first Lock call. The sidecar keeps every lock of the session alive for as long
// as the stream lives and releases them all the moment it ends (the process
// exits, crashes, or stops answering HTTP/2 keepalives). Answers are matched to
// requests by request_id; Lost is routed by key.
//
//	c, err := lockside.Dial("127.0.0.1:7420")
//	...
//	lock, err := c.Lock(ctx, "orders", lockside.LockOptions{Wait: 30 * time.Second})
//	...
//	select {
//	case <-lock.Lost():
//		// Stop using the resource now: lock.Err() says why.
//	case <-work(ctx, lock.Token): // pass the fencing token to the resource
//	}
//	err = lock.Release()
//
// Leader election: Campaign returns once the client leads (the returned Lock is
// leadership: Proclaim changes the value followers see, Release resigns), and
// followers Watch the key:
//
//	w, err := c.Watch(ctx, "jobs/leader")
//	for {
//		state, err := w.Recv()
//		...
//		if h := lockside.Leader(state); h != nil { // nil: nobody leads
//			fmt.Printf("leader %s (token %d)\n", h.GetValue(), h.GetFencingToken())
//		}
//	}
//
// Client guidance from the Lockside design applies: treat any stream error as a
// lost lock (Lost does this for you: a broken stream loses every lock of the
// session, and the next Lock opens a new session), and have the protected
// resource reject writes that carry a fencing token lower than the highest it
// has seen. Locks belong to the session, not to a goroutine: two goroutines
// sharing a Client that lock the same key both hold it (reentrancy).
package lockside

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "lockside.example/gen/lockside/v1"
)

// ClientNameHeader is the request metadata key that names a client in
// Describe answers. Put it on the context of the first Lock (which opens the
// session) with metadata.AppendToOutgoingContext.
const ClientNameHeader = "lockside-client-name"

// answerTimeout bounds how long Release waits for the sidecar's answer, and
// how long past its own wait an Acquire may go unanswered.
const answerTimeout = 10 * time.Second

// Client is a connection to a Lockside sidecar and one session on it. It is
// safe for concurrent use.
type Client struct {
	conn *grpc.ClientConn
	rpc  pb.LockServiceClient

	mu     sync.Mutex
	sess   *session
	closed bool
}

// Dial connects to the sidecar at addr ("host:port" or "unix:/path/to.sock").
// The connection is made lazily; errors show up on the first Lock.
//
// HTTP/2 keepalive is set to a 1 s interval and a 1 s timeout as the Lockside
// design advises. Note that grpc-go raises any keepalive interval below 10 s to
// 10 s (logging a warning), so a frozen sidecar is noticed only after about
// 11 s; see the README.
func Dial(addr string, opts ...grpc.DialOption) (*Client, error) {
	target := addr
	dopts := []grpc.DialOption{
		grpc.WithInsecure(), // the sidecar listens on loopback or a unix socket
		grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time:                time.Second,
			Timeout:             time.Second,
			PermitWithoutStream: true,
		}),
	}
	if path := strings.TrimPrefix(addr, "unix:"); path != addr {
		// This grpc-go has no "unix" resolver: dial the socket ourselves.
		target = "passthrough:///localhost"
		dopts = append(dopts, grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}))
	}
	conn, err := grpc.Dial(target, append(dopts, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("lockside: dial %s: %w", addr, err)
	}
	return &Client{conn: conn, rpc: pb.NewLockServiceClient(conn)}, nil
}

// Close ends the session (the sidecar releases every lock it holds, and their
// Lost channels close) and closes the connection.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	s := c.sess
	c.sess = nil
	c.mu.Unlock()
	if s != nil {
		s.close()
	}
	return c.conn.Close()
}

// SessionID is the current session's id as Describe shows it ("" before the
// first Lock or after the stream ended).
func (c *Client) SessionID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sess == nil || c.sess.isEnded() {
		return ""
	}
	return c.sess.id
}

// session returns the live session, opening one if there is none (the first
// Lock, or the previous stream ended).
func (c *Client) session(ctx context.Context) (*session, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errors.New("lockside: the client is closed")
	}
	if c.sess != nil && !c.sess.isEnded() {
		return c.sess, nil
	}
	s, err := openSession(ctx, c.rpc)
	if err != nil {
		return nil, err
	}
	c.sess = s
	return s, nil
}

// LockOptions tune one Lock call. The zero value asks for an exclusive lock
// with the server's default TTL and does not wait if the key is busy.
type LockOptions struct {
	// Wait is how long to wait for a busy key; 0 means fail at once with
	// NotAcquiredError REASON_BUSY.
	Wait time.Duration
	// TTL is how long the store keeps the lock if the sidecar stops renewing
	// it; 0 means the server's default (10 s unless configured).
	TTL time.Duration
	// Shared asks for a shared (reader) lock instead of an exclusive one.
	Shared bool
	// Limit > 1 makes the key a counting semaphore of Limit permits.
	Limit uint32
	// Fair queues this request in arrival order behind other fair waiters.
	Fair bool
	// Value is the holder's value, shown by Describe and Watch (at most 4 KiB).
	// On a key the session already holds, a non-empty value replaces it.
	Value []byte
}

// NotAcquiredError is returned by Lock when the key was busy, the wait timed
// out, or the wait was cancelled.
type NotAcquiredError struct {
	Key    string
	Reason pb.NotAcquired_Reason
}

func (e *NotAcquiredError) Error() string {
	return fmt.Sprintf("lockside: lock %q not acquired: %s", e.Key, e.Reason)
}

// RejectedError is returned when the sidecar refused a request. Code is a gRPC
// status code (InvalidArgument, ResourceExhausted, FailedPrecondition,
// Unimplemented, Unavailable when the store cannot be reached).
type RejectedError struct {
	Key     string
	Code    codes.Code
	Message string
}

func (e *RejectedError) Error() string {
	return fmt.Sprintf("lockside: request for %q rejected (%s): %s", e.Key, e.Code, e.Message)
}

// LostError says why a lock was lost: the sidecar sent Lost, or the stream
// failed or ended while the lock was held.
type LostError struct {
	Key    string
	Reason string
}

func (e *LostError) Error() string {
	return fmt.Sprintf("lockside: lock %q lost: %s", e.Key, e.Reason)
}

// Lock is a held lock. Its methods are safe for concurrent use.
type Lock struct {
	// Key is the lock's name.
	Key string
	// Token is the fencing token of this grant: pass it to the resource you
	// protect and have it reject lower tokens.
	Token uint64
	// TTL is the validity the sidecar reported at grant time. The sidecar
	// renews the lock for as long as the session lives.
	TTL time.Duration
	// HoldCount is how many times the session held the key after this grant.
	HoldCount uint32
	// SessionID identifies this lock's session in Describe answers.
	SessionID string

	sess *session

	mu       sync.Mutex
	released bool
	lostErr  error // set once, before lost is closed
	lost     chan struct{}

	releaseOnce sync.Once
	releaseErr  error
}

// Lost returns a channel that is closed when the lock is lost: the sidecar
// sent Lost for it, or the stream failed or ended while it was held. Stop
// using the resource at once when it closes; Err says why. A successful
// Release does not close it.
func (l *Lock) Lost() <-chan struct{} { return l.lost }

// Err returns a *LostError once Lost is closed, and nil before.
func (l *Lock) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lostErr
}

func (l *Lock) markLost(reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lostErr == nil && !l.released {
		l.lostErr = &LostError{Key: l.Key, Reason: reason}
		close(l.lost)
	}
}

// Release gives the lock back and waits for the sidecar to confirm. It returns
// the *LostError if the lock was lost before, and an error if the sidecar did
// not confirm. Calling it again returns the first result.
func (l *Lock) Release() error {
	l.releaseOnce.Do(func() { l.releaseErr = l.sess.release(l) })
	return l.releaseErr
}

// Proclaim replaces the lock's value (what Describe and Watch show of this
// holder): a leader telling its followers where it now is, without giving up
// leadership. It returns the *LostError if the lock is no longer held, and a
// *RejectedError for a value over 4 KiB or a store the sidecar cannot reach.
func (l *Lock) Proclaim(ctx context.Context, value []byte) error {
	if err := l.Err(); err != nil {
		return err
	}
	s := l.sess
	rid, p, err := s.register(l.Key, false)
	if err != nil {
		return err
	}
	req := &pb.LeaseRequest{Command: &pb.LeaseRequest_Proclaim{
		Proclaim: &pb.Proclaim{RequestId: rid, Key: l.Key, Value: value},
	}}
	if err := s.send(req); err != nil {
		return fmt.Errorf("lockside: send proclaim: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, answerTimeout)
	defer cancel()
	msg, err := s.wait(wctx, rid, p)
	if err != nil {
		if lost := l.Err(); lost != nil {
			return lost
		}
		return err
	}
	switch ev := msg.GetEvent().(type) {
	case *pb.LeaseResponse_Proclaimed:
		return nil
	case *pb.LeaseResponse_Rejected:
		if lost := l.Err(); lost != nil { // the sidecar sends Lost first
			return lost
		}
		return rejected(ev.Rejected)
	default:
		return fmt.Errorf("lockside: protocol error: unexpected %T answering a proclaim", ev)
	}
}

// pending is a request waiting for its answer.
type pending struct {
	key       string
	acquire   bool
	abandoned bool                   // the caller gave up (ctx done)
	answer    chan *pb.LeaseResponse // buffered: the reader never blocks
	// lock is the held lock of a Granted answer, made and put in held by the
	// reader before it reads the next message, so a Lost right after the grant
	// finds it.
	lock *Lock
}

// session is one Lease stream. recvLoop routes answers by request_id and Lost
// by key; when the stream ends every pending request fails and every held lock
// is lost.
type session struct {
	stream pb.LockService_LeaseClient
	cancel context.CancelFunc
	id     string

	sendMu sync.Mutex // grpc-go streams allow one SendMsg at a time

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]*pending
	held    map[string][]*Lock
	err     error         // why the stream ended; set before done closes
	done    chan struct{} // closed when the stream ended
	closing bool
}

func openSession(ctx context.Context, rpc pb.LockServiceClient) (*session, error) {
	// The stream outlives ctx (it is the session); only ctx's metadata is kept.
	sctx, cancel := context.WithCancel(context.Background())
	if md, ok := metadata.FromOutgoingContext(ctx); ok {
		sctx = metadata.NewOutgoingContext(sctx, md)
	}
	stream, err := rpc.Lease(sctx, grpc.WaitForReady(true))
	if err != nil {
		cancel()
		return nil, fmt.Errorf("lockside: open lease stream: %w", err)
	}
	first := make(chan error, 1)
	s := &session{
		stream:  stream,
		cancel:  cancel,
		pending: make(map[uint64]*pending),
		held:    make(map[string][]*Lock),
		done:    make(chan struct{}),
	}
	go func() {
		msg, err := stream.Recv()
		if err == nil && msg.GetStarted() == nil {
			err = fmt.Errorf("protocol error: first message is %T, want SessionStarted", msg.GetEvent())
		}
		if err == nil {
			s.id = msg.GetStarted().GetSessionId()
		}
		first <- err
		if err != nil {
			s.end(err)
			return
		}
		s.recvLoop()
	}()
	select {
	case err := <-first:
		if err != nil {
			cancel()
			return nil, fmt.Errorf("lockside: open session: %w", err)
		}
		return s, nil
	case <-ctx.Done():
		cancel()
		return nil, fmt.Errorf("lockside: open session: %w", ctx.Err())
	}
}

func (s *session) isEnded() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

func (s *session) recvLoop() {
	for {
		msg, err := s.stream.Recv()
		if err != nil {
			if err == io.EOF {
				err = errors.New("closed by the sidecar")
			}
			s.end(err)
			return
		}
		s.dispatch(msg)
	}
}

func (s *session) dispatch(msg *pb.LeaseResponse) {
	var rid uint64
	switch ev := msg.GetEvent().(type) {
	case *pb.LeaseResponse_Lost:
		s.mu.Lock()
		locks := s.held[ev.Lost.GetKey()]
		delete(s.held, ev.Lost.GetKey())
		s.mu.Unlock()
		for _, l := range locks {
			l.markLost(ev.Lost.GetReason())
		}
		return
	case *pb.LeaseResponse_Granted:
		rid = ev.Granted.GetRequestId()
	case *pb.LeaseResponse_NotAcquired:
		rid = ev.NotAcquired.GetRequestId()
	case *pb.LeaseResponse_Rejected:
		rid = ev.Rejected.GetRequestId()
	case *pb.LeaseResponse_Released:
		rid = ev.Released.GetRequestId()
	case *pb.LeaseResponse_Proclaimed:
		rid = ev.Proclaimed.GetRequestId()
	default:
		// Waiting, Jeopardy, Restored: informational; only Lost means stop.
		return
	}
	s.mu.Lock()
	p := s.pending[rid]
	delete(s.pending, rid)
	g := msg.GetGranted()
	if p != nil && g != nil && !p.abandoned {
		p.lock = &Lock{
			Key:       p.key,
			Token:     g.GetFencingToken(),
			TTL:       g.GetTtl().AsDuration(),
			HoldCount: g.GetHoldCount(),
			SessionID: s.id,
			sess:      s,
			lost:      make(chan struct{}),
		}
		s.held[p.key] = append(s.held[p.key], p.lock)
	}
	s.mu.Unlock()
	if p == nil {
		return // the answer to an abandoned cancel-Release
	}
	if g != nil && p.abandoned {
		s.sendRelease(p.key) // nobody waits for this grant any more
		return
	}
	p.answer <- msg
}

// end marks the session over: pending requests fail, held locks are lost.
func (s *session) end(err error) {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return
	}
	if s.closing {
		err = errors.New("client closed")
	}
	s.err = err
	held := s.held
	s.held = map[string][]*Lock{}
	s.pending = map[uint64]*pending{}
	close(s.done)
	s.mu.Unlock()
	for _, locks := range held {
		for _, l := range locks {
			l.markLost(err.Error())
		}
	}
}

func (s *session) send(req *pb.LeaseRequest) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	return s.stream.Send(req)
}

func (s *session) sendRelease(key string) {
	s.mu.Lock()
	s.nextID++
	rid := s.nextID
	s.mu.Unlock()
	_ = s.send(&pb.LeaseRequest{Command: &pb.LeaseRequest_Release{
		Release: &pb.Release{RequestId: rid, Key: key},
	}}) // a failed send ends the stream, which releases anyway
}

// register reserves a request id and its pending entry.
func (s *session) register(key string, acquire bool) (uint64, *pending, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return 0, nil, fmt.Errorf("lockside: lease stream ended: %w", s.err)
	}
	s.nextID++
	p := &pending{key: key, acquire: acquire, answer: make(chan *pb.LeaseResponse, 1)}
	s.pending[s.nextID] = p
	return s.nextID, p, nil
}

// wait returns the answer to rid, or an error when ctx ends or the stream ends.
func (s *session) wait(ctx context.Context, rid uint64, p *pending) (*pb.LeaseResponse, error) {
	select {
	case msg := <-p.answer:
		return msg, nil
	case <-s.done:
		select {
		case msg := <-p.answer: // answered just before the end
			return msg, nil
		default:
		}
		return nil, fmt.Errorf("lockside: lease stream ended: %w", s.err)
	case <-ctx.Done():
		s.abandon(rid, p)
		return nil, ctx.Err()
	}
}

// abandon: the caller stopped waiting for rid. A Release of a key only waited
// for cancels the wait; if the session holds the key such a Release would give
// a hold back instead, so the grant (which comes at once) is given back when it
// arrives. A grant that arrived meanwhile is given back at once.
func (s *session) abandon(rid uint64, p *pending) {
	s.mu.Lock()
	if s.pending[rid] != p {
		s.mu.Unlock()
		select {
		case <-p.answer:
			if p.lock != nil { // granted just now: give it back
				s.forget(p.lock)
				s.sendRelease(p.key)
			}
		default:
		}
		return
	}
	p.abandoned = true
	cancelWait := p.acquire && len(s.held[p.key]) == 0
	if cancelWait {
		delete(s.pending, rid)
	}
	s.mu.Unlock()
	if cancelWait {
		s.sendRelease(p.key)
	}
}

func (s *session) forget(l *Lock) {
	s.mu.Lock()
	defer s.mu.Unlock()
	locks := s.held[l.Key]
	for i, x := range locks {
		if x == l {
			locks = append(locks[:i], locks[i+1:]...)
			break
		}
	}
	if len(locks) == 0 {
		delete(s.held, l.Key)
	} else {
		s.held[l.Key] = locks
	}
}

// Lock asks for key on the client's session (opening one if needed) and returns
// once it is granted. ctx bounds only the acquisition (including any wait): the
// returned lock is held until Release, until it is lost, or until the Client is
// closed. Outgoing metadata on ctx (for example ClientNameHeader) is sent when
// this call opens the session.
//
// It returns a *NotAcquiredError or *RejectedError when the sidecar says no,
// ctx.Err() when ctx ends first, and another error when the stream fails.
func (c *Client) Lock(ctx context.Context, key string, opts LockOptions) (*Lock, error) {
	s, err := c.session(ctx)
	if err != nil {
		return nil, err
	}
	rid, p, err := s.register(key, true)
	if err != nil {
		return nil, err
	}
	wait := opts.Wait
	acq := &pb.Acquire{RequestId: rid, Key: key, Limit: opts.Limit, Fair: opts.Fair, Value: opts.Value}
	if wait > 0 {
		acq.WaitTimeout = durationpb.New(wait)
	}
	if opts.TTL > 0 {
		acq.Ttl = durationpb.New(opts.TTL)
	}
	if opts.Shared {
		acq.Mode = pb.LockMode_LOCK_MODE_SHARED
	}
	if err := s.send(&pb.LeaseRequest{Command: &pb.LeaseRequest_Acquire{Acquire: acq}}); err != nil {
		s.abandon(rid, p)
		return nil, fmt.Errorf("lockside: send acquire: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, wait+answerTimeout)
	defer cancel()
	msg, err := s.wait(wctx, rid, p)
	if err != nil {
		if errors.Is(err, ctx.Err()) {
			return nil, fmt.Errorf("lockside: lock %q: %w", key, err)
		}
		return nil, err
	}
	switch ev := msg.GetEvent().(type) {
	case *pb.LeaseResponse_Granted:
		return p.lock, nil
	case *pb.LeaseResponse_NotAcquired:
		return nil, &NotAcquiredError{Key: key, Reason: ev.NotAcquired.GetReason()}
	case *pb.LeaseResponse_Rejected:
		return nil, rejected(ev.Rejected)
	default:
		return nil, fmt.Errorf("lockside: protocol error: unexpected %T answering an acquire", ev)
	}
}

// Campaign campaigns for leadership of key with value (who you are, where to
// reach you) and returns once this client leads: the returned Lock is
// leadership. Candidates lead in the order they campaigned, across every
// sidecar of the store (a fair exclusive lock). opts.Wait (0: as long as the
// sidecar allows, 24 h) and opts.TTL apply; Shared, Limit and Fair are set for
// you.
func (c *Client) Campaign(ctx context.Context, key string, value []byte, opts LockOptions) (*Lock, error) {
	if opts.Wait == 0 {
		opts.Wait = 24 * time.Hour
	}
	opts.Value, opts.Fair, opts.Shared, opts.Limit = value, true, false, 0
	return c.Lock(ctx, key, opts)
}

// Watch follows key: Recv returns its state now, then one per change (a grant,
// a release, an expiry, a holder's value). A slow reader gets the latest state,
// skipping those in between. End it by cancelling ctx.
type Watch struct {
	key    string
	stream pb.LockService_WatchClient
}

// Watch starts following key. Errors (a bad key, the watch limit, no store)
// come from the first Recv.
func (c *Client) Watch(ctx context.Context, key string) (*Watch, error) {
	stream, err := c.rpc.Watch(ctx, &pb.WatchRequest{Key: key})
	if err != nil {
		return nil, fmt.Errorf("lockside: watch %q: %w", key, err)
	}
	return &Watch{key: key, stream: stream}, nil
}

// Recv returns the next state of the watched key. A *RejectedError says the
// sidecar refused the watch (a bad key, its watch limit); other errors that
// the stream ended (the sidecar went away or shut down, or ctx ended).
func (w *Watch) Recv() (*pb.DescribeResponse, error) {
	msg, err := w.stream.Recv()
	if err != nil {
		if st, ok := status.FromError(err); ok {
			switch st.Code() {
			case codes.InvalidArgument, codes.ResourceExhausted, codes.PermissionDenied, codes.Unauthenticated:
				return nil, &RejectedError{Key: w.key, Code: st.Code(), Message: st.Message()}
			}
		}
		return nil, fmt.Errorf("lockside: watch %q: %w", w.key, err)
	}
	return msg.GetState(), nil
}

// Leader returns the holder of an election key, or nil when nobody leads (for a
// key held by several, the oldest grant).
func Leader(state *pb.DescribeResponse) *pb.Holder {
	var leader *pb.Holder
	for _, h := range state.GetHolders() {
		if leader == nil || h.GetFencingToken() < leader.GetFencingToken() {
			leader = h
		}
	}
	return leader
}

func (s *session) release(l *Lock) error {
	if err := l.Err(); err != nil {
		s.forget(l)
		return err
	}
	rid, p, err := s.register(l.Key, false)
	if err != nil {
		l.markLost(err.Error())
		return l.Err()
	}
	req := &pb.LeaseRequest{Command: &pb.LeaseRequest_Release{
		Release: &pb.Release{RequestId: rid, Key: l.Key},
	}}
	if err := s.send(req); err != nil {
		l.markLost("release not sent: " + err.Error())
		return l.Err()
	}
	ctx, cancel := context.WithTimeout(context.Background(), answerTimeout)
	defer cancel()
	msg, err := s.wait(ctx, rid, p)
	if err != nil {
		l.markLost("release not confirmed: " + err.Error())
		return l.Err()
	}
	switch ev := msg.GetEvent().(type) {
	case *pb.LeaseResponse_Released:
		l.mu.Lock()
		l.released = true
		l.mu.Unlock()
		s.forget(l)
		return nil
	case *pb.LeaseResponse_Rejected:
		if lost := l.Err(); lost != nil { // a Lost crossed the Release
			return lost
		}
		return rejected(ev.Rejected)
	default:
		return fmt.Errorf("lockside: protocol error: unexpected %T answering a release", ev)
	}
}

// close half-closes the stream (the sidecar releases everything and ends it),
// waits up to 2 s for that, and cancels the stream after.
func (s *session) close() {
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	s.sendMu.Lock()
	_ = s.stream.CloseSend()
	s.sendMu.Unlock()
	select {
	case <-s.done:
	case <-time.After(2 * time.Second):
	}
	s.cancel()
	s.end(errors.New("client closed"))
}

func rejected(r *pb.Rejected) *RejectedError {
	return &RejectedError{Key: r.GetKey(), Code: codes.Code(r.GetCode()), Message: r.GetMessage()}
}
