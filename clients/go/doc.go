// Package lockside is the Go client of Lockside, a sidecar that gives applications
// distributed locks on Redis over local gRPC.
//
// A Client holds one session with the sidecar: one Lease stream that carries all its
// locks. The sidecar renews them while the stream lives and releases them all when it
// ends.
//
//	c, err := lockside.Connect(ctx, "") // $LOCKSIDE_ADDR, else 127.0.0.1:7420
//	lock, err := c.Lock(ctx, "orders", lockside.WithWait(5*time.Second))
//	write(data, lock.FencingToken()) // stop at once if lock.State() is not Held
//	err = lock.Unlock(ctx)
//
// Each Lock call is a holder of its own inside the session: goroutines sharing a
// Client exclude each other as separate processes would.
//
// When the stream breaks, every lock is Suspended at once (stop using it: a live
// sidecar released it the moment it saw the stream end) while the client resumes the
// session with its resume token. A lock the resumed session still holds, with the
// same fencing token, is Held again; any other is Lost. Lost is final; Unlock then
// returns a *LostError.
//
// # Layout
//
//   - client.go: Connect, Close, the session a Client keeps, the health heartbeat.
//   - options.go: Connect's and Lock's options.
//   - lock.go: Lock, its states, Unlock, Proclaim.
//   - lock_all.go: LockAll, several keys at once (all or none), and its LockSet.
//   - session.go: one Lease stream: answers routed by request_id, events by
//     (holder, key).
//   - resume.go: a broken stream: suspend, resume with backoff, restore or lose.
//   - describe.go: Describe, Watch, Campaign.
//   - errors.go, key.go: errors as values; the key rules checked before sending.
//   - locksidepb: the generated stubs (generate.sh).
package lockside
