package lockside

import (
	"fmt"
	"unicode"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
)

// MaxKeyBytes is the longest key the sidecar accepts.
const MaxKeyBytes = 512

// checkKey refuses, before anything is sent, a key the sidecar would refuse: empty,
// over 512 bytes, not UTF-8 (gRPC could not even encode it as a proto string), or
// with a control character. The error is a *RejectedError, code InvalidArgument, as
// the sidecar's own answer would be; the session is not affected.
func checkKey(key string) error {
	bad := func(format string, args ...any) error {
		return &RejectedError{Key: key, Code: codes.InvalidArgument, Message: fmt.Sprintf(format, args...)}
	}
	switch {
	case key == "":
		return bad("the key is empty")
	case len(key) > MaxKeyBytes:
		return bad("the key is %d bytes long, over the %d allowed", len(key), MaxKeyBytes)
	case !utf8.ValidString(key):
		return bad("the key is not valid UTF-8")
	}
	for i, r := range key {
		if unicode.IsControl(r) {
			return bad("the key has a control character (%U) at byte %d", r, i)
		}
	}
	return nil
}
