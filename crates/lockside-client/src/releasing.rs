//! Releases written and not answered yet, process-wide: what makes a release that
//! returns without waiting for its answer invisible to the rest of the process.
//!
//! A release returns once its `Release` is on the stream: later requests on that
//! stream are ordered after it by the sidecar (a holder's requests on one key queue
//! behind each other). Requests that take another way do not: another session's
//! acquire of the key (another client, here or on another sidecar), another holder's
//! acquire on this session, a `Describe` or a `Watch`. Those wait here until the
//! key's releases are answered (or [`ANSWER_SLACK`] has passed), so that within one
//! process a key released is free, exactly as if the release had waited.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex};

use tokio::sync::Notify;

use crate::limits::ANSWER_SLACK;

/// One release in flight: its session, holder and request id.
struct Entry {
    session: u64,
    holder: String,
    request_id: u64,
}

static IN_FLIGHT: LazyLock<Mutex<HashMap<String, Vec<Entry>>>> = LazyLock::new(Default::default);
/// How many entries [`IN_FLIGHT`] has: the common case (none) takes no lock.
static COUNT: AtomicUsize = AtomicUsize::new(0);
static ANSWERED: LazyLock<Notify> = LazyLock::new(Notify::new);

/// A release of `key` by `holder` of `session` went out as `request_id`.
pub(crate) fn add(key: &str, session: u64, holder: &str, request_id: u64) {
    let Ok(mut map) = IN_FLIGHT.lock() else {
        return;
    };
    map.entry(key.to_owned()).or_default().push(Entry {
        session,
        holder: holder.to_owned(),
        request_id,
    });
    COUNT.fetch_add(1, Ordering::Relaxed);
}

/// The release `request_id` of `session` was answered (or will never be).
pub(crate) fn remove(key: &str, session: u64, request_id: u64) {
    let Ok(mut map) = IN_FLIGHT.lock() else {
        return;
    };
    let Some(entries) = map.get_mut(key) else {
        return;
    };
    let before = entries.len();
    entries.retain(|e| !(e.session == session && e.request_id == request_id));
    let gone = before - entries.len();
    if entries.is_empty() {
        map.remove(key);
    }
    drop(map);
    if gone > 0 {
        COUNT.fetch_sub(gone, Ordering::Relaxed);
        ANSWERED.notify_waiters();
    }
}

/// Every release of `session` is over (it ended).
pub(crate) fn remove_session(session: u64) {
    if COUNT.load(Ordering::Relaxed) == 0 {
        return;
    }
    let Ok(mut map) = IN_FLIGHT.lock() else {
        return;
    };
    let mut gone = 0;
    map.retain(|_, entries| {
        let before = entries.len();
        entries.retain(|e| e.session != session);
        gone += before - entries.len();
        !entries.is_empty()
    });
    drop(map);
    if gone > 0 {
        COUNT.fetch_sub(gone, Ordering::Relaxed);
        ANSWERED.notify_waiters();
    }
}

/// Whether a release of `key` is in flight that a request by `who` (a session and a
/// holder; `None`: a Describe or Watch) is not ordered after.
fn blocked(key: &str, who: Option<(u64, &str)>) -> bool {
    if COUNT.load(Ordering::Relaxed) == 0 {
        return false;
    }
    let Ok(map) = IN_FLIGHT.lock() else {
        return false;
    };
    map.get(key).is_some_and(|entries| {
        entries
            .iter()
            .any(|e| who.is_none_or(|(s, h)| e.session != s || e.holder != h))
    })
}

/// Waits until no release of `key` that a request by `who` would not be ordered after
/// is in flight, for [`ANSWER_SLACK`] at most.
pub(crate) async fn settled(key: &str, who: Option<(u64, &str)>) {
    if !blocked(key, who) {
        return;
    }
    let deadline = tokio::time::Instant::now() + ANSWER_SLACK;
    loop {
        let answered = ANSWERED.notified();
        tokio::pin!(answered);
        answered.as_mut().enable();
        if !blocked(key, who) {
            return;
        }
        if tokio::time::timeout_at(deadline, answered).await.is_err() {
            return;
        }
    }
}
