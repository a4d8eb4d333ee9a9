//! Releasing, in the background, a grant the session no longer wants (cancelled, lost,
//! answered too late, renewed after being dropped, or released while the store did
//! not confirm it). The owner token is unique per grant, so this can never touch
//! anyone else's lock.
//!
//! A release the store does not confirm (unreachable, out of memory) is tried again
//! with backoff until it is, or until the grant's TTL has passed: by then the store has
//! let the lock go by itself. Without that, a lock released while the store refused
//! writes stayed taken for its whole TTL once the store was back.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::store::Store;

/// The first pause before a release is tried again; it doubles up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(50);
/// The longest pause between tries: the lock is free within a second of the store
/// taking writes again.
const RETRY_MAX: Duration = Duration::from_secs(1);

/// Releases the grant `owner` of `key` in the background, trying again while the store
/// does not confirm it, for at most `ttl` (the grant's TTL: the store holds it no
/// longer than that after its last renewal).
pub(crate) fn release_in_background(
    store: &Arc<dyn Store>,
    key: String,
    owner: String,
    ttl: Duration,
) {
    let store = store.clone();
    tokio::spawn(async move {
        let until = Instant::now() + ttl;
        let mut pause = RETRY_FIRST;
        let mut tries = 1u32;
        loop {
            let error = match store.release(&key, &owner, 0, Duration::ZERO).await {
                // Released, or no longer held: either way the lock is not this grant's.
                Ok(_) => {
                    if tries > 1 {
                        tracing::debug!(%key, tries, "a release the store had not confirmed went through");
                    }
                    return;
                }
                Err(error) => error,
            };
            if Instant::now() + pause >= until {
                tracing::debug!(%key, tries, %error, "a release was not confirmed before the grant's TTL; the store lets it go at its expiry");
                return;
            }
            // Backoff between tries of an unconfirmed write, not a wait for a lock.
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(RETRY_MAX);
            tries += 1;
        }
    });
}
