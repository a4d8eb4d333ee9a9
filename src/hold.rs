//! `lockside hold` and `lockside describe`: the sidecar from a shell, like
//! `etcdctl lock NAME -- CMD`.
//!
//! `hold` takes a lock through the sidecar at `LOCKSIDE_ADDR`, runs CMD with
//! `LOCKSIDE_FENCING_TOKEN` and `LOCKSIDE_KEY` in its environment, forwards SIGINT and
//! SIGTERM to it, releases the lock when CMD exits and exits with CMD's status. If the
//! lock is lost while CMD runs (a `Lost` event, or the stream to the sidecar broke), CMD
//! gets SIGTERM, then SIGKILL after `--kill-grace`, and `hold` exits with
//! [`EXIT_LOST`].

use std::process::ExitStatus;
use std::time::Duration;

use clap::{Args, ValueEnum};
use rustix::process::{Pid, Signal, kill_process};
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};

use crate::client::{Client, ClientError, LockOptions};
use crate::config::{ConnectArgs, parse_duration};

/// The sidecar could not be reached or refused the request (sysexits EX_UNAVAILABLE).
pub const EXIT_UNAVAILABLE: u8 = 69;
/// The lock was not acquired within `--wait` (sysexits EX_TEMPFAIL: try again later).
pub const EXIT_NOT_ACQUIRED: u8 = 75;
/// The lock was lost while CMD ran; CMD was stopped (sysexits EX_NOPERM: the permission
/// to use the resource was withdrawn).
pub const EXIT_LOST: u8 = 77;
/// CMD could not be started (as shells answer for a command that is not found).
pub const EXIT_NO_COMMAND: u8 = 127;

/// Lock mode on the command line.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ModeArg {
    /// One holder at a time (or one permit of a semaphore with --limit).
    Exclusive,
    /// Any number of shared holders, no exclusive one.
    Shared,
}

/// Flags of `lockside hold`.
#[derive(Debug, Args)]
pub struct HoldArgs {
    /// The lock's name.
    pub key: String,

    /// The sidecar, its token and TLS.
    #[command(flatten)]
    pub connect: ConnectArgs,

    /// How long to wait for the lock (default: as long as the sidecar allows, 24 h).
    #[arg(long, value_parser = parse_duration)]
    pub wait: Option<Duration>,

    /// The lock's TTL (default: the sidecar's).
    #[arg(long, value_parser = parse_duration)]
    pub ttl: Option<Duration>,

    /// Exclusive or shared.
    #[arg(long, value_enum, default_value = "exclusive")]
    pub mode: ModeArg,

    /// N > 1: take one permit of a semaphore of N.
    #[arg(long, default_value_t = 0)]
    pub limit: u32,

    /// Wait in arrival order.
    #[arg(long)]
    pub fair: bool,

    /// After the lock is lost, how long CMD has to stop after SIGTERM before SIGKILL.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub kill_grace: Duration,

    /// The command to run while holding the lock.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

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
async fn connect(args: &ConnectArgs) -> Result<Client, ClientError> {
    let options = args.options().map_err(ClientError::Settings)?;
    Client::connect_with(&args.addr, &options).await
}

/// Why a sidecar that answers is not serving.
const NOT_SERVING: &str = "not serving: the sidecar cannot reach its lock store";

/// Runs `lockside healthcheck`: 0 when the sidecar reports SERVING (with `--live`:
/// when it answers at all), 1 otherwise. Says which on stdout (success) or stderr, in
/// words a probe's event log shows as they are.
pub async fn healthcheck(args: HealthcheckArgs) -> u8 {
    let serving = match connect(&args.connect).await {
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

/// Runs `lockside hold`; returns the exit status.
pub async fn hold(args: HoldArgs) -> u8 {
    let fail = |status: u8, e: &dyn std::fmt::Display| {
        eprintln!("lockside hold: {e}");
        status
    };
    // Installed first: a SIGTERM between the grant and the command's start must reach
    // the command, not end `hold` with the lock taken. While waiting for the lock, a
    // signal ends `hold` as it would have ended it without handlers.
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return fail(EXIT_UNAVAILABLE, &"cannot install signal handlers");
    };
    let client = match connect(&args.connect).await {
        Ok(client) => client,
        Err(e) => return fail(EXIT_UNAVAILABLE, &e),
    };
    let options = LockOptions {
        wait: Some(args.wait.unwrap_or(crate::engine::MAX_WAIT)),
        ttl: args.ttl,
        shared: matches!(args.mode, ModeArg::Shared),
        limit: args.limit,
        fair: args.fair,
    };
    let locked = tokio::select! {
        locked = client.lock_with(&args.key, options) => locked,
        // 128 + the signal's number, as a shell reports a process it ended.
        _ = term.recv() => return 128 + 15,
        _ = int.recv() => return 128 + 2,
    };
    let lock = match locked {
        Ok(lock) => lock,
        Err(e @ ClientError::NotAcquired(_)) => return fail(EXIT_NOT_ACQUIRED, &e),
        Err(e) => return fail(EXIT_UNAVAILABLE, &e),
    };
    let (program, rest) = match args.command.split_first() {
        Some(split) => split,
        None => return fail(EXIT_NO_COMMAND, &"no command given"),
    };
    let mut child = match Command::new(program)
        .args(rest)
        .env("LOCKSIDE_FENCING_TOKEN", lock.fencing_token().to_string())
        .env("LOCKSIDE_KEY", &args.key)
        .spawn()
    {
        Ok(child) => child,
        Err(e) => return fail(EXIT_NO_COMMAND, &format!("cannot start {program}: {e}")),
    };
    loop {
        tokio::select! {
            status = child.wait() => {
                let code = match status {
                    Ok(status) => exit_code(status),
                    Err(e) => fail(EXIT_NO_COMMAND, &format!("waiting for {program}: {e}")),
                };
                if let Err(e) = lock.release().await {
                    eprintln!("lockside hold: releasing {}: {e}", args.key);
                }
                return code;
            }
            _ = term.recv() => send(&child, Signal::TERM),
            _ = int.recv() => send(&child, Signal::INT),
            _ = lock.lost() => {
                let why = lock
                    .lost_reason()
                    .unwrap_or_else(|| "the stream to the sidecar ended".into());
                eprintln!(
                    "lockside hold: lost the lock on {} ({why}); stopping the command: \
                     SIGTERM, then SIGKILL after {}",
                    args.key,
                    crate::config::format_duration(args.kill_grace)
                );
                stop(&mut child, args.kill_grace).await;
                return EXIT_LOST;
            }
        }
    }
}

/// SIGTERM, then SIGKILL after `grace`; waits for the child to go.
async fn stop(child: &mut Child, grace: Duration) {
    send(child, Signal::TERM);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        let _ = child.kill().await;
    }
}

fn send(child: &Child, signal: Signal) {
    let pid = child.id().and_then(|id| Pid::from_raw(id as i32));
    if let Some(pid) = pid {
        // The child may have exited meanwhile: nothing to do then.
        let _ = kill_process(pid, signal);
    }
}

/// CMD's status as a shell reports it: its code, or 128 + the signal that ended it.
fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => 128u8.saturating_add(signal as u8),
        (None, None) => 1,
    }
}

/// Runs `lockside describe`: prints the key's state, holders and queue in words;
/// returns the exit status.
///
/// ```text
/// key: jobs/nightly
/// state: held exclusive
/// holder: session 3f2a9c0d11223344 (report-job), 1 hold, expires in 9.9s unless renewed
/// waiting: 1
/// queued 1: session 0011223344556677 (unnamed), wants it exclusive
/// last fencing token: 1815218112235520
/// ```
pub async fn describe(args: DescribeArgs) -> u8 {
    let state = match connect(&args.connect).await {
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
        let _ = writeln!(
            text,
            "holder: session {} ({}), {holds}, expires in {} unless renewed",
            h.session_id,
            name(&h.client_name),
            crate::config::format_duration(ttl)
        );
    }
    let _ = writeln!(text, "waiting: {}", state.waiters);
    for q in &state.queue {
        let _ = writeln!(
            text,
            "queued {}: session {} ({}), wants it {}",
            q.position,
            q.session_id,
            name(&q.client_name),
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
fn name(client_name: &str) -> &str {
    if client_name.is_empty() {
        "unnamed"
    } else {
        client_name
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
            }],
        };
        assert_eq!(
            describe_text(&shared),
            "key: reports\n\
             state: held shared by 2 sessions\n\
             holder: session a1 (reader), 2 holds, expires in 4.5s unless renewed\n\
             holder: session b2 (unnamed), 2 holds, expires in 4.5s unless renewed\n\
             waiting: 1\n\
             queued 1: session c3 (writer), wants it exclusive\n\
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
