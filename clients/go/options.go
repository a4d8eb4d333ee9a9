package lockside

import (
	"log/slog"
	"time"

	"google.golang.org/grpc"
)

// An Option configures Connect.
type Option func(*clientOptions)

type clientOptions struct {
	clientName       string
	authToken        string
	waitForSidecar   time.Duration
	keepaliveTime    time.Duration
	keepaliveTimeout time.Duration
	logger           *slog.Logger
	dialOptions      []grpc.DialOption
}

func defaultClientOptions() clientOptions {
	return clientOptions{
		keepaliveTime:    time.Second,
		keepaliveTimeout: time.Second,
		logger:           slog.Default(),
	}
}

// WithClientName names the client in Describe and Watch answers (the
// `lockside-client-name` header; at most 128 bytes).
func WithClientName(name string) Option { return func(o *clientOptions) { o.clientName = name } }

// WithAuthToken sends `authorization: Bearer TOKEN` on every call, for a sidecar
// started with --auth-token-file.
func WithAuthToken(token string) Option { return func(o *clientOptions) { o.authToken = token } }

// WithWaitForSidecar makes Connect (and a Lock that must open a new session) wait up
// to d for a sidecar to listen at the address, logging one line while it waits,
// instead of failing at once. For an application that may start before its sidecar.
func WithWaitForSidecar(d time.Duration) Option {
	return func(o *clientOptions) { o.waitForSidecar = d }
}

// WithKeepalive sets how often the client checks that the sidecar answers, and how
// long an answer may take before the stream counts as broken (default 1 s and 1 s:
// well below the shortest TTL). Both go to HTTP/2 keepalive (which grpc-go raises to
// at least 10 s) and to a health check on the same connection every interval, which
// notices a frozen sidecar within interval + timeout.
func WithKeepalive(interval, timeout time.Duration) Option {
	return func(o *clientOptions) { o.keepaliveTime, o.keepaliveTimeout = interval, timeout }
}

// WithLogger sets where the client logs (waiting for the sidecar, broken streams,
// resumes, lost locks). Default: slog.Default().
func WithLogger(l *slog.Logger) Option { return func(o *clientOptions) { o.logger = l } }

// WithDialOptions adds grpc-go dial options (for example TLS credentials for a sidecar
// started with --tls-cert; the default is a plaintext connection).
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *clientOptions) { o.dialOptions = append(o.dialOptions, opts...) }
}

// A LockOption configures one Lock (or Campaign) call.
type LockOption func(*lockOptions)

type lockOptions struct {
	wait    time.Duration
	waitSet bool
	ttl     time.Duration
	shared  bool
	limit   uint32
	fair    bool
	value   []byte
}

// WithWait bounds how long Lock waits for a busy key; 0 means do not wait (a busy key
// fails at once with ErrNotAcquired, reason busy). Without it Lock waits as long as
// its ctx allows (up to the sidecar's maximum, 24 h).
func WithWait(d time.Duration) LockOption {
	return func(o *lockOptions) { o.wait, o.waitSet = d, true }
}

// WithTTL sets how long the store keeps the lock if the sidecar stops renewing it
// (1 s to the sidecar's maximum). Default: the sidecar's (10 s unless configured).
// It is also how long the client tries to resume a broken session for this lock.
func WithTTL(d time.Duration) LockOption { return func(o *lockOptions) { o.ttl = d } }

// Shared asks for a shared (reader) lock: shared holders coexist and exclude
// exclusive ones.
func Shared() LockOption { return func(o *lockOptions) { o.shared = true } }

// WithLimit makes the key a counting semaphore of n permits (n > 1): at most n
// holders at once, each with its own fencing token. Every holder must use the same n.
func WithLimit(n uint32) LockOption { return func(o *lockOptions) { o.limit = n } }

// Fair queues the request in arrival order behind other fair waiters, across every
// sidecar of the store.
func Fair() LockOption { return func(o *lockOptions) { o.fair = true } }

// WithValue sets the holder's value (at most 4096 bytes), shown to everyone by
// Describe and Watch: in leader election, who leads and where to reach it.
func WithValue(v []byte) LockOption { return func(o *lockOptions) { o.value = v } }
