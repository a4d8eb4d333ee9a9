//! `lockside watch KEY [--json]`: one line per state of a key, from its state now to
//! every change (a grant, a release, an expiry, a holder's value), until interrupted.

use std::io::Write;
use std::time::Duration;

use base64::Engine as _;
use clap::Args;
use tokio::signal::unix::{SignalKind, signal};
use tokio_stream::StreamExt;

use super::connect::ConnectArgs;
use super::hold::EXIT_UNAVAILABLE;
use crate::proto::{DescribeResponse, LockMode};

/// Flags of `lockside watch`.
#[derive(Debug, Args)]
pub struct WatchArgs {
    /// The key to watch.
    pub key: String,

    /// The sidecar, its token and TLS.
    #[command(flatten)]
    pub connect: ConnectArgs,

    /// One JSON object per line (as `Describe` answers; a holder's value is `value`
    /// when it is UTF-8 text, else `value_base64`).
    #[arg(long)]
    pub json: bool,
}

/// Runs `lockside watch`: prints each state until SIGINT or SIGTERM, or until stdout
/// is closed (exit 0); 69 when the sidecar cannot be reached, refuses the watch or
/// ends it.
pub async fn watch(args: WatchArgs) -> u8 {
    let fail = |e: &dyn std::fmt::Display| {
        eprintln!("lockside watch: {e}");
        EXIT_UNAVAILABLE
    };
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return fail(&"cannot install signal handlers");
    };
    let states = match args.connect.client().await {
        Ok(client) => client.watch(&args.key).await,
        Err(e) => Err(e),
    };
    let mut states = match states {
        Ok(states) => states,
        Err(e) => return fail(&e),
    };
    loop {
        tokio::select! {
            state = states.next() => match state {
                Some(Ok(state)) => {
                    let line = if args.json { json_line(&state) } else { text_line(&state) };
                    // Whoever read the lines is gone (`lockside watch K | head -1`):
                    // done, as a pipeline expects.
                    if writeln!(std::io::stdout(), "{line}").is_err() {
                        return 0;
                    }
                }
                Some(Err(e)) => return fail(&e),
                None => return fail(&"the sidecar ended the watch"),
            },
            _ = term.recv() => return 0,
            _ = int.recv() => return 0,
        }
    }
}

fn mode_name(mode: i32) -> &'static str {
    match LockMode::try_from(mode) {
        Ok(LockMode::Shared) => "shared",
        _ => "exclusive",
    }
}

/// A state in words, on one line:
///
/// ```text
/// held exclusive: session 3f2a9c0d11223344 (web-1) token 1815218112235520 value "10.0.0.7:8080"; 2 waiting
/// free; last token 1815218112235520
/// ```
pub fn text_line(state: &DescribeResponse) -> String {
    let mut line = if state.holders.is_empty() {
        match state.fencing_token {
            0 => "free".to_owned(),
            token => format!("free; last token {token}"),
        }
    } else {
        let kind = match state.limit {
            limit if limit > 1 => format!("{} of {limit} permits", state.holders.len()),
            _ => format!("held {}", mode_name(state.mode)),
        };
        let holders: Vec<String> = state
            .holders
            .iter()
            .map(|h| {
                let name = super::describe::who(&h.client_name, &h.holder);
                let mut holder = format!(
                    "session {} ({name}) token {}",
                    h.session_id, h.fencing_token
                );
                if h.hold_count > 1 {
                    holder.push_str(&format!(" x{}", h.hold_count));
                }
                if !h.value.is_empty() {
                    holder.push_str(&format!(" value {:?}", String::from_utf8_lossy(&h.value)));
                }
                holder
            })
            .collect();
        format!("{kind}: {}", holders.join(", "))
    };
    if state.waiters > 0 {
        line.push_str(&format!("; {} waiting", state.waiters));
    }
    line
}

/// A state as one JSON object (tokens are numbers: they stay below 2^53).
pub fn json_line(state: &DescribeResponse) -> String {
    let holders: Vec<serde_json::Value> = state
        .holders
        .iter()
        .map(|h| {
            let ttl = h
                .ttl_remaining
                .and_then(|d| Duration::try_from(d).ok())
                .unwrap_or_default();
            let mut holder = serde_json::json!({
                "session_id": h.session_id,
                "client_name": h.client_name,
                "holder": h.holder,
                "hold_count": h.hold_count,
                "ttl_remaining_ms": ttl.as_millis() as u64,
                "fencing_token": h.fencing_token,
            });
            match std::str::from_utf8(&h.value) {
                Ok(text) => holder["value"] = text.into(),
                Err(_) => {
                    holder["value_base64"] = base64::engine::general_purpose::STANDARD
                        .encode(&h.value)
                        .into()
                }
            }
            holder
        })
        .collect();
    let queue: Vec<serde_json::Value> = state
        .queue
        .iter()
        .map(|q| {
            serde_json::json!({
                "session_id": q.session_id,
                "client_name": q.client_name,
                "holder": q.holder,
                "mode": mode_name(q.mode),
                "position": q.position,
            })
        })
        .collect();
    let mode = match state.holders.is_empty() {
        true => serde_json::Value::Null,
        false => mode_name(state.mode).into(),
    };
    serde_json::json!({
        "key": state.key,
        "mode": mode,
        "limit": state.limit,
        "holders": holders,
        "waiters": state.waiters,
        "queue": queue,
        "fencing_token": state.fencing_token,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::Holder;

    fn leader(value: &[u8]) -> DescribeResponse {
        DescribeResponse {
            key: "jobs".into(),
            mode: LockMode::Exclusive as i32,
            limit: 1,
            holders: vec![Holder {
                session_id: "a1".into(),
                hold_count: 1,
                ttl_remaining: Some(prost_types::Duration {
                    seconds: 9,
                    nanos: 500_000_000,
                }),
                client_name: "web-1".into(),
                value: value.to_vec(),
                fencing_token: 42,
                holder: String::new(),
            }],
            waiters: 2,
            fencing_token: 42,
            queue: vec![],
        }
    }

    #[test]
    fn states_read_as_one_line_of_words() {
        assert_eq!(
            text_line(&leader(b"10.0.0.7:8080")),
            "held exclusive: session a1 (web-1) token 42 value \"10.0.0.7:8080\"; 2 waiting"
        );
        let free = DescribeResponse {
            holders: vec![],
            waiters: 0,
            ..leader(b"")
        };
        assert_eq!(text_line(&free), "free; last token 42");
        assert_eq!(
            text_line(&DescribeResponse::default()),
            "free",
            "a key never held"
        );
    }

    #[test]
    fn json_lines_carry_text_values_as_text_and_others_in_base64() {
        let text: serde_json::Value =
            serde_json::from_str(&json_line(&leader(b"web-1"))).expect("json");
        assert_eq!(text["holders"][0]["value"], "web-1");
        assert_eq!(text["holders"][0]["fencing_token"], 42);
        assert_eq!(text["holders"][0]["ttl_remaining_ms"], 9500);
        assert_eq!(text["mode"], "exclusive");
        let bytes: serde_json::Value =
            serde_json::from_str(&json_line(&leader(&[0xff, 0]))).expect("json");
        assert_eq!(bytes["holders"][0]["value_base64"], "/wA=");
        assert!(bytes["holders"][0].get("value").is_none());
    }
}
