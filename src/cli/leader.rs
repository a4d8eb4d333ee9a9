//! `lockside leader KEY`: who leads an election (`lockside elect`, or any client's
//! campaign): the leader's value on stdout and exit 0, or nothing and exit 3 when
//! nobody leads.

use std::io::Write;

use clap::Args;

use super::connect::ConnectArgs;
use super::hold::EXIT_UNAVAILABLE;
use crate::proto::{DescribeResponse, Holder};

/// Nobody leads the election (the key has no holder), as `lockside leader` says it.
pub const EXIT_NO_LEADER: u8 = 3;

/// Flags of `lockside leader`.
#[derive(Debug, Args)]
pub struct LeaderArgs {
    /// The election's key.
    pub key: String,

    /// The sidecar, its token and TLS.
    #[command(flatten)]
    pub connect: ConnectArgs,
}

/// The leader of an election key: its holder. A key held by several (shared, a
/// semaphore) is no election; its oldest grant (lowest token) answers then.
pub fn leader_of(state: &DescribeResponse) -> Option<&Holder> {
    state.holders.iter().min_by_key(|h| h.fencing_token)
}

/// Runs `lockside leader`: prints the leader's value (its bytes, then a newline) and
/// returns 0, or prints nothing and returns [`EXIT_NO_LEADER`].
pub async fn leader(args: LeaderArgs) -> u8 {
    let state = match args.connect.client().await {
        Ok(client) => client.describe(&args.key).await,
        Err(e) => Err(e),
    };
    let state = match state {
        Ok(state) => state,
        Err(e) => {
            eprintln!("lockside leader: {e}");
            return EXIT_UNAVAILABLE;
        }
    };
    let Some(leader) = leader_of(&state) else {
        return EXIT_NO_LEADER;
    };
    // The value's bytes as they are: a value need not be text.
    let mut out = std::io::stdout().lock();
    let written = out
        .write_all(&leader.value)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush());
    match written {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("lockside leader: writing the value: {e}");
            1
        }
    }
}
