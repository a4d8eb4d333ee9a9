//! `lockside elect KEY [--value V] -- CMD`: leader election from a shell, like `etcdctl
//! elect NAME PROPOSAL` with a command to run while leading.
//!
//! `elect` campaigns for KEY through the sidecar at `LOCKSIDE_ADDR`: a fair EXCLUSIVE
//! lock whose holder's value is `--value`, so candidates lead in the order they
//! campaigned, on every sidecar of the store, and followers see who leads (`lockside
//! leader KEY`, `lockside watch KEY`). Once it leads it runs CMD exactly as `hold` does
//! (`LOCKSIDE_KEY`, `LOCKSIDE_FENCING_TOKEN`, signals forwarded, the same exit
//! statuses): when CMD exits, leadership passes to the next candidate; when it is
//! lost, CMD is stopped and `elect` exits 77.

use std::time::Duration;

use clap::Args;

use super::connect::ConnectArgs;
use super::hold::{CommandArgs, run_holding};
use crate::client::{Client, ClientError, LockOptions, NotAcquired};
use crate::parse::parse_duration;
use crate::proto::limits::MAX_WAIT;

/// Flags of `lockside elect`.
#[derive(Debug, Args)]
pub struct ElectArgs {
    /// The election's key.
    pub key: String,

    /// The sidecar, its token and TLS.
    #[command(flatten)]
    pub connect: ConnectArgs,

    /// This candidate's value, shown to followers while it leads (its name or
    /// address; at most 4 KiB).
    #[arg(long, default_value = "")]
    pub value: String,

    /// The TTL of leadership (default: the sidecar's): if this candidate's sidecar
    /// dies, the next leader takes over after at most this long.
    #[arg(long, value_parser = parse_duration, allow_hyphen_values = true)]
    pub ttl: Option<Duration>,

    /// The command, and how it is stopped.
    #[command(flatten)]
    pub run: CommandArgs,
}

/// Runs `lockside elect`; returns the exit status.
pub async fn elect(args: ElectArgs) -> u8 {
    let key = args.key.clone();
    let options = LockOptions {
        wait: Some(MAX_WAIT),
        ttl: args.ttl,
        value: args.value.clone().into_bytes(),
        ..LockOptions::default()
    };
    let campaign = |client: Client| async move {
        loop {
            match client.campaign_with(&key, options.clone()).await {
                // One campaign waits 24 h at most; a candidate stays one until it leads.
                Err(ClientError::NotAcquired(NotAcquired::TimedOut(_))) => continue,
                won => return won.map(|leader| vec![leader.into_lock()]),
            }
        }
    };
    let keys = [args.key.clone()];
    run_holding("elect", &args.connect, &keys, &args.run, campaign).await
}
