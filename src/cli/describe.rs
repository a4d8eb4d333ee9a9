//! `lockside describe KEY` (a lock's holders and queue) and `lockside healthcheck`
//! (exit 0 while the sidecar serves: for exec probes).

use clap::Args;

use super::connect::ConnectArgs;
use super::hold::EXIT_UNAVAILABLE;

/// Flags of `lockside describe`.
#[derive(Debug, Args)]
pub struct DescribeArgs {
    /// The lock's name.
    pub key: String,

    /// The sidecar, its token and TLS.
    #[command(flatten)]
    pub connect: ConnectArgs,
}

/// Flags of `lockside healthcheck`.
#[derive(Debug, Args)]
pub struct HealthcheckArgs {
    /// The sidecar, its token and TLS.
    #[command(flatten)]
    pub connect: ConnectArgs,

    /// Liveness only: exit 0 when the sidecar answers at all, even while its store is
    /// down (restarting the sidecar would not bring Redis back).
    #[arg(long)]
    pub live: bool,
}

/// Runs `lockside healthcheck`: 0 when the sidecar reports SERVING (with `--live`:
/// when it answers at all), 1 otherwise.
pub async fn healthcheck(args: HealthcheckArgs) -> u8 {
    let serving = match args.connect.client().await {
        Ok(client) => client.serving().await,
        Err(e) => Err(e),
    };
    match serving {
        Ok(_) if args.live => 0,
        Ok(true) => 0,
        Ok(false) => {
            eprintln!("lockside healthcheck: not serving (the lock store does not answer)");
            1
        }
        Err(e) => {
            eprintln!("lockside healthcheck: {e}");
            1
        }
    }
}

/// Runs `lockside describe`: prints the key's holders and queue; returns the exit
/// status.
pub async fn describe(args: DescribeArgs) -> u8 {
    let state = match args.connect.client().await {
        Ok(client) => client.describe(&args.key).await,
        Err(e) => Err(e),
    };
    let state = match state {
        Ok(state) => state,
        Err(e) => {
            eprintln!("lockside describe: {e}");
            return EXIT_UNAVAILABLE;
        }
    };
    let mode = crate::proto::LockMode::try_from(state.mode)
        .map(|m| m.as_str_name().trim_start_matches("LOCK_MODE_").to_owned())
        .unwrap_or_default();
    println!("key: {}", state.key);
    println!(
        "mode: {mode}  limit: {}  waiters: {}  last fencing token: {}",
        state.limit, state.waiters, state.fencing_token
    );
    for h in &state.holders {
        let ttl = h
            .ttl_remaining
            .map(|d| d.seconds as f64 + d.nanos as f64 / 1e9);
        println!(
            "holder {} ({}): holds {}, ttl {:.1}s",
            h.session_id,
            name(&h.client_name),
            h.hold_count,
            ttl.unwrap_or(0.0)
        );
    }
    for q in &state.queue {
        println!(
            "queue {}: {} ({})",
            q.position,
            q.session_id,
            name(&q.client_name)
        );
    }
    0
}

fn name(client_name: &str) -> &str {
    if client_name.is_empty() {
        "unnamed"
    } else {
        client_name
    }
}
