package lockside

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/lockside/lockside/clients/go/locksidepb"
)

// DefaultAddr is where clients find the sidecar unless told otherwise (or through
// $LOCKSIDE_ADDR): the sidecar's own default listener.
const DefaultAddr = "127.0.0.1:7420"

// Metadata headers of the Lease stream.
const (
	clientNameHeader = "lockside-client-name"
	resumeHeader     = "lockside-resume"
)

// connectTimeout bounds how long opening a session may wait for the sidecar's first
// message when ctx has no deadline: a sidecar that accepts connections but does not
// answer is not a sidecar to wait for forever.
const connectTimeout = 10 * time.Second

// Client is a connection to a Lockside sidecar and one session on it: one Lease
// stream that carries every lock of the Client. It is safe for concurrent use; share
// one Client in a process. Each Lock call is a holder of its own, so two goroutines
// locking one key through one Client exclude each other as two processes would.
//
// When the stream breaks, the session's locks are suspended while the client resumes
// the session (see Lock). When the session ends for good (it could not be resumed, or
// the sidecar ended it), its locks are lost and the next Lock opens a new session.
type Client struct {
	addr   string
	opts   clientOptions
	conn   *grpc.ClientConn
	rpc    pb.LockServiceClient
	health healthpb.HealthClient

	holders atomic.Uint64 // the last holder name handed out ("1", "2", ...)

	openMu sync.Mutex // one goroutine opens a new session at a time
	mu     sync.Mutex
	sess   *session
	closed bool
	done   chan struct{} // closed by Close
}

// Connect connects to the sidecar at addr and opens a session. addr is "host:port"
// or "unix:/path/to.sock"; "" means $LOCKSIDE_ADDR, else 127.0.0.1:7420.
//
// It fails at once, with an error naming the address that wraps ErrUnavailable, when
// nothing answers there, unless WithWaitForSidecar asks it to wait. ctx bounds the
// connection attempt only.
func Connect(ctx context.Context, addr string, opts ...Option) (*Client, error) {
	if addr == "" {
		addr = os.Getenv("LOCKSIDE_ADDR")
	}
	if addr == "" {
		addr = DefaultAddr
	}
	o := defaultClientOptions()
	for _, opt := range opts {
		opt(&o)
	}
	target := strings.TrimSuffix(strings.TrimPrefix(addr, "http://"), "/")
	if !strings.HasPrefix(target, "unix:") {
		target = "passthrough:///" + target // an address, not a name to resolve
	}
	dial := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		// grpc-go raises Time to 10 s; the health check below covers the rest.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time:                o.keepaliveTime,
			Timeout:             o.keepaliveTimeout,
			PermitWithoutStream: true,
		}),
		// The sidecar is local: after a restart, reconnect within half a second, not
		// after grpc's default backoff (up to 120 s). Resuming depends on it.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{
				BaseDelay:  50 * time.Millisecond,
				Multiplier: 2,
				Jitter:     0.2,
				MaxDelay:   500 * time.Millisecond,
			},
			MinConnectTimeout: time.Second,
		}),
	}
	conn, err := grpc.NewClient(target, append(dial, o.dialOptions...)...)
	if err != nil {
		return nil, unavailable(err, "bad sidecar address %q: %v", addr, err)
	}
	c := &Client{
		addr:   addr,
		opts:   o,
		conn:   conn,
		rpc:    pb.NewLockServiceClient(conn),
		health: healthpb.NewHealthClient(conn),
		done:   make(chan struct{}),
	}
	s, err := c.dialSession(ctx)
	if err != nil {
		conn.Close()
		return nil, err
	}
	c.sess = s
	go c.heartbeat()
	return c, nil
}

// Addr is the sidecar's address.
func (c *Client) Addr() string { return c.addr }

// SessionID is the current session's id, as Describe shows it.
func (c *Client) SessionID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sess == nil {
		return ""
	}
	return c.sess.id
}

// Close ends the session (the sidecar releases every lock; their Lost channels close)
// and the connection.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.done)
	s := c.sess
	c.mu.Unlock()
	if s != nil {
		s.close()
	}
	return c.conn.Close()
}

// nextHolder names a new holder inside the session: a short counter, unique for the
// Client's life, so that answers and events are routed by (holder, key).
func (c *Client) nextHolder() string {
	return strconv.FormatUint(c.holders.Add(1), 10)
}

// outgoing adds the client's headers (and a resume token) to a call's context.
func (c *Client) outgoing(ctx context.Context, resumeToken string) context.Context {
	var kv []string
	if c.opts.clientName != "" {
		kv = append(kv, clientNameHeader, c.opts.clientName)
	}
	if c.opts.authToken != "" {
		kv = append(kv, "authorization", "Bearer "+c.opts.authToken)
	}
	if resumeToken != "" {
		kv = append(kv, resumeHeader, resumeToken)
	}
	if len(kv) == 0 {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, kv...)
}

// session returns an open session: the current one, once it is done resuming, or a
// new one when it ended.
func (c *Client) session(ctx context.Context) (*session, error) {
	for {
		c.mu.Lock()
		closed, s := c.closed, c.sess
		c.mu.Unlock()
		if closed {
			return nil, ErrClosed
		}
		state, changed := s.status()
		switch state {
		case sessionOpen:
			return s, nil
		case sessionResuming:
			select {
			case <-changed:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		c.openMu.Lock()
		c.mu.Lock()
		current := c.sess
		c.mu.Unlock()
		if current != s { // another goroutine opened one meanwhile
			c.openMu.Unlock()
			continue
		}
		fresh, err := c.dialSession(ctx)
		if err == nil {
			c.mu.Lock()
			if c.closed {
				err = ErrClosed
			} else {
				c.sess = fresh
			}
			c.mu.Unlock()
			if err != nil {
				fresh.close()
			}
		}
		c.openMu.Unlock()
		if err != nil {
			return nil, err
		}
	}
}

// dialSession opens a session: at once or failing fast, or, with WithWaitForSidecar,
// waiting for a sidecar to answer.
func (c *Client) dialSession(ctx context.Context) (*session, error) {
	s, err := openSession(ctx, c, false)
	if err == nil || c.opts.waitForSidecar <= 0 || !errors.Is(err, ErrUnavailable) || ctx.Err() != nil {
		return s, err
	}
	c.opts.logger.Info("lockside: waiting for the sidecar", "addr", c.addr, "up_to", c.opts.waitForSidecar, "error", err)
	wctx, cancel := context.WithTimeout(ctx, c.opts.waitForSidecar)
	defer cancel()
	return openSession(wctx, c, true)
}

// heartbeat notices a sidecar that stopped answering (frozen, or a connection that
// silently died) within the keepalive interval + timeout, which grpc-go's own
// keepalive (10 s at least) cannot: a health check on the session's connection. When
// one is not answered in time the stream counts as broken: the locks are suspended
// and the session resumed (from this side a stall looks like a death).
func (c *Client) heartbeat() {
	t := time.NewTicker(c.opts.keepaliveTime)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
		}
		c.mu.Lock()
		s := c.sess
		c.mu.Unlock()
		if state, _ := s.status(); state != sessionOpen {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), c.opts.keepaliveTimeout)
		_, err := c.health.Check(c.outgoing(ctx, ""), &healthpb.HealthCheckRequest{})
		cancel()
		if status.Code(err) == codes.DeadlineExceeded {
			s.stalled(c.opts.keepaliveTimeout)
		}
	}
}
