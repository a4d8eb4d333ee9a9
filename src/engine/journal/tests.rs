//! The journal's memory: what it keeps of a session's record after a flush.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Entry, SessionRef, Task};
use crate::engine::mailbox::Mailbox;
use crate::store::memory::MemoryStore;
use crate::store::{RecordLine, Store};

fn session() -> Arc<SessionRef> {
    Arc::new(SessionRef {
        serial: 1,
        id: "0123456789abcdef".into(),
        secret: "s".into(),
        client_name: "test".into(),
        resumed: false,
    })
}

fn task() -> Task {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    Task {
        store,
        sidecar: "sidecar".into(),
        attachment: Duration::from_secs(10),
        mailbox: Arc::new(Mailbox::new()),
        tracked: Default::default(),
        refreshes: Default::default(),
        dirty: Default::default(),
        flush_at: None,
        attach_at: None,
        attached_ttl: Duration::ZERO,
        failing: Default::default(),
        waiting: Vec::new(),
    }
}

/// A grant's entry, and whether the session waiting for it was answered.
fn granted(s: &Arc<SessionRef>, key: Arc<str>, line: RecordLine) -> (Entry, Waiter) {
    let (done, written) = tokio::sync::oneshot::channel();
    (Entry::Granted(s.clone(), key, line, done), written)
}

type Waiter = tokio::sync::oneshot::Receiver<()>;

/// The first grant's line of a 10 s lock, token 7.
fn line() -> RecordLine {
    RecordLine {
        grant: 1,
        ttl: Duration::from_secs(10),
        fence: 7,
    }
}

/// Issue 25: the attachment lives at most two fifths of the shortest TTL the records
/// list, so that another sidecar can resume within half of it after this one died.
#[tokio::test(start_paused = true)]
async fn the_attachment_lives_two_fifths_of_the_shortest_ttl_listed() {
    let mut task = task();
    assert_eq!(
        task.attachment_ttl(),
        Duration::from_secs(10),
        "--attachment-ttl"
    );
    let s = session();
    for (key, secs) in [("long", 60), ("short", 5)] {
        let line = RecordLine {
            grant: secs,
            ttl: Duration::from_secs(secs),
            fence: 1,
        };
        let (entry, _waiter) = granted(&s, key.into(), line);
        task.apply(entry);
    }
    assert_eq!(task.attachment_ttl(), Duration::from_secs(2));
    task.flush(true).await;
    assert_eq!(task.attached_ttl, Duration::from_secs(2), "written so");
}

/// A session that took 1,000 locks at once, then gave them back: once written, its
/// pending changes give their table back, and so does the record's list once empty
/// (a hash table never shrinks by itself: 2,048 buckets of each were kept before).
#[tokio::test(start_paused = true)]
async fn a_flush_gives_back_the_tables_of_changes_written() {
    let mut task = task();
    let s = session();
    let keys: Vec<Arc<str>> = (0..1000).map(|i| format!("k{i}").into()).collect();
    for (i, key) in keys.iter().enumerate() {
        let line = RecordLine {
            grant: i as u64 + 1,
            ttl: Duration::from_secs(10),
            fence: 1,
        };
        let (entry, _waiter) = granted(&s, key.clone(), line);
        task.apply(entry);
    }
    task.flush(true).await;
    let tracked = &task.tracked[&1];
    assert_eq!(tracked.listed.len(), 1000, "every grant is listed");
    assert!(tracked.pending.is_empty());
    assert!(
        tracked.pending.capacity() < 64,
        "pending keeps room for {} changes",
        tracked.pending.capacity()
    );
    // The key is the session's own string, not a copy.
    let (listed, _) = tracked.listed.get_key_value(&*keys[0]).expect("listed");
    assert!(Arc::ptr_eq(listed, &keys[0]));

    for key in &keys {
        task.apply(Entry::Dropped(s.clone(), key.clone(), Instant::now()));
    }
    task.flush(true).await;
    let tracked = &task.tracked[&1];
    assert!(tracked.listed.is_empty(), "every lock was taken off");
    assert!(
        tracked.listed.capacity() < 64,
        "the list keeps room for {} lines",
        tracked.listed.capacity()
    );
}

/// Issue 32, item 3: no grant without a way back. A new grant is written at the next
/// flush, due at once (not [`super::FLUSH_EVERY`] later), and its session is answered
/// only once that flush is done; with the records' writes failing already, at once.
#[tokio::test(start_paused = true)]
async fn a_grant_is_written_at_once_and_its_session_answered_after_the_write() {
    let mut task = task();
    let s = session();
    let line = line();
    let (entry, mut waiter) = granted(&s, "k".into(), line.clone());
    task.apply(entry);
    assert!(
        task.flush_at.is_some_and(|at| at <= Instant::now()),
        "due now"
    );
    assert!(waiter.try_recv().is_err(), "not answered before the write");
    task.flush(false).await;
    assert_eq!(task.tracked[&1].listed.get("k"), Some(&line), "written");
    assert!(waiter.try_recv().is_ok(), "answered after the write");
    // Given back and granted again before the removal is written: the record names the
    // key still, so the grant is told at once and written with the next window.
    task.apply(Entry::Dropped(s.clone(), "k".into(), Instant::now()));
    let again = RecordLine { grant: 2, ..line };
    let (entry, mut waiter) = granted(&s, "k".into(), again);
    task.apply(entry);
    assert!(waiter.try_recv().is_ok(), "answered at once");
    assert!(task.waiting.is_empty());
}

/// A journal whose writes fail does not make grants wait for them: the session is told
/// so when it posts the grant, not when the journal gets to it (it may be stuck in a
/// write to a frozen master).
#[tokio::test(start_paused = true)]
async fn a_grant_waits_for_no_journal_whose_writes_fail() {
    let store: Arc<dyn Store> = Arc::new(crate::store::memory::MemoryStore::new());
    let journal = super::Journal::spawn(store, "sidecar".into(), Duration::from_secs(10));
    let line = line();
    let s = session();
    // The memory store does not resume: no record to wait for.
    assert!(
        journal
            .granted(&s, "k".into(), line.clone(), false)
            .is_none()
    );
    let mut task = task();
    task.failing.force_records_failing();
    assert!(task.failing.shared_failing(), "told to the sessions");
}

/// A grant of a key the record names already is answered as soon as the journal reads
/// its post, not at the timer's next tick: tokio's timers round up to the millisecond,
/// and a wait for one made every uncontended cycle 1.1 ms longer (1.7 ms against
/// 0.44 ms, `clients/python/bench.py`'s core row).
#[tokio::test(start_paused = true)]
async fn a_grant_due_now_is_answered_without_waiting_for_a_timer() {
    let mut task = task();
    let s = session();
    let line = line();
    let (entry, _waiter) = granted(&s, "k".into(), line.clone());
    task.apply(entry);
    task.flush(true).await;
    task.apply(Entry::Dropped(s.clone(), "k".into(), Instant::now()));
    let mailbox = task.mailbox.clone();
    let alive = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(task.run(alive.clone()));
    // Between two ticks of the timer, as a real grant nearly always is.
    tokio::time::advance(Duration::from_micros(300)).await;
    let asked = Instant::now();
    let (entry, waiter) = granted(&s, "k".into(), RecordLine { grant: 2, ..line });
    mailbox.post(entry, asked);
    waiter.await.expect("answered");
    assert_eq!(asked.elapsed(), Duration::ZERO, "answered without a timer");
    alive.cancel();
    running.await.expect("the journal stops");
}

/// One session's new grant is written at once; another session's release, made a
/// moment before, waits for its own window rather than go with it. Written with it (as
/// before), that session's next grant of the key found it unlisted and waited for a
/// write of its own: with 16 sessions taking turns on one key, two record writes per
/// handoff and a round trip more before each `Granted` (bench phase `handoff`).
#[tokio::test(start_paused = true)]
async fn a_release_waits_for_its_window_when_another_sessions_grant_is_written() {
    let mut task = task();
    let a = session();
    let b = Arc::new(SessionRef {
        serial: 2,
        id: "fedcba9876543210".into(),
        secret: "t".into(),
        client_name: "test".into(),
        resumed: false,
    });
    let line = line();
    let (entry, _waiter) = granted(&a, "k".into(), line.clone());
    task.apply(entry);
    task.flush(false).await;
    assert!(
        task.tracked[&1].listed.contains_key("k"),
        "a's grant written"
    );
    task.apply(Entry::Dropped(a.clone(), "k".into(), Instant::now()));
    tokio::time::advance(Duration::from_millis(1)).await;
    let (entry, _waiter) = granted(
        &b,
        "k".into(),
        RecordLine {
            grant: 2,
            ..line.clone()
        },
    );
    task.apply(entry);
    task.flush(false).await;
    assert!(
        task.tracked[&2].listed.contains_key("k"),
        "b's grant written at once"
    );
    assert!(
        task.tracked[&1].listed.contains_key("k"),
        "a's release waits for its window"
    );
    // a takes the key again within the window: listed still, so told at once.
    let (entry, mut waiter) = granted(
        &a,
        "k".into(),
        RecordLine {
            grant: 3,
            ..line.clone()
        },
    );
    task.apply(entry);
    assert!(waiter.try_recv().is_ok(), "answered at once");
    // Given back for good: written once its window has passed.
    task.apply(Entry::Dropped(a.clone(), "k".into(), Instant::now()));
    tokio::time::advance(super::FLUSH_EVERY).await;
    task.flush(false).await;
    assert!(
        !task.tracked[&1].listed.contains_key("k"),
        "written in its window"
    );
}

/// Issue 37: a grant the store listed as it granted it costs the journal no write and
/// no wait; it outdates a removal of the key not written yet, and its own release is
/// written in its window, for its grant.
#[tokio::test(start_paused = true)]
async fn a_grant_the_store_listed_is_not_written_again() {
    let mut task = task();
    let s = session();
    let line = line();
    let (entry, _waiter) = granted(&s, "k".into(), line.clone());
    task.apply(entry);
    task.flush(false).await;
    task.apply(Entry::Dropped(s.clone(), "k".into(), Instant::now()));
    let again = RecordLine { grant: 2, ..line };
    task.apply(Entry::Listed(s.clone(), "k".into(), again.clone()));
    let tracked = &task.tracked[&1];
    assert_eq!(tracked.listed.get("k"), Some(&again), "listed");
    assert!(tracked.pending.is_empty(), "the removal is outdated");
    assert!(task.waiting.is_empty(), "nobody waits");
    task.apply(Entry::Dropped(s.clone(), "k".into(), Instant::now()));
    tokio::time::advance(super::FLUSH_EVERY).await;
    task.flush(false).await;
    assert!(
        !task.tracked[&1].listed.contains_key("k"),
        "released in its window"
    );
}
