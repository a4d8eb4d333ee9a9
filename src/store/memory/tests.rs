//! Unit tests of the memory store: what it keeps and what it forgets.
use super::*;
use crate::store::FENCE_PER_MS;

const TTL: Duration = Duration::from_secs(10);

fn claim(key: &str, owner: &str) -> Claim {
    Claim {
        key: key.into(),
        owner: owner.into(),
        ttl: TTL,
        wait: false,
        session_id: owner.into(),
        client_name: String::new(),
        holder: String::new(),
        sharing: Sharing::Exclusive,
        limit: 1,
        fair: false,
        value: Vec::new(),
        ticket: None,
    }
}

async fn granted(store: &MemoryStore, c: &Claim) -> u64 {
    match store.acquire(c).await {
        Ok(Acquired::Granted { fence }) => fence,
        other => panic!("expected a grant, got {other:?}"),
    }
}

/// Once every due idle lock has had its chance to be forgotten: the store forgets
/// at its calls, so this makes one (a read, which creates nothing).
async fn settled(store: &MemoryStore) -> usize {
    tokio::time::advance(FORGET_AFTER).await;
    store.describe("unrelated").await.expect("memory store");
    store.len()
}

/// Issue 11, item 5: `Describe` needs no session; it must not grow the store.
#[tokio::test(start_paused = true)]
async fn describes_of_keys_nobody_locked_create_nothing() {
    let store = MemoryStore::new();
    for i in 0..1000 {
        let state = store.describe(&format!("never-{i}")).await.expect("memory");
        assert_eq!(state, KeyState::default());
    }
    assert_eq!(store.len(), 0);
    // Nor do calls about grants that do not exist.
    let batch: Vec<Renewal> = (0..10)
        .map(|_| Renewal {
            key: "gone",
            owner: "o",
            ttl: TTL,
        })
        .collect();
    assert!(
        store
            .renew(&batch)
            .await
            .expect("memory")
            .iter()
            .all(|r| !r.is_extended())
    );
    assert_eq!(
        store.reenter("gone", "o", 2, TTL).await.expect("memory"),
        None
    );
    assert_eq!(
        store
            .release("gone", "o", 0, Duration::ZERO)
            .await
            .expect("memory"),
        None
    );
    store.unwait(&claim("gone", "o")).await.expect("memory");
    assert_eq!(store.len(), 0);
}

/// Keys locked and released are forgotten once idle; a released key still shows its
/// last token to `Describe` for a while, and a lock-delay or a waiter keeps a key.
#[tokio::test(start_paused = true)]
async fn idle_keys_are_forgotten() {
    let store = MemoryStore::new();
    for i in 0..1000 {
        let key = format!("used-{i}");
        let fence = granted(&store, &claim(&key, "a")).await;
        assert_eq!(
            store
                .release(&key, "a", 0, Duration::ZERO)
                .await
                .expect("memory"),
            Some(0)
        );
        assert_eq!(store.describe(&key).await.expect("memory").fence, fence);
    }
    assert_eq!(settled(&store).await, 0, "every idle key forgotten");

    granted(&store, &claim("delayed", "a")).await;
    let delay = FORGET_AFTER * 5;
    store
        .release("delayed", "a", 0, delay)
        .await
        .expect("memory");
    granted(&store, &claim("waited", "a")).await;
    let waiter = Claim {
        wait: true,
        ..claim("waited", "b")
    };
    assert!(matches!(
        store.acquire(&waiter).await,
        Ok(Acquired::Busy { .. })
    ));
    store
        .release("waited", "a", 0, Duration::ZERO)
        .await
        .expect("memory");
    assert_eq!(
        settled(&store).await,
        2,
        "a lock-delay and a waiter keep their keys"
    );
    tokio::time::advance(delay).await;
    store.unwait(&waiter).await.expect("memory");
    assert_eq!(settled(&store).await, 0);
}

/// A forgotten key used again gets a larger token, even one whose last token ran
/// ahead of the clock (more than 1024 grants in a millisecond).
#[tokio::test(start_paused = true)]
async fn tokens_increase_across_a_forgotten_key() {
    let store = MemoryStore::new();
    let first = granted(&store, &claim("k", "a")).await;
    let ahead = first + 1_000_000 * FENCE_PER_MS;
    store
        .locks()
        .map
        .get_mut("k")
        .expect("kept while held")
        .fence = ahead;
    store
        .release("k", "a", 0, Duration::ZERO)
        .await
        .expect("memory");
    assert_eq!(settled(&store).await, 0, "forgotten");
    let again = granted(&store, &claim("k", "b")).await;
    assert!(again > ahead, "{again} after {ahead}");
    store
        .release("k", "b", 0, Duration::ZERO)
        .await
        .expect("memory");
    assert_eq!(settled(&store).await, 0);
    assert!(granted(&store, &claim("k", "c")).await > again);
}

/// A key locked and released again and again is queued to be forgotten about once a
/// `FORGET_AFTER`, not once per release: the queue stays as long as the idle locks are
/// many.
#[tokio::test(start_paused = true)]
async fn a_busy_key_is_queued_once() {
    let store = MemoryStore::new();
    // Two seconds of cycles: the first entry comes due (after FORGET_AFTER) while the
    // key is still in use, and the key is queued again then.
    for _ in 0..2000 {
        granted(&store, &claim("busy", "a")).await;
        store
            .release("busy", "a", 0, Duration::ZERO)
            .await
            .expect("memory");
        tokio::time::advance(Duration::from_millis(1)).await;
    }
    assert_eq!(store.locks().due.len(), 1, "one entry for one idle key");
    assert_eq!(settled(&store).await, 0, "forgotten in the end");
    assert!(store.locks().due.is_empty());
}
