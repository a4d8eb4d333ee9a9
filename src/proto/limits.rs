//! Limits and defaults that are part of the protocol: each is stated in the `.proto`'s
//! comments or in `docs/` (protocol.md, configuration.md), and clients in every language
//! rely on it. Limits a sidecar operator may tune (sessions, locks per session, ...) are
//! not here: they are the engine's configuration.

use std::time::Duration;

/// Shortest TTL a client may ask for: renewals every 333 ms are the most a sidecar
/// should do per lock, and shorter leases leave no room for a store round trip.
pub const MIN_TTL: Duration = Duration::from_secs(1);

/// Longest wait a client may ask for; longer values are almost certainly unit mistakes.
pub const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);

/// Longest key, in bytes of UTF-8.
pub const MAX_KEY_BYTES: usize = 512;

/// Longest client name kept from the [`CLIENT_NAME_HEADER`]; longer names are cut.
pub const MAX_CLIENT_NAME_BYTES: usize = 128;

/// Where clients find the sidecar unless `LOCKSIDE_ADDR` says otherwise.
pub const DEFAULT_ADDR: &str = "127.0.0.1:7420";

/// The request metadata header a client names itself with on `Lease`.
pub const CLIENT_NAME_HEADER: &str = "lockside-client-name";

/// Longest holder value (`Acquire.value`, `Proclaim.value`), in bytes.
pub const MAX_VALUE_BYTES: usize = 4 * 1024;

/// The request metadata header that resumes a session on `Lease`: its value is the
/// `SessionStarted.resume_token` of the session.
pub const RESUME_HEADER: &str = "lockside-resume";

/// The trailer of a `Lease` stream that resuming refused (FAILED_PRECONDITION), saying
/// why: [`RESUME_REFUSED_UNKNOWN`] or [`RESUME_REFUSED_ATTACHED`]. Clients read it to
/// tell a session that is gone from one that may be resumable in a moment.
pub const RESUME_REFUSED_TRAILER: &str = "lockside-resume-refused";

/// No session has this token (never issued, resumed or ended already, expired,
/// malformed): the session and its locks are gone; do not retry.
pub const RESUME_REFUSED_UNKNOWN: &str = "unknown";

/// The session is still attached to a live stream (on its sidecar, or this one):
/// retry until that stream has ended and its attachment lapsed.
pub const RESUME_REFUSED_ATTACHED: &str = "attached";

/// The longest holder name (`Acquire.holder`), in bytes of UTF-8.
pub const MAX_HOLDER_BYTES: usize = 128;
