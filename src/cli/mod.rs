//! The command line, in one corner: each subcommand owns its flags in its own file and
//! turns them into the typed configurations of the library layers, which never see a
//! flag. Every flag also reads `LOCKSIDE_<FLAG>` from the environment. Tests build the
//! configurations directly instead.
//!
//! - `serve.rs`: `lockside serve`, the sidecar.
//! - `hold.rs`: `lockside hold KEY [--key KEY]... -- CMD`, and running a command while
//!   locks are held.
//! - `elect.rs`: `lockside elect KEY -- CMD` (leader election, on `hold.rs`);
//!   `leader.rs`: `lockside leader KEY`; `watch.rs`: `lockside watch KEY`.
//! - `describe.rs`: `lockside describe KEY` and `lockside healthcheck`.
//! - `webhook.rs`: `lockside webhook`, the sidecar injector.
//! - `connect.rs`: how the client commands reach the sidecar; `files.rs`: tokens and
//!   certificates read from files.

mod connect;
mod describe;
mod elect;
mod files;
mod hold;
mod leader;
mod serve;
mod watch;
mod webhook;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub use connect::ConnectArgs;
pub use describe::{DescribeArgs, HealthcheckArgs};
pub use elect::ElectArgs;
pub use hold::{
    CommandArgs, EXIT_LOST, EXIT_NO_COMMAND, EXIT_NOT_ACQUIRED, EXIT_UNAVAILABLE, HoldArgs,
};
pub use leader::{EXIT_NO_LEADER, LeaderArgs};
pub use serve::ServeArgs;
pub use watch::WatchArgs;
pub use webhook::WebhookArgs;

use crate::telemetry::LogFormat;

/// Bad flags (sysexits EX_USAGE), like other sidecars, so an orchestrator can tell
/// them from crashes.
pub const EX_USAGE: u8 = 64;

/// Lockside: distributed locks held by a live gRPC stream.
#[derive(Debug, Parser)]
#[command(name = "lockside", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: CliCommand,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum CliCommand {
    /// Run the sidecar.
    Serve(Box<ServeArgs>),
    /// Run a command while holding a lock, like `etcdctl lock`.
    #[command(after_help = hold::EXIT_STATUSES)]
    Hold(HoldArgs),
    /// Run a command while leading an election: campaign in turn, run CMD as leader,
    /// like `hold`.
    #[command(after_help = hold::EXIT_STATUSES)]
    Elect(ElectArgs),
    /// Print the value of an election's leader (exit 3 when nobody leads).
    Leader(LeaderArgs),
    /// Print a key's state now and at every change, until interrupted.
    Watch(WatchArgs),
    /// Print a lock's holders and queue.
    Describe(DescribeArgs),
    /// Exit 0 when the sidecar serves (its store answers), 1 otherwise: for exec probes.
    Healthcheck(HealthcheckArgs),
    /// Run the Kubernetes admission webhook that injects the sidecar into pods.
    Webhook(WebhookArgs),
}

impl Cli {
    /// Threads the runtime should have: the sidecar's `--worker-threads`; one for the
    /// client commands and the injector (it answers a few reviews a minute).
    pub fn worker_threads(&self) -> usize {
        match &self.command {
            CliCommand::Serve(args) => usize::from(args.worker_threads),
            _ => 1,
        }
    }

    /// Runs the subcommand inside a runtime; returns the process's exit status.
    pub async fn run(self) -> ExitCode {
        let (format, traces) = match &self.command {
            CliCommand::Serve(args) => (args.log_format, args.trace_config()),
            CliCommand::Webhook(args) => (args.log_format, None),
            _ => (LogFormat::Text, None),
        };
        let telemetry = match crate::telemetry::init(format, traces.as_ref()) {
            Ok(telemetry) => telemetry,
            Err(e) => {
                eprintln!("lockside: {e}");
                return ExitCode::from(EX_USAGE);
            }
        };
        let code = match self.command {
            CliCommand::Serve(args) => serve::serve(*args).await,
            CliCommand::Hold(args) => ExitCode::from(hold::hold(args).await),
            CliCommand::Elect(args) => ExitCode::from(elect::elect(args).await),
            CliCommand::Leader(args) => ExitCode::from(leader::leader(args).await),
            CliCommand::Watch(args) => ExitCode::from(watch::watch(args).await),
            CliCommand::Describe(args) => ExitCode::from(describe::describe(args).await),
            CliCommand::Healthcheck(args) => ExitCode::from(describe::healthcheck(args).await),
            CliCommand::Webhook(args) => webhook::webhook(args).await,
        };
        telemetry.shutdown().await;
        code
    }
}

/// Completes on SIGTERM or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; only SIGKILL stops this process");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM"),
        _ = int.recv() => tracing::info!("SIGINT"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_certificates_reach_the_redis_options() {
        let cli = Cli::try_parse_from([
            "lockside",
            "serve",
            "--store",
            "rediss://h:1",
            "--store-ca-file",
            "/etc/ca.pem",
            "--store-client-cert",
            "/c.pem",
            "--store-client-key",
            "/c.key",
        ])
        .expect("flags parse");
        let CliCommand::Serve(args) = cli.command else {
            panic!("serve");
        };
        let options = args.redis_options();
        assert_eq!(options.ca_file, Some("/etc/ca.pem".into()));
        assert_eq!(options.client_key, Some("/c.key".into()));
        let half = ["lockside", "serve", "--store-client-cert", "/c.pem"];
        assert!(Cli::try_parse_from(half).is_err(), "a cert needs its key");
    }

    #[test]
    fn replica_acknowledgement_is_checked_against_the_store() {
        let store = |extra: &[&str]| {
            let mut args = vec!["lockside", "serve"];
            args.extend_from_slice(extra);
            let CliCommand::Serve(args) = Cli::try_parse_from(args).expect("parse").command else {
                panic!("serve");
            };
            args.store().map(drop)
        };
        assert!(
            store(&["--min-replica-acks", "1"]).is_err(),
            "memory has no replicas"
        );
        let slow = ["--store", "redis://h:1", "--min-replica-acks", "1"];
        let slow: Vec<&str> = slow
            .iter()
            .copied()
            .chain(["--replica-ack-timeout", "2s"])
            .collect();
        let error = store(&slow).expect_err("slower than the store timeout");
        assert!(error.contains("--replica-ack-timeout"), "{error}");
    }
}
