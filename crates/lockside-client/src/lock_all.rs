//! Several keys at once (DESIGN.md, "Several keys at once"): [`Client::lock_all`] and
//! the bindings' [`Client::acquire_all`], all or none, in any order without deadlock;
//! [`LockAllGuard`], the grants held together (each an ordinary [`LockGuard`]).

use crate::client::{Client, LockHandle};
use crate::lock::LockGuard;
use crate::{ClientError, LockOptions};

impl Client {
    /// Takes every key of `keys` (2 to 64 distinct keys) for `holder` (`None`: a
    /// holder of its own) as `options` say, all or none; the bindings' `lock_all`
    /// (dropping the handles does not release them). The handles come in the order
    /// asked. A key `holder` holds already is re-entered (its hold count grows).
    /// `options.limit` and `options.value` are for single keys: a limit above 1 or a
    /// value is refused here.
    pub async fn acquire_all<K: AsRef<str>>(
        &self,
        keys: &[K],
        options: &LockOptions,
        holder: Option<&str>,
    ) -> Result<Vec<LockHandle>, ClientError> {
        if options.limit > 1 {
            return Err(ClientError::Settings(
                "a semaphore (limit > 1) is a single key: lock_all takes locks".into(),
            ));
        }
        if !options.value.is_empty() {
            return Err(ClientError::Settings(
                "a holder's value is given with a single key's lock (or proclaimed afterwards), not with lock_all".into(),
            ));
        }
        if keys.is_empty() {
            return Err(ClientError::Settings(
                "lock_all takes 2 to 64 keys: none given".into(),
            ));
        }
        let keys: Vec<String> = keys.iter().map(|k| k.as_ref().to_owned()).collect();
        // A session that ends before the request went out is not this caller's
        // failure: ask the next one.
        for _ in 0..3 {
            let session = self.session().await?;
            match session.acquire_all(&keys, options, holder).await {
                Ok(cells) => {
                    return Ok(cells
                        .into_iter()
                        .map(|cell| LockHandle {
                            session: session.clone(),
                            cell,
                        })
                        .collect());
                }
                Err(Some(e)) => return Err(e),
                Err(None) => continue,
            }
        }
        Err(ClientError::Unavailable(
            "lease stream ended before the request went out".into(),
        ))
    }

    /// Takes every key of `keys` exclusively, all or none, waiting as long as needed
    /// (24 h at most). Two callers asking for overlapping keys in any order never
    /// deadlock: a waiting request holds nothing.
    ///
    /// ```no_run
    /// # async fn demo(client: lockside_client::Client) -> Result<(), lockside_client::ClientError> {
    /// let both = client.lock_all(&["account:alice", "account:bob"]).await?;
    /// let (from, to) = (both[0].fencing_token(), both[1].fencing_token());
    /// // move the money, each write fenced by its account's token
    /// both.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn lock_all<K: AsRef<str>>(&self, keys: &[K]) -> Result<LockAllGuard, ClientError> {
        let options = LockOptions {
            wait: Some(crate::limits::MAX_WAIT),
            ..LockOptions::default()
        };
        self.lock_all_with(keys, options).await
    }

    /// Takes every key of `keys` as `options` say (wait, TTL, shared, fair; `limit`
    /// and `value` are for single keys), all or none.
    pub async fn lock_all_with<K: AsRef<str>>(
        &self,
        keys: &[K],
        options: LockOptions,
    ) -> Result<LockAllGuard, ClientError> {
        let handles = self.acquire_all(keys, &options, None).await?;
        Ok(LockAllGuard {
            locks: handles.into_iter().map(LockHandle::into_guard).collect(),
        })
    }
}

/// Several locks taken together by [`Client::lock_all`]: one [`LockGuard`] per key, in
/// the order asked (index it, iterate it, or find one by [`LockAllGuard::get`]). Each
/// is a lock of its own afterwards, with its fencing token and its states: one may be
/// suspended or lost while the others are held. Dropping it, or
/// [`LockAllGuard::release`], releases every one.
#[derive(Debug)]
pub struct LockAllGuard {
    locks: Vec<LockGuard>,
}

impl LockAllGuard {
    /// The lock of `key`, if it is one of them.
    pub fn get(&self, key: &str) -> Option<&LockGuard> {
        self.locks.iter().find(|l| l.key() == key)
    }

    /// The fencing token of `key`, if it is one of them: pass it to what `key`
    /// protects.
    pub fn fencing_token(&self, key: &str) -> Option<u64> {
        self.get(key).map(LockGuard::fencing_token)
    }

    /// Each key with its fencing token, in the order asked.
    pub fn fencing_tokens(&self) -> Vec<(&str, u64)> {
        self.locks
            .iter()
            .map(|l| (l.key(), l.fencing_token()))
            .collect()
    }

    /// Whether every lock is held now (none suspended, none lost): use the resources
    /// only then.
    pub fn all_held(&self) -> bool {
        self.locks
            .iter()
            .all(|l| l.state() == crate::LockState::Held)
    }

    /// Completes when any of the locks is lost; stop using every resource then.
    pub async fn lost(&self) {
        let losses = self.locks.iter().map(|l| Box::pin(l.lost()));
        let _ = futures_select_all(losses).await;
    }

    /// Releases every lock (each returns once its `Release` is on the stream); the
    /// first error, after trying them all (`Lost` for a lock lost before).
    pub async fn release(self) -> Result<(), ClientError> {
        let mut first = Ok(());
        for lock in self.locks {
            let released = lock.release().await;
            if first.is_ok() {
                first = released;
            }
        }
        first
    }

    /// The locks, to release or keep each on its own.
    pub fn into_locks(self) -> Vec<LockGuard> {
        self.locks
    }
}

impl std::ops::Deref for LockAllGuard {
    type Target = [LockGuard];

    fn deref(&self) -> &[LockGuard] {
        &self.locks
    }
}

impl<'a> IntoIterator for &'a LockAllGuard {
    type Item = &'a LockGuard;
    type IntoIter = std::slice::Iter<'a, LockGuard>;

    fn into_iter(self) -> Self::IntoIter {
        self.locks.iter()
    }
}

/// The first of `futures` to complete (none: never). Polled together, woken by any.
async fn futures_select_all<F: std::future::Future<Output = ()> + Unpin>(
    futures: impl IntoIterator<Item = F>,
) {
    let mut futures: Vec<F> = futures.into_iter().collect();
    if futures.is_empty() {
        return std::future::pending().await;
    }
    std::future::poll_fn(|cx| {
        for f in futures.iter_mut() {
            if std::pin::Pin::new(f).poll(cx).is_ready() {
                return std::task::Poll::Ready(());
            }
        }
        std::task::Poll::Pending
    })
    .await;
}
