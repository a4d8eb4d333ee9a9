//! Several keys at once through the core (`Client::acquire_all`): what
//! `NativeClient::acquire_all` (the package's `client.lockAll`) does, kept here so
//! that `objects.rs` stays one room.

use lockside_client::{Client, ClientError, LockOptions, NotAcquired};
use tokio::sync::oneshot;

use crate::failure;
use crate::objects::NativeLock;

/// `lockAll()`'s options as the core takes them (the package checked the values; a
/// wait of 0 does not wait).
pub(crate) fn options(
    wait: Option<f64>,
    ttl: Option<f64>,
    shared: bool,
    fair: bool,
) -> LockOptions {
    LockOptions {
        wait: wait.map(crate::objects::seconds),
        ttl: ttl.map(crate::objects::seconds),
        shared,
        fair,
        ..LockOptions::default()
    }
}

/// Takes every key of `keys` for `holder` (undefined: a holder of its own), all or
/// none, unless `given_up` hears first (the wait is then cancelled on the sidecar and
/// nothing is held); the locks in the order asked.
pub(crate) async fn acquire_all(
    client: &Client,
    keys: &[String],
    options: &LockOptions,
    holder: Option<String>,
    given_up: oneshot::Receiver<()>,
) -> napi::Result<Vec<NativeLock>> {
    let client = client.clone();
    let acquired = tokio::select! {
        acquired = client.acquire_all(keys, options, holder.as_deref()) => Some(acquired),
        _ = given_up => None,
    };
    match acquired {
        Some(Ok(handles)) => Ok(handles.into_iter().map(NativeLock::new).collect()),
        Some(Err(e)) => Err(failure(e)),
        None => Err(failure(ClientError::NotAcquired(NotAcquired::Cancelled))),
    }
}
