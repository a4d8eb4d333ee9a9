package lockside

import (
	"context"
	"time"

	pb "github.com/lockside/lockside/clients/go/locksidepb"
)

// Mode is how a key is held.
type Mode int

const (
	// ModeUnspecified: nobody holds the key (the proto's LOCK_MODE_UNSPECIFIED).
	ModeUnspecified Mode = iota
	// ModeExclusive: one holder.
	ModeExclusive
	// ModeShared: shared (reader) holders.
	ModeShared
)

func (m Mode) String() string {
	switch m {
	case ModeExclusive:
		return "exclusive"
	case ModeShared:
		return "shared"
	}
	return "unspecified"
}

// State is one key as the store sees it: Describe's answer, and each state of Watch.
type State struct {
	Key string
	// Mode of the current holders (ModeUnspecified when nobody holds the key).
	Mode Mode
	// Limit of the current holders: 1 for a lock, N for a semaphore of N permits, 0
	// when nobody holds the key.
	Limit uint32
	// Holders: one per holder of a session (two holders of one session are two).
	Holders []Holder
	// Waiters: how many requests wait for the key on the store.
	Waiters uint32
	// FencingToken is the last token issued for the key (0 if none ever was).
	FencingToken uint64
	// Queue: the fair waiters, next in line first.
	Queue []QueueEntry
}

// Holder is one grant of a key.
type Holder struct {
	SessionID string
	// Holder inside its session ("" for the session itself).
	Holder       string
	ClientName   string
	HoldCount    uint32
	TTLRemaining time.Duration
	// Value is the holder's value (WithValue, Campaign, Proclaim).
	Value        []byte
	FencingToken uint64
}

// QueueEntry is one fair waiter; Position 1 is next in line.
type QueueEntry struct {
	SessionID  string
	Holder     string
	ClientName string
	Mode       Mode
	Position   uint32
}

// Leader is the holder of an election key, and false when nobody leads (for a key
// held by several, the oldest grant).
func (s State) Leader() (Holder, bool) {
	var leader Holder
	found := false
	for _, h := range s.Holders {
		if !found || h.FencingToken < leader.FencingToken {
			leader, found = h, true
		}
	}
	return leader, found
}

func mode(m pb.LockMode) Mode {
	switch m {
	case pb.LockMode_LOCK_MODE_EXCLUSIVE:
		return ModeExclusive
	case pb.LockMode_LOCK_MODE_SHARED:
		return ModeShared
	}
	return ModeUnspecified
}

func stateOf(r *pb.DescribeResponse) State {
	s := State{
		Key:          r.GetKey(),
		Mode:         mode(r.GetMode()),
		Limit:        r.GetLimit(),
		Waiters:      r.GetWaiters(),
		FencingToken: r.GetFencingToken(),
	}
	for _, h := range r.GetHolders() {
		s.Holders = append(s.Holders, Holder{
			SessionID:    h.GetSessionId(),
			Holder:       h.GetHolder(),
			ClientName:   h.GetClientName(),
			HoldCount:    h.GetHoldCount(),
			TTLRemaining: h.GetTtlRemaining().AsDuration(),
			Value:        h.GetValue(),
			FencingToken: h.GetFencingToken(),
		})
	}
	for _, q := range r.GetQueue() {
		s.Queue = append(s.Queue, QueueEntry{
			SessionID:  q.GetSessionId(),
			Holder:     q.GetHolder(),
			ClientName: q.GetClientName(),
			Mode:       mode(q.GetMode()),
			Position:   q.GetPosition(),
		})
	}
	return s
}

// Describe reports the state of key in the store.
func (c *Client) Describe(ctx context.Context, key string) (State, error) {
	if err := checkKey(key); err != nil {
		return State{}, err
	}
	settled(ctx, key) // after this process's unanswered releases of key (releasing.go)
	r, err := c.rpc.Describe(c.outgoing(ctx, ""), &pb.DescribeRequest{Key: key})
	if err != nil {
		return State{}, callError(key, "describe", err)
	}
	return stateOf(r), nil
}

// Watch follows key: the channel gets the key's state now, then a new state each time
// its holders change (a grant, a release, an expiry, a loss, a holder's value), on
// any sidecar of the store. A slow reader gets the latest state, skipping the ones in
// between. The channel is closed when ctx ends or the watch stream ends (the sidecar
// went away or shut down: watch again). Errors at the start (a bad key, the
// sidecar's watch limit, a store it cannot reach) are returned.
func (c *Client) Watch(ctx context.Context, key string) (<-chan State, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	settled(ctx, key) // after this process's unanswered releases of key (releasing.go)
	wctx, cancel := context.WithCancel(ctx)
	stream, err := c.rpc.Watch(c.outgoing(wctx, ""), &pb.WatchRequest{Key: key})
	if err != nil {
		cancel()
		return nil, callError(key, "watch", err)
	}
	first, err := stream.Recv()
	if err != nil {
		cancel()
		return nil, callError(key, "watch", err)
	}
	received := make(chan State)
	go func() { // reads the stream as fast as it comes
		defer close(received)
		for {
			msg, err := stream.Recv()
			if err != nil {
				return
			}
			select {
			case received <- stateOf(msg.GetState()):
			case <-wctx.Done():
				return
			}
		}
	}()
	out := make(chan State)
	go func() { // hands the latest state to the reader
		defer cancel()
		defer close(out)
		latest, have := stateOf(first.GetState()), true
		for {
			var send chan State
			if have {
				send = out
			}
			select {
			case s, ok := <-received:
				if !ok {
					if have { // the last state before the end is not skipped
						select {
						case out <- latest:
						case <-wctx.Done():
						}
					}
					return
				}
				latest, have = s, true
			case send <- latest:
				have = false
			case <-wctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// Leader is leadership of an election key: a fair exclusive lock that carries the
// leader's value. Proclaim changes the value followers see; Resign gives it up.
type Leader struct {
	*Lock
}

// Campaign waits (as long as ctx allows, or WithWait) until this client leads key,
// with value (its name or address) for followers to see through Watch or Describe.
// Candidates lead in the order they campaigned, across every sidecar of the store.
// WithTTL applies; the lock is always fair and exclusive.
func (c *Client) Campaign(ctx context.Context, key string, value []byte, opts ...LockOption) (*Leader, error) {
	opts = append(opts, Fair(), WithValue(value), func(o *lockOptions) { o.shared, o.limit = false, 0 })
	l, err := c.Lock(ctx, key, opts...)
	if err != nil {
		return nil, err
	}
	return &Leader{l}, nil
}

// Resign gives leadership up: the next candidate leads.
func (l *Leader) Resign(ctx context.Context) error { return l.Unlock(ctx) }
