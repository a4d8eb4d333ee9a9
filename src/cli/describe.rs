//! `lockside describe KEY` (a lock's holders and queue, in words) and `lockside
//! healthcheck` (exit 0 while the sidecar serves: for exec probes).

use std::time::Duration;

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

/// Connects as the flags say (a bad token or certificate file is reported like an
/// unreachable sidecar: the command cannot do its work either way).
const NOT_SERVING: &str = "not serving: the sidecar cannot reach its lock store";

/// Runs `lockside healthcheck`: 0 when the sidecar reports SERVING (with `--live`:
/// when it answers at all), 1 otherwise. Says which on stdout (success) or stderr, in
/// words a probe's event log shows as they are.
pub async fn healthcheck(args: HealthcheckArgs) -> u8 {
    let serving = match args.connect.client().await {
        Ok(client) => client.serving().await,
        Err(e) => Err(e),
    };
    match serving {
        Ok(true) => {
            println!("serving");
            0
        }
        Ok(false) if args.live => {
            println!("alive ({NOT_SERVING})");
            0
        }
        Ok(false) => {
            eprintln!("lockside healthcheck: {NOT_SERVING}");
            1
        }
        Err(e) => {
            eprintln!("lockside healthcheck: {e}");
            1
        }
    }
}

/// Runs `lockside describe`: prints the key's state, holders and queue in words;
/// returns the exit status.
///
/// ```text
/// key: jobs/nightly
/// state: held exclusive
/// holder: session 3f2a9c0d11223344 (report-job), 1 hold, token 1815218112235520, expires in 9.9s unless renewed
/// waiting: 1
/// queued 1: session 0011223344556677 (unnamed), wants it exclusive
/// last fencing token: 1815218112235520
/// ```
pub async fn describe(args: DescribeArgs) -> u8 {
    let state = match args.connect.client().await {
        Ok(client) => client.describe(&args.key).await,
        Err(e) => Err(e),
    };
    match state {
        Ok(state) => {
            print!("{}", describe_text(&state));
            0
        }
        Err(e) => {
            eprintln!("lockside describe: {e}");
            EXIT_UNAVAILABLE
        }
    }
}

/// `lockside describe`'s text for one state.
fn describe_text(state: &crate::proto::DescribeResponse) -> String {
    use crate::proto::LockMode;
    use std::fmt::Write;
    let mode = |mode: i32| match LockMode::try_from(mode) {
        Ok(LockMode::Shared) => "shared",
        _ => "exclusive",
    };
    let mut text = format!("key: {}\n", state.key);
    let holders = state.holders.len();
    let held = match (holders, state.limit) {
        (0, _) => "free".to_owned(),
        (n, limit) if limit > 1 => format!("{n} of {limit} permits taken"),
        (_, _) if mode(state.mode) == "exclusive" => "held exclusive".to_owned(),
        (1, _) => "held shared by 1 session".to_owned(),
        (n, _) => format!("held shared by {n} sessions"),
    };
    let _ = writeln!(text, "state: {held}");
    for h in &state.holders {
        let ttl = h
            .ttl_remaining
            .and_then(|d| Duration::try_from(d).ok())
            .unwrap_or_default();
        let holds = match h.hold_count {
            1 => "1 hold".to_owned(),
            n => format!("{n} holds"),
        };
        let value = match h.value.is_empty() {
            true => String::new(),
            false => format!(", value {:?}", String::from_utf8_lossy(&h.value)),
        };
        let _ = writeln!(
            text,
            "holder: session {} ({}), {holds}, token {}{value}, expires in {} unless renewed",
            h.session_id,
            who(&h.client_name, &h.holder),
            h.fencing_token,
            crate::parse::format_duration(ttl)
        );
    }
    let _ = writeln!(text, "waiting: {}", state.waiters);
    for q in &state.queue {
        let _ = writeln!(
            text,
            "queued {}: session {} ({}), wants it {}",
            q.position,
            q.session_id,
            who(&q.client_name, &q.holder),
            mode(q.mode)
        );
    }
    match state.fencing_token {
        0 => text.push_str("last fencing token: none yet\n"),
        token => {
            let _ = writeln!(text, "last fencing token: {token}");
        }
    }
    text
}
/// Who holds or waits, in words: the client's name ("unnamed" without one) and the
/// holder inside its session, when it is not the session itself.
pub(super) fn who(client_name: &str, holder: &str) -> String {
    let name = if client_name.is_empty() {
        "unnamed"
    } else {
        client_name
    };
    match holder {
        "" => name.to_owned(),
        holder => format!("{name}, holder {holder}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{DescribeResponse, Holder, LockMode, QueueEntry};

    #[test]
    fn describe_says_shared_holders_permits_and_the_queue_in_words() {
        let holder = |id: &str, name: &str| Holder {
            session_id: id.into(),
            hold_count: 2,
            ttl_remaining: Some(prost_types::Duration {
                seconds: 4,
                nanos: 500_000_000,
            }),
            client_name: name.into(),
            value: name.as_bytes().to_vec(),
            fencing_token: 40 + id.len() as u64,
            holder: String::new(),
        };
        let shared = DescribeResponse {
            key: "reports".into(),
            mode: LockMode::Shared as i32,
            limit: 1,
            holders: vec![holder("a1", "reader"), holder("b2", "")],
            waiters: 1,
            fencing_token: 42,
            queue: vec![QueueEntry {
                session_id: "c3".into(),
                client_name: "writer".into(),
                mode: LockMode::Exclusive as i32,
                position: 1,
                holder: "thread-9".into(),
            }],
        };
        assert_eq!(
            describe_text(&shared),
            "key: reports\n\
             state: held shared by 2 sessions\n\
             holder: session a1 (reader), 2 holds, token 42, value \"reader\", expires in 4.5s unless renewed\n\
             holder: session b2 (unnamed), 2 holds, token 42, expires in 4.5s unless renewed\n\
             waiting: 1\n\
             queued 1: session c3 (writer, holder thread-9), wants it exclusive\n\
             last fencing token: 42\n"
        );
        let semaphore = DescribeResponse {
            mode: LockMode::Exclusive as i32,
            limit: 4,
            queue: vec![],
            ..shared
        };
        assert!(describe_text(&semaphore).contains("state: 2 of 4 permits taken\n"));
    }
}
