//! A grant's [`LeaseClock`]: its validity, which the renewer moves and the session's
//! deadline timer reads, and the session's word that it gave the grant up.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// The validity of one grant: until when the session may use it, or that the session
/// gave it up. Written by the renewer (renewals) and by the session (the release), read
/// by the session's deadline timer and by the renewer, which renews no grant released.
#[derive(Debug)]
pub(crate) struct LeaseClock {
    epoch: Instant,
    /// Nanoseconds after `epoch`, or [`RELEASED`]: a flag in the same word, so a
    /// renewal that lands after the release cannot move it back (see
    /// [`LeaseClock::extend`]), and the clock stays 40 bytes with its `Arc`.
    valid_until: AtomicU64,
}

/// [`LeaseClock::valid_until`] of a grant the session gave up.
const RELEASED: u64 = u64::MAX;

impl LeaseClock {
    pub(crate) fn new(valid_until: Instant) -> Self {
        let epoch = Instant::now();
        Self {
            epoch,
            valid_until: AtomicU64::new(Self::nanos(epoch, valid_until)),
        }
    }

    fn nanos(epoch: Instant, valid_until: Instant) -> u64 {
        let nanos = valid_until.saturating_duration_since(epoch).as_nanos();
        u64::try_from(nanos).unwrap_or(RELEASED).min(RELEASED - 1)
    }

    /// Until when the grant is valid (of a released grant: a time far away, which no
    /// one reads: the session forgot it).
    pub(crate) fn get(&self) -> Instant {
        self.epoch + Duration::from_nanos(self.valid_until.load(Ordering::Acquire))
    }

    /// Moves the validity to `valid_until`, unless the grant was released: then it
    /// returns `false` and the clock stays released.
    pub(crate) fn extend(&self, valid_until: Instant) -> bool {
        let nanos = Self::nanos(self.epoch, valid_until);
        (self.valid_until)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                (now != RELEASED).then_some(nanos)
            })
            .is_ok()
    }

    /// The session gave the grant up: the renewer renews it no more and forgets it at
    /// its next look, without being woken for it.
    pub(crate) fn release(&self) {
        self.valid_until.store(RELEASED, Ordering::Release);
    }

    pub(crate) fn released(&self) -> bool {
        self.valid_until.load(Ordering::Acquire) == RELEASED
    }
}
