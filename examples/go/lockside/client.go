// Package lockside is a small client for the Lockside sidecar.
//
// Each Lock opens its own Lease stream, so each lock is its own session: the
// sidecar keeps the lock alive for as long as the stream lives and releases it
// the moment the stream ends (the process exits, crashes, or stops answering
// HTTP/2 keepalives).
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
// Client guidance from the Lockside design applies: treat any stream error as a
// lost lock (Lost does this for you), and have the protected resource reject
// writes that carry a fencing token lower than the highest it has seen.
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
	"google.golang.org/protobuf/types/known/durationpb"

	pb "lockside.example/gen/lockside/v1"
)

// ClientNameHeader is the request metadata key that names a client in
// Describe answers. Put it on the context passed to Lock with
// metadata.AppendToOutgoingContext.
const ClientNameHeader = "lockside-client-name"

// releaseTimeout bounds how long Release waits for the sidecar's answer.
const releaseTimeout = 10 * time.Second

// Request ids on a Lease stream. Each Lock uses its own stream and sends
// exactly one Acquire and at most one Release, so fixed ids are unique.
const (
	acquireID uint64 = 1
	releaseID uint64 = 2
)

// Client is a connection to a Lockside sidecar. It is safe for concurrent use.
type Client struct {
	conn *grpc.ClientConn
	rpc  pb.LockServiceClient
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

// Close closes the connection. Every lock still held through it is lost.
func (c *Client) Close() error { return c.conn.Close() }

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
	// renews the lock for as long as the stream lives.
	TTL time.Duration
	// SessionID identifies this lock's session in Describe answers.
	SessionID string

	stream pb.LockService_LeaseClient
	cancel context.CancelFunc // ends the stream
	// answers receives every message that answers a request (SessionStarted,
	// Granted, NotAcquired, Released, Rejected); it is closed when the stream ends.
	answers chan *pb.LeaseResponse

	mu       sync.Mutex
	released bool  // the sidecar sent Released: the end of the stream is not a loss
	lostErr  error // set once, before lost is closed
	lost     chan struct{}
	// streamErr is why the stream ended; valid once answers is closed.
	streamErr error

	releaseOnce sync.Once
	releaseErr  error
}

// Lock opens a Lease stream, asks for key and returns once it is granted.
// ctx bounds only the acquisition (including any wait): the returned lock is
// held until Release, until it is lost, or until the Client is closed.
// Outgoing metadata on ctx (for example ClientNameHeader) is sent with the
// stream.
//
// It returns a *NotAcquiredError or *RejectedError when the sidecar says no,
// ctx.Err() when ctx ends first, and another error when the stream fails.
func (c *Client) Lock(ctx context.Context, key string, opts LockOptions) (*Lock, error) {
	sctx, cancel := context.WithCancel(context.Background())
	if md, ok := metadata.FromOutgoingContext(ctx); ok {
		sctx = metadata.NewOutgoingContext(sctx, md)
	}
	stream, err := c.rpc.Lease(sctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("lockside: open lease stream: %w", err)
	}
	l := &Lock{
		Key:     key,
		stream:  stream,
		cancel:  cancel,
		answers: make(chan *pb.LeaseResponse, 4),
		lost:    make(chan struct{}),
	}
	go l.recvLoop(sctx)

	lock, err := l.acquire(ctx, opts)
	if err != nil {
		cancel() // ends the session: a grant racing with ctx is given back
		if err == ctx.Err() {
			err = fmt.Errorf("lockside: lock %q: %w", key, err)
		}
		return nil, err
	}
	return lock, nil
}

func (l *Lock) acquire(ctx context.Context, opts LockOptions) (*Lock, error) {
	first, err := l.next(ctx)
	if err != nil {
		return nil, err
	}
	started := first.GetStarted()
	if started == nil {
		return nil, fmt.Errorf("lockside: protocol error: first message is %T, want SessionStarted", first.GetEvent())
	}
	l.SessionID = started.GetSessionId()

	acq := &pb.Acquire{RequestId: acquireID, Key: l.Key, Limit: opts.Limit, Fair: opts.Fair}
	if opts.Wait > 0 {
		acq.WaitTimeout = durationpb.New(opts.Wait)
	}
	if opts.TTL > 0 {
		acq.Ttl = durationpb.New(opts.TTL)
	}
	if opts.Shared {
		acq.Mode = pb.LockMode_LOCK_MODE_SHARED
	}
	if err := l.stream.Send(&pb.LeaseRequest{Command: &pb.LeaseRequest_Acquire{Acquire: acq}}); err != nil {
		return nil, l.sendError("acquire", err)
	}

	for {
		msg, err := l.next(ctx)
		if err != nil {
			return nil, err
		}
		switch ev := msg.GetEvent().(type) {
		case *pb.LeaseResponse_Granted:
			l.Token = ev.Granted.GetFencingToken()
			l.TTL = ev.Granted.GetTtl().AsDuration()
			return l, nil
		case *pb.LeaseResponse_NotAcquired:
			return nil, &NotAcquiredError{Key: l.Key, Reason: ev.NotAcquired.GetReason()}
		case *pb.LeaseResponse_Rejected:
			return nil, rejected(ev.Rejected)
		default:
			return nil, fmt.Errorf("lockside: protocol error: unexpected %T while acquiring", ev)
		}
	}
}

// next returns the next answer, or an error when ctx ends or the stream ends.
func (l *Lock) next(ctx context.Context) (*pb.LeaseResponse, error) {
	select {
	case msg, ok := <-l.answers:
		if !ok {
			return nil, fmt.Errorf("lockside: lease stream ended: %w", l.streamErr)
		}
		return msg, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// recvLoop reads the stream until it ends. Lost closes Lost(); Waiting,
// Jeopardy and Restored are informational; everything else is an answer.
func (l *Lock) recvLoop(ctx context.Context) {
	defer close(l.answers)
	for {
		msg, err := l.stream.Recv()
		if err != nil {
			if err == io.EOF {
				err = errors.New("closed by the sidecar")
			}
			l.streamErr = err // published to readers by close(l.answers)
			l.mu.Lock()
			released := l.released
			l.mu.Unlock()
			if !released {
				l.markLost(err.Error())
			}
			return
		}
		switch ev := msg.GetEvent().(type) {
		case *pb.LeaseResponse_Lost:
			if ev.Lost.GetKey() == l.Key {
				l.markLost(ev.Lost.GetReason())
			}
		case *pb.LeaseResponse_Waiting, *pb.LeaseResponse_Jeopardy, *pb.LeaseResponse_Restored:
			// Jeopardy: still held for a while; the sidecar follows with
			// Restored or Lost, and only Lost means stop.
		default:
			if r := msg.GetReleased(); r != nil && r.GetRequestId() == releaseID {
				// From here on the end of the stream is expected, not a loss.
				l.mu.Lock()
				l.released = true
				l.mu.Unlock()
			}
			select {
			case l.answers <- msg:
			case <-ctx.Done(): // the Lock was released or abandoned
				l.streamErr = ctx.Err()
				return
			}
		}
	}
}

func (l *Lock) markLost(reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lostErr == nil {
		l.lostErr = &LostError{Key: l.Key, Reason: reason}
		close(l.lost)
	}
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

// Release gives the lock back, waits for the sidecar to confirm, and ends the
// stream. It returns the *LostError if the lock was lost before, and an error
// if the sidecar did not confirm (the stream is ended either way, which also
// releases the lock). Calling it again returns the first result.
func (l *Lock) Release() error {
	l.releaseOnce.Do(func() {
		defer l.cancel()
		l.releaseErr = l.release()
	})
	return l.releaseErr
}

func (l *Lock) release() error {
	if err := l.Err(); err != nil {
		return err
	}
	req := &pb.LeaseRequest{Command: &pb.LeaseRequest_Release{
		Release: &pb.Release{RequestId: releaseID, Key: l.Key},
	}}
	if err := l.stream.Send(req); err != nil {
		return l.sendError("release", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	msg, err := l.next(ctx)
	if err != nil {
		l.markLost("release not confirmed: " + err.Error())
		return fmt.Errorf("lockside: release %q: %w", l.Key, err)
	}
	switch ev := msg.GetEvent().(type) {
	case *pb.LeaseResponse_Released:
		// Released (recvLoop has noted it).
	case *pb.LeaseResponse_Rejected:
		err := rejected(ev.Rejected)
		l.markLost(err.Error())
		return err
	default:
		return fmt.Errorf("lockside: protocol error: unexpected %T while releasing", ev)
	}
	// Half-close and let the sidecar end the stream, so the session ends cleanly
	// rather than by cancellation. The lock is already released either way.
	if err := l.stream.CloseSend(); err != nil {
		return nil
	}
	for {
		select {
		case _, ok := <-l.answers:
			if !ok {
				return nil
			}
		case <-ctx.Done():
			return nil
		}
	}
}

// sendError turns a failed Send into the stream's real status, which Recv has.
func (l *Lock) sendError(what string, err error) error {
	if err == io.EOF {
		// The stream is gone; wait for recvLoop to learn why.
		for range l.answers {
		}
		err = l.streamErr
	}
	return fmt.Errorf("lockside: send %s: %w", what, err)
}

func rejected(r *pb.Rejected) *RejectedError {
	return &RejectedError{Key: r.GetKey(), Code: codes.Code(r.GetCode()), Message: r.GetMessage()}
}
