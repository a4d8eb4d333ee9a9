//! Sessions that outlive their sidecar: the values of the store's session methods
//! ([`super::Store::record`], [`super::Store::attach`], [`super::Store::resume`]).
//!
//! A session that holds locks has a **record** in the store, so that any sidecar of the
//! same store and namespace can find its grants after the sidecar that served it died:
//! who may resume it (a hash of its secret), which sidecar it is attached to, its client
//! name, and one line per held lock (the grant's number, TTL and fencing token; the
//! lock's mode, limit, count and value are in the lock itself). Each sidecar that has
//! sessions with records keeps an **attachment** alive (a key with a short TTL): while
//! it exists, the sidecar is alive and its sessions cannot be resumed elsewhere.
//!
//! Resuming checks the secret, refuses while the record's sidecar is attached, claims
//! the record for the resuming sidecar with the session's new secret, then **re-keys**
//! each listed lock still held by the old owner (`session.secret.n`) to the new owner
//! (`session.new_secret.n`), keeping its count, token and value and extending it by its
//! TTL. Re-keying fences a frozen sidecar off: when it comes back, its owner tokens are
//! stale, so it can neither renew nor release the resumed grants.

use std::time::Duration;

use super::Sharing;

/// One held lock as a session's record lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordLine {
    /// The grant's number: the owner token is `session_id.secret.n`.
    pub grant: u64,
    /// The grant's TTL.
    pub ttl: Duration,
    /// The grant's fencing token (told to the client if the lock did not survive).
    pub fence: u64,
}

impl RecordLine {
    /// The line as the store keeps it: `n|ttl_ms|fence`.
    pub fn encode(&self) -> String {
        format!("{}|{}|{}", self.grant, self.ttl.as_millis(), self.fence)
    }

    /// Reads a line written by [`RecordLine::encode`]; `None` if it is not one.
    pub fn decode(text: &str) -> Option<Self> {
        let mut parts = text.split('|');
        let grant = parts.next()?.parse().ok()?;
        let ttl = Duration::from_millis(parts.next()?.parse().ok()?);
        let fence = parts.next()?.parse().ok()?;
        parts.next().is_none().then_some(Self { grant, ttl, fence })
    }
}

/// A session's record, for an acquire that may list its grant there in the same step
/// ([`super::Store::acquire_listed`]).
#[derive(Clone, Copy)]
pub struct Listing<'a> {
    /// The public session id.
    pub session_id: &'a str,
    /// The session's current secret: the record must be this one's.
    pub secret: &'a str,
    /// The grant's name (its key, and its holder when not the session itself).
    pub name: &'a str,
    /// The grant's number (the last part of its owner token).
    pub grant: u64,
}

/// Changes to one session's record, written by the sidecar the session is attached to.
/// Applied only while the record is this session's (its secret's hash matches): a
/// session resumed elsewhere never has its record changed by the sidecar it left.
/// Its `Debug` leaves the secret out.
#[derive(Clone, Default)]
pub struct RecordWrite {
    /// The public session id.
    pub session_id: String,
    /// The session's current secret (the record keeps only its SHA-1).
    pub secret: String,
    /// The client's name, kept in a record this write creates.
    pub client_name: String,
    /// This sidecar's id, written as the record's attachment when the write creates it.
    pub sidecar: String,
    /// Grants to list (name, line): a grant's name is its key, and its holder
    /// when not the session itself ([`super::names`]).
    pub set: Vec<(String, RecordLine)>,
    /// Grants' names to take off the list, each with the number of the grant that left:
    /// a line that names a later grant (listed by the acquire itself while this write
    /// was on its way, see [`super::Store::acquire_listed`]) stays.
    pub remove: Vec<(String, u64)>,
    /// The session ended: the record goes.
    pub end: bool,
    /// The writer has written lines to this record before: if the store has no record
    /// (it expired in an outage, a restart or a failover lost it), nothing is written
    /// and the answer is [`Recorded::Missing`], so that the writer writes every line
    /// again rather than make a record of this write's lines alone.
    pub listed: bool,
    /// How long the record lives after this write, unless written again. A record that
    /// lists no lock goes at once. A write with no line to list or take off (and no
    /// end) only extends the record.
    pub ttl: Duration,
    /// The session was resumed: a sidecar it left (frozen, then woken) may still try to
    /// write its record under an old secret, and would make a spent record again had
    /// it gone. So when this write makes the record go (the end, or its last line
    /// taken off), a *spent* mark stays for `ttl` instead: a record no secret opens,
    /// which refuses every write ([`Recorded::Foreign`]) and every resume.
    pub spent: bool,
}

impl std::fmt::Debug for RecordWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordWrite")
            .field("session_id", &self.session_id)
            .field("sidecar", &self.sidecar)
            .field("set", &self.set)
            .field("remove", &self.remove)
            .field("end", &self.end)
            .field("listed", &self.listed)
            .field("ttl", &self.ttl)
            .field("spent", &self.spent)
            .finish_non_exhaustive()
    }
}

/// What a [`RecordWrite`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Recorded {
    /// Applied (or nothing was there to change).
    Written,
    /// The record belongs to another generation of the session (it was resumed
    /// elsewhere): nothing was changed, and this sidecar must not write it again.
    Foreign,
    /// A write with `listed` found no record (it expired during an outage, or the
    /// store lost it): nothing was written, and the sidecar writes every line again.
    Missing,
}

/// A request to resume a session. Its `Debug` leaves both secrets out.
#[derive(Clone)]
pub struct ResumeClaim {
    /// The public session id.
    pub session_id: String,
    /// The secret the client presented (from its resume token).
    pub secret: String,
    /// The session's new secret: its record and its grants' owners take it.
    pub new_secret: String,
    /// The resuming sidecar's id: the record's new attachment.
    pub sidecar: String,
}

impl std::fmt::Debug for ResumeClaim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResumeClaim")
            .field("session_id", &self.session_id)
            .field("sidecar", &self.sidecar)
            .finish_non_exhaustive()
    }
}

impl ResumeClaim {
    /// The owner token of grant `n` under the old secret.
    pub fn old_owner(&self, n: u64) -> String {
        format!("{}.{}.{n}", self.session_id, self.secret)
    }

    /// The owner token of grant `n` under the new secret.
    pub fn new_owner(&self, n: u64) -> String {
        format!("{}.{}.{n}", self.session_id, self.new_secret)
    }

    /// What every owner token of the session starts with under the secret presented
    /// (`session_id.secret.`), and under the new one.
    pub fn owner_prefixes(&self) -> (String, String) {
        (
            format!("{}.{}.", self.session_id, self.secret),
            format!("{}.{}.", self.session_id, self.new_secret),
        )
    }
}

/// The answer to a [`ResumeClaim`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resumption {
    /// Not resumed, and why (see [`Refusal`]).
    Refused(Refusal),
    /// The record is now this sidecar's, under the new secret; one entry per lock it
    /// listed, in no particular order.
    Claimed(Vec<ResumedLock>),
}

/// Why a session was not resumed. Only a caller that presents the session's secret
/// can learn that it is [`Refusal::Attached`]: a wrong secret is [`Refusal::Unknown`],
/// so a refusal tells nothing about sessions whose secret the caller does not have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No such session under that secret: never written, spent (resumed or ended),
    /// expired, or the token is malformed. Retrying cannot help.
    Unknown,
    /// The session is still attached to a live stream (on its sidecar, or here): it
    /// may be resumable once that stream has ended and the attachment lapsed.
    Attached,
}

/// One lock a resumed session's record listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResumedLock {
    /// The grant's name: its key, and its holder when not the session itself
    /// ([`super::names`]).
    pub key: String,
    /// The line the record kept.
    pub line: RecordLine,
    /// The grant, re-keyed to the new owner and extended by its TTL; `None` when the
    /// old owner no longer held it (it expired, or the store lost it), or the store
    /// could not be asked.
    pub held: Option<ResumedGrant>,
}

/// A grant that survived, as the lock keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResumedGrant {
    /// The grant's number as the store has it: its owner under the new secret is
    /// `session_id.new_secret.grant` ([`ResumeClaim::new_owner`]). The record's line may
    /// name an earlier grant of the same key (a line is rewritten in the background once
    /// the key is granted again), so the store finds the session's grant by the owner's
    /// prefix, and says which one it found.
    pub grant: u64,
    /// Its hold count.
    pub count: u32,
    /// Its fencing token.
    pub fence: u64,
    /// Its mode.
    pub sharing: Sharing,
    /// Its limit (1 for a lock).
    pub limit: u32,
    /// The holder's value (empty for none).
    pub value: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_stay_out_of_debug_output() {
        let claim = ResumeClaim {
            session_id: "sid".into(),
            secret: "old-s3cret".into(),
            new_secret: "new-s3cret".into(),
            sidecar: "a".into(),
        };
        let write = RecordWrite {
            secret: "old-s3cret".into(),
            ..RecordWrite::default()
        };
        let shown = format!("{claim:?} {write:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("sid"), "{shown}");
    }

    #[test]
    fn lines_round_trip_and_refuse_garbage() {
        let line = RecordLine {
            grant: 7,
            ttl: Duration::from_millis(2500),
            fence: 1_838_492_390_858_752,
        };
        assert_eq!(line.encode(), "7|2500|1838492390858752");
        assert_eq!(RecordLine::decode(&line.encode()), Some(line));
        for bad in ["", "7", "7|x|1", "7|1|2|3", "-1|5|5"] {
            assert_eq!(RecordLine::decode(bad), None, "{bad:?}");
        }
    }
}
