package lockside

import (
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Errors to test with errors.Is. Every error this package returns wraps one of them
// or is a *RejectedError, or is the context's error when a ctx ended first.
var (
	// ErrNotAcquired: the lock was busy and the call did not wait, the wait timed
	// out, or it was cancelled. The error is a *NotAcquiredError, which says which.
	ErrNotAcquired = errors.New("lockside: lock not acquired")
	// ErrLost: the lock is no longer held. Stop using the resource. The error is a
	// *LostError.
	ErrLost = errors.New("lockside: lock lost")
	// ErrUnavailable: the sidecar could not be reached, or the session's stream broke
	// before it answered (waits in progress do not survive a broken stream: ask again).
	ErrUnavailable = errors.New("lockside: sidecar unavailable")
	// ErrClosed: the Client was closed.
	ErrClosed = errors.New("lockside: client closed")
)

// Reason says why a lock was not acquired.
type Reason int

const (
	// ReasonBusy: held by someone else and the call did not wait.
	ReasonBusy Reason = iota + 1
	// ReasonTimeout: still held by someone else when the wait ran out.
	ReasonTimeout
	// ReasonCancelled: the wait was cancelled.
	ReasonCancelled
)

func (r Reason) String() string {
	switch r {
	case ReasonBusy:
		return "busy"
	case ReasonTimeout:
		return "timeout"
	case ReasonCancelled:
		return "cancelled"
	}
	return fmt.Sprintf("Reason(%d)", int(r))
}

// NotAcquiredError is returned by Lock when the key was busy, the wait timed out or
// was cancelled. errors.Is(err, ErrNotAcquired) is true.
type NotAcquiredError struct {
	Key    string
	Reason Reason
}

func (e *NotAcquiredError) Error() string {
	return fmt.Sprintf("lockside: lock %s not acquired: %s", short(e.Key), e.Reason)
}

// Is makes errors.Is(err, ErrNotAcquired) true.
func (e *NotAcquiredError) Is(target error) bool { return target == ErrNotAcquired }

// LostError says why a lock was lost: the sidecar sent Lost (renewals failed, or the
// sidecar shut down), or the stream broke and the session was not resumed with the
// lock in time. errors.Is(err, ErrLost) is true.
type LostError struct {
	Key          string
	FencingToken uint64
	Reason       string
}

func (e *LostError) Error() string {
	return fmt.Sprintf("lockside: lock %s (fencing token %d) lost: %s", short(e.Key), e.FencingToken, e.Reason)
}

// Is makes errors.Is(err, ErrLost) true.
func (e *LostError) Is(target error) bool { return target == ErrLost }

// RejectedError: the sidecar (or this package, for a key it can tell is invalid)
// refused a request. Code is InvalidArgument for a bad value, ResourceExhausted for a
// limit reached, FailedPrecondition for a conflicting mode or limit, Unavailable when
// the sidecar cannot reach its store. The session and its other locks go on.
// status.Code(err) returns Code.
type RejectedError struct {
	Key     string
	Code    codes.Code
	Message string
}

func (e *RejectedError) Error() string {
	return fmt.Sprintf("lockside: request for %s rejected: %s: %s", short(e.Key), e.Code, e.Message)
}

// GRPCStatus lets status.Code and status.FromError read the code.
func (e *RejectedError) GRPCStatus() *status.Status { return status.New(e.Code, e.Message) }

// unavailableError wraps ErrUnavailable with what happened and, when there is one,
// the gRPC error behind it.
type unavailableError struct {
	msg   string
	cause error
}

func unavailable(cause error, format string, args ...any) error {
	return &unavailableError{msg: fmt.Sprintf(format, args...), cause: cause}
}

func (e *unavailableError) Error() string   { return "lockside: " + e.msg }
func (e *unavailableError) Unwrap() error   { return e.cause }
func (e *unavailableError) Is(t error) bool { return t == ErrUnavailable }

// callError turns a failed unary or Watch call into this package's errors: refusals
// (a bad key, a limit) are a *RejectedError, the rest ErrUnavailable.
func callError(key, what string, err error) error {
	st, _ := status.FromError(err)
	switch st.Code() {
	case codes.InvalidArgument, codes.ResourceExhausted, codes.FailedPrecondition,
		codes.PermissionDenied, codes.Unauthenticated, codes.Unimplemented:
		return &RejectedError{Key: key, Code: st.Code(), Message: st.Message()}
	}
	return unavailable(err, "%s %s: %s: %s", what, short(key), st.Code(), st.Message())
}

// short is a key as messages show it: a bad 100 KB key is not repeated in full.
func short(key string) string {
	if len(key) <= 80 {
		return fmt.Sprintf("%q", key)
	}
	cut := 60
	for cut > 0 && !isRuneStart(key[cut]) {
		cut--
	}
	return fmt.Sprintf("%q... (%d bytes)", key[:cut], len(key))
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }
