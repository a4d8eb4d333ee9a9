//! A mailbox for a background task that reads it at times of its own choosing: the
//! renewer (a grant matters to it at its first renewal, TTL/3 after the grant) and the
//! journal (a grant matters to it once held for `FLUSH_EVERY`).
//!
//! A post says by when its item must be read, and wakes the task only when that is
//! earlier than the time the task has armed. A session that takes and gives back a lock
//! many times a second then wakes neither task per lock: each reads its mail at its own
//! next deadline (about every TTL/3 for the renewer, every 50 ms for the journal),
//! where a channel woke each task twice per lock, for the grant and for its release
//! (measured with perf: about 6 % of the sidecar's CPU per uncontended cycle on the
//! memory store).

use std::sync::Mutex;

use tokio::sync::Notify;
use tokio::time::Instant;

/// Items posted since the task last took them, and the time it will next take them.
pub(crate) struct Mailbox<T> {
    state: Mutex<State<T>>,
    earlier: Notify,
}

struct State<T> {
    items: Vec<T>,
    /// When the task will next take the items, without being woken (`None`: it waits
    /// for a post).
    armed: Option<Instant>,
}

impl<T> Mailbox<T> {
    pub(crate) fn new() -> Self {
        Self {
            state: Mutex::new(State {
                items: Vec::new(),
                armed: None,
            }),
            earlier: Notify::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State<T>> {
        // A panic while holding the lock leaves only a Vec and an Instant: usable.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Posts `item`, to be read by `by`: wakes the task only if it armed a later time.
    pub(crate) fn post(&self, item: T, by: Instant) {
        let mut state = self.state();
        state.items.push(item);
        if state.armed.is_none_or(|armed| by < armed) {
            state.armed = Some(by);
            drop(state);
            self.earlier.notify_one();
        }
    }

    /// Posts `item` only if `keep` holds for it; when the items have grown to twice
    /// what was kept last time, drops those `keep` rejects first (items that lost
    /// their reason while waiting: a grant released before its first renewal). The
    /// mailbox then holds at most about twice the items still wanted, at an amortized
    /// constant cost per post.
    pub(crate) fn post_compacting(
        &self,
        item: T,
        by: Instant,
        floor: usize,
        keep: impl Fn(&T) -> bool,
    ) {
        {
            let mut state = self.state();
            if state.items.len() >= floor && state.items.len() == state.items.capacity() {
                state.items.retain(|item| keep(item));
                let kept = state.items.len();
                state.items.shrink_to((2 * kept).max(floor));
            }
        }
        self.post(item, by);
    }

    /// The time the task will take its items: the earliest of what posts asked for
    /// since it last took them and `own`, its own next deadline. Called by the task
    /// before it waits.
    pub(crate) fn arm(&self, own: Option<Instant>) -> Option<Instant> {
        let mut state = self.state();
        state.armed = match (state.armed, own) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        state.armed
    }

    /// Completes when a post asks for an earlier time than the task armed.
    pub(crate) async fn earlier(&self) {
        self.earlier.notified().await;
    }

    /// Takes every item posted so far; the next post arms the mailbox again.
    pub(crate) fn take(&self) -> Vec<T> {
        let mut state = self.state();
        state.armed = None;
        std::mem::take(&mut state.items)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_post_wakes_the_task_only_when_wanted_earlier() {
        let mailbox = Mailbox::new();
        let now = Instant::now();
        let s = Duration::from_secs(1);
        mailbox.post(1, now + 3 * s);
        assert_eq!(mailbox.arm(None), Some(now + 3 * s));
        // The first post woke the task; the task has re-armed since.
        mailbox.earlier().await;
        mailbox.post(2, now + 5 * s);
        mailbox.post(3, now + 2 * s);
        assert_eq!(mailbox.arm(Some(now + 4 * s)), Some(now + 2 * s));
        mailbox.earlier().await;
        assert_eq!(mailbox.take(), vec![1, 2, 3]);
        assert_eq!(mailbox.arm(Some(now + 4 * s)), Some(now + 4 * s));
        mailbox.post(4, now + 6 * s);
        // Later than armed: no wake is stored for the task.
        let woken = tokio::time::timeout(s, mailbox.earlier()).await;
        assert!(woken.is_err(), "a later post woke the task");
    }

    #[test]
    fn compacting_keeps_the_mailbox_near_what_is_wanted() {
        let mailbox = Mailbox::new();
        let now = Instant::now();
        for i in 0..10_000u32 {
            // Only every hundredth item is still wanted.
            mailbox.post_compacting(i, now, 64, |i| i % 100 == 0);
        }
        let items = mailbox.take();
        assert!(items.len() < 300, "{} items kept", items.len());
        assert!(items.iter().filter(|i| *i % 100 == 0).count() == 100);
    }
}
