//! `lockside hold KEY [--key KEY]... -- CMD`: the sidecar from a shell, like `etcdctl
//! lock NAME -- CMD`.
//!
//! `hold` takes a lock through the sidecar at `LOCKSIDE_ADDR`, runs CMD (in a process
//! group of its own) with `LOCKSIDE_FENCING_TOKEN` and `LOCKSIDE_KEY` in its
//! environment, forwards SIGINT and SIGTERM to it, releases the lock when CMD exits and
//! exits with CMD's status. With `--key`, it takes several keys at once, all or none
//! (`Client::lock_all`), and CMD finds each key and its token numbered
//! ([`lock_env`]); CMD is stopped while any of them is suspended and ended when any
//! is lost. The moment the stream to the sidecar breaks, the lock is
//! suspended and CMD's process group is stopped (SIGSTOP): a live sidecar may already
//! have let a waiter in. It goes on (SIGCONT) once the session is resumed with the
//! lock. If the lock is lost (a `Lost` event, or a break the session did not come back
//! from with it), CMD gets SIGCONT and SIGTERM, then SIGKILL after `--kill-grace`, and
//! `hold` exits with [`EXIT_LOST`].

use std::future::Future;
use std::process::ExitStatus;
use std::time::Duration;

use clap::{Args, ValueEnum};
use rustix::process::{Pid, Signal, kill_process_group};
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};
use tokio_stream::StreamExt;
use tokio_stream::{StreamMap, wrappers::WatchStream};

use super::connect::ConnectArgs;
use crate::client::{Client, ClientError, LockGuard, LockOptions, LockState};
use crate::parse::parse_duration;
use crate::proto::limits::MAX_WAIT;

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

/// What `hold` and `elect` share: the command run while the lock is held, and how it
/// is stopped when the lock is lost.
#[derive(Debug, Args)]
pub struct CommandArgs {
    /// After the lock is lost, how long CMD has to stop after SIGTERM before SIGKILL.
    #[arg(long, default_value = "10s", value_parser = parse_duration, allow_hyphen_values = true)]
    pub kill_grace: Duration,

    /// The command to run while holding the lock, after `--` (or after the key, when
    /// it takes no flag of its own).
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub command: Vec<String>,
}

/// The exit statuses of `hold` and `elect`, for their `--help`.
pub const EXIT_STATUSES: &str = "\
Exit statuses:
  CMD's own      CMD ran and exited (128 + N if signal N ended it); the lock was then released
  75             the lock was not acquired within --wait
  77             the lock was lost while CMD ran: CMD got SIGTERM, then SIGKILL after --kill-grace
                 (while the stream to the sidecar is broken, CMD is stopped with SIGSTOP, and
                 goes on with SIGCONT if the session comes back with the lock)
  69             the sidecar could not be reached or refused the request
  127            CMD could not be started
  64             bad flags";

/// Flags of `lockside hold`.
#[derive(Debug, Args)]
pub struct HoldArgs {
    /// The lock's name.
    pub key: String,

    /// Another key to take with KEY, all or none (repeat it for more: 2 to 64 keys in
    /// all, in any order without deadlock). CMD then finds LOCKSIDE_KEY_COUNT, and
    /// LOCKSIDE_KEY_<n> and LOCKSIDE_FENCING_TOKEN_<n> for n = 1 (KEY) to the count, in
    /// the order given, instead of LOCKSIDE_KEY and LOCKSIDE_FENCING_TOKEN.
    #[arg(long = "key", value_name = "KEY")]
    pub more_keys: Vec<String>,

    /// The sidecar, its token and TLS.
    #[command(flatten)]
    pub connect: ConnectArgs,

    /// How long to wait for the lock (default: as long as the sidecar allows, 24 h).
    #[arg(long, value_parser = parse_duration, allow_hyphen_values = true)]
    pub wait: Option<Duration>,

    /// The lock's TTL (default: the sidecar's).
    #[arg(long, value_parser = parse_duration, allow_hyphen_values = true)]
    pub ttl: Option<Duration>,

    /// Exclusive or shared.
    #[arg(long, value_enum, default_value = "exclusive")]
    pub mode: ModeArg,

    /// N > 1: take one permit of a semaphore of N (one key only).
    #[arg(long, default_value_t = 0)]
    pub limit: u32,

    /// Wait in arrival order.
    #[arg(long)]
    pub fair: bool,

    /// The command, and how it is stopped.
    #[command(flatten)]
    pub run: CommandArgs,
}

/// Runs `lockside hold`; returns the exit status.
pub async fn hold(args: HoldArgs) -> u8 {
    let options = LockOptions {
        wait: Some(args.wait.unwrap_or(MAX_WAIT)),
        ttl: args.ttl,
        shared: matches!(args.mode, ModeArg::Shared),
        limit: args.limit,
        fair: args.fair,
        ..LockOptions::default()
    };
    let mut keys = vec![args.key.clone()];
    keys.extend(args.more_keys.iter().cloned());
    if keys.len() > 1 && args.limit > 1 {
        eprintln!("lockside hold: --limit is for one key: a semaphore cannot be taken with --key");
        return super::EX_USAGE;
    }
    let asked = keys.clone();
    let take = |client: Client| async move {
        if asked.len() == 1 {
            Ok(vec![client.lock_with(&asked[0], options).await?])
        } else {
            Ok(client.lock_all_with(&asked, options).await?.into_locks())
        }
    };
    run_holding("hold", &args.connect, &keys, &args.run, take).await
}

/// What CMD finds in its environment for the locks it runs under: one key as
/// `LOCKSIDE_KEY` and `LOCKSIDE_FENCING_TOKEN`; several as `LOCKSIDE_KEY_COUNT` and
/// `LOCKSIDE_KEY_<n>`, `LOCKSIDE_FENCING_TOKEN_<n>` for n = 1.. in the order asked.
pub(super) fn lock_env(locks: &[LockGuard]) -> Vec<(String, String)> {
    match locks {
        [lock] => vec![
            (
                "LOCKSIDE_FENCING_TOKEN".into(),
                lock.fencing_token().to_string(),
            ),
            ("LOCKSIDE_KEY".into(), lock.key().to_owned()),
        ],
        locks => {
            let mut env = vec![("LOCKSIDE_KEY_COUNT".into(), locks.len().to_string())];
            for (n, lock) in locks.iter().enumerate() {
                let n = n + 1;
                env.push((format!("LOCKSIDE_KEY_{n}"), lock.key().to_owned()));
                env.push((
                    format!("LOCKSIDE_FENCING_TOKEN_{n}"),
                    lock.fencing_token().to_string(),
                ));
            }
            env
        }
    }
}

/// Where the locks stand together: lost if one is (with its key and why), suspended
/// if one is, else held.
fn together(locks: &[LockGuard]) -> (LockState, String) {
    let mut suspended = None;
    for lock in locks {
        match lock.state() {
            LockState::Lost(why) => return (LockState::Lost(why), lock.key().to_owned()),
            LockState::Suspended => {
                suspended.get_or_insert_with(|| lock.key().to_owned());
            }
            LockState::Held => {}
        }
    }
    match suspended {
        Some(key) => (LockState::Suspended, key),
        None => (LockState::Held, names(locks)),
    }
}

/// The keys of `locks`, for a message.
fn names(locks: &[LockGuard]) -> String {
    let keys: Vec<&str> = locks.iter().map(LockGuard::key).collect();
    keys.join(", ")
}

/// Takes the locks with `take`, runs the command while holding them, releases them
/// when the command exits, and returns the exit status (see the module's docs): `hold`
/// and `elect` differ only in how they take the locks. With several locks, the
/// command is stopped while any is suspended and ended when any is lost.
pub(super) async fn run_holding<F, Fut>(
    verb: &str,
    connect: &ConnectArgs,
    keys: &[String],
    run: &CommandArgs,
    take: F,
) -> u8
where
    F: FnOnce(Client) -> Fut,
    Fut: Future<Output = Result<Vec<LockGuard>, ClientError>>,
{
    let fail = |status: u8, e: &dyn std::fmt::Display| {
        eprintln!("lockside {verb}: {e}");
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
    let client = match connect.client().await {
        Ok(client) => client,
        Err(e) => return fail(EXIT_UNAVAILABLE, &e),
    };
    let locked = tokio::select! {
        locked = take(client.clone()) => locked,
        // 128 + the signal's number, as a shell reports a process it ended.
        _ = term.recv() => return 128 + 15,
        _ = int.recv() => return 128 + 2,
    };
    let locks = match locked {
        Ok(locks) => locks,
        Err(e @ ClientError::NotAcquired(_)) => return fail(EXIT_NOT_ACQUIRED, &e),
        Err(e) => return fail(EXIT_UNAVAILABLE, &e),
    };
    let key = keys.join(", ");
    let (program, rest) = match run.command.split_first() {
        Some(split) => split,
        None => return fail(EXIT_NO_COMMAND, &"no command given"),
    };
    let mut child = match Command::new(program)
        .args(rest)
        .envs(lock_env(&locks))
        // A group of its own: stopping CMD stops whatever it started too.
        .process_group(0)
        .spawn()
    {
        Ok(child) => child,
        Err(e) => return fail(EXIT_NO_COMMAND, &format!("cannot start {program}: {e}")),
    };
    let mut changes: StreamMap<usize, WatchStream<LockState>> = locks
        .iter()
        .enumerate()
        .map(|(n, lock)| (n, WatchStream::from_changes(lock.states())))
        .collect();
    let mut was = LockState::Held;
    loop {
        tokio::select! {
            status = child.wait() => {
                let code = match status {
                    Ok(status) => exit_code(status),
                    Err(e) => fail(EXIT_NO_COMMAND, &format!("waiting for {program}: {e}")),
                };
                for lock in locks {
                    let name = lock.key().to_owned();
                    if let Err(e) = lock.release().await {
                        eprintln!("lockside {verb}: releasing {name}: {e}");
                    }
                }
                // The releases are on their way: ending the session waits for the
                // sidecar to have let everything go before `hold` exits.
                client.close().await;
                return code;
            }
            _ = term.recv() => send(&child, Signal::TERM),
            _ = int.recv() => send(&child, Signal::INT),
            changed = changes.next() => {
                // The reader gone without a verdict is a lost lock too.
                let (state, which) = match changed {
                    Some(_) => together(&locks),
                    None => (LockState::Lost("the stream to the sidecar ended".into()), key.clone()),
                };
                if state == was {
                    continue;
                }
                was = state.clone();
                match state {
                    LockState::Suspended => {
                        eprintln!(
                            "lockside {verb}: the stream to the sidecar broke; the command is \
                             stopped (SIGSTOP) until the session is resumed with {which}"
                        );
                        send(&child, Signal::STOP);
                    }
                    LockState::Held => {
                        eprintln!("lockside {verb}: resumed with {which}; the command goes on");
                        send(&child, Signal::CONT);
                    }
                    LockState::Lost(why) => {
                        eprintln!(
                            "lockside {verb}: lost the lock on {which} ({why}); stopping the \
                             command: SIGTERM, then SIGKILL after {}",
                            crate::parse::format_duration(run.kill_grace)
                        );
                        send(&child, Signal::CONT);
                        stop(&mut child, run.kill_grace).await;
                        // With several keys the others may still be held: let them go
                        // before exiting (one lock lost needs no wait).
                        if locks.len() > 1 {
                            for lock in locks {
                                let _ = lock.release().await;
                            }
                            client.close().await;
                        }
                        return EXIT_LOST;
                    }
                }
            }
        }
    }
}

/// SIGTERM, then SIGKILL after `grace` (to the whole group); waits for the child to go.
async fn stop(child: &mut Child, grace: Duration) {
    send(child, Signal::TERM);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        send(child, Signal::KILL);
        let _ = child.kill().await;
    }
}

/// Sends `signal` to CMD's process group (CMD leads it: its pid is the group's id).
fn send(child: &Child, signal: Signal) {
    let pid = child.id().and_then(|id| Pid::from_raw(id as i32));
    if let Some(pid) = pid {
        // The group may be gone meanwhile: nothing to do then.
        let _ = kill_process_group(pid, signal);
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
