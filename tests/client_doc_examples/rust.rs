//! The Rust blocks of the documentation (`<!-- example: part of ... -->`), each inside a
//! function with stand-ins for the application's own things, compiled with
//! `tests/client_doc_examples.rs`, which checks that each block appears here as written.
//! Not run: they name the default address, 127.0.0.1:7420, where no test sidecar listens.
#![allow(dead_code)]

use lockside::client::ClientError;
use tokio_stream::StreamExt;

async fn write_with_fence(_fencing_token: u64) {}

async fn more_work() {}

async fn debit(_account: &str, _amount: u64, _fencing_token: u64) {}

async fn credit(_account: &str, _amount: u64, _fencing_token: u64) {}

async fn lead(_fencing_token: u64) {}

fn route_to(_leader: &[u8]) {}

fn wait_for_one() {}

/// docs/clients.md, "From Rust".
async fn lock_and_write() -> Result<(), ClientError> {
    let client = lockside::client::Client::connect("127.0.0.1:7420").await?;
    let lock = client.lock("orders").await?; // waits; lock_with() for options
    write_with_fence(lock.fencing_token()).await; // pass the token along
    tokio::select! { _ = lock.lost() => {/* stop now */}, _ = more_work() => {} }
    lock.release().await?; // or drop the guard
    Ok(())
}

/// docs/clients.md, "Several keys at once".
async fn transfer() -> Result<(), ClientError> {
    let client = lockside::client::Client::connect("127.0.0.1:7420").await?;
    let both = client.lock_all(&["acct:alice", "acct:bob"]).await?; // both or neither
    debit("acct:alice", 30, both[0].fencing_token()).await; // each key's own token
    let bob = both.fencing_token("acct:bob").unwrap_or_default(); // or by key
    credit("acct:bob", 30, bob).await;
    both.release().await?; // or drop the guard
    Ok(())
}

/// docs/election.md, "From Rust".
async fn campaign_and_watch() -> Result<(), ClientError> {
    let client = lockside::client::Client::connect("127.0.0.1:7420").await?;
    let leader = client.campaign("jobs/leader", b"web-1:8080").await?; // returns once leading
    tokio::select! { _ = leader.lost() => {/* stop leading now */}, _ = lead(leader.fencing_token()) => {} }
    leader.proclaim(b"web-1:9090").await?; // followers see it
    leader.resign().await?; // or drop it

    let mut states = client.watch("jobs/leader").await?; // a follower
    while let Some(state) = states.next().await {
        match state?.holders.first() {
            Some(h) => route_to(&h.value),
            None => wait_for_one(),
        }
    }
    Ok(())
}
