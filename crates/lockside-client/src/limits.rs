//! The values of the contract a client needs (the `.proto`'s comments and `docs/`
//! state them; the sidecar keeps the same ones in `lockside::proto::limits`).

use std::time::Duration;

/// Where clients find the sidecar unless `LOCKSIDE_ADDR` says otherwise.
pub const DEFAULT_ADDR: &str = "127.0.0.1:7420";

/// Longest wait a client may ask for.
pub const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);

/// The request metadata header a client names itself with on `Lease`.
pub const CLIENT_NAME_HEADER: &str = "lockside-client-name";

/// The request metadata header that resumes a session on `Lease`.
pub const RESUME_HEADER: &str = "lockside-resume";

/// The response trailer of a refused resume (FAILED_PRECONDITION), saying why:
/// [`RESUME_REFUSED_UNKNOWN`] or [`RESUME_REFUSED_ATTACHED`].
pub const RESUME_REFUSED_TRAILER: &str = "lockside-resume-refused";

/// The session is gone (its token was never written, is spent, expired or
/// malformed): do not try again.
pub const RESUME_REFUSED_UNKNOWN: &str = "unknown";

/// The session is still attached to a live stream elsewhere: try again until it is
/// released.
pub const RESUME_REFUSED_ATTACHED: &str = "attached";

/// How long past its own wait an answer may take before the client gives up on it:
/// the sidecar answers every request, so only a broken sidecar or network hits this.
pub const ANSWER_SLACK: Duration = Duration::from_secs(10);
