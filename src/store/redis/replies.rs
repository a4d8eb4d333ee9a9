//! What the scripts answer, read into the store's types. A reply that does not have the
//! expected shape is a `StoreError::Protocol`, never a panic.

use std::time::Duration;

use deadpool_redis::redis::Value;

use crate::store::{Acquired, HolderState, KeyState, QueuedState, Sharing, StoreError};

pub(super) fn ms(d: Duration) -> String {
    d.as_millis().to_string()
}

pub(super) fn int(v: &Value) -> Result<i64, StoreError> {
    match v {
        Value::Int(n) => Ok(*n),
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| StoreError::Protocol("expected a number".into())),
        other => Err(StoreError::Protocol(format!(
            "expected a number, got {other:?}"
        ))),
    }
}

pub(super) fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(n) => n.to_string(),
        _ => String::new(),
    }
}

/// A holder's or waiter's client name and holder, kept as one string
/// ([`crate::store::Claim::shown_name`]).
fn shown_name(v: &Value) -> (String, String) {
    let shown = text(v);
    let (client_name, holder) = crate::store::names::split(&shown);
    (client_name.to_owned(), holder.to_owned())
}

pub(super) fn sharing(letter: &str) -> Option<Sharing> {
    match letter {
        "x" => Some(Sharing::Exclusive),
        "s" => Some(Sharing::Shared),
        _ => None,
    }
}

pub(super) fn held_count(n: i64) -> Option<u32> {
    u32::try_from(n).ok()
}

/// An acquire's answer, and whether the session's record lists the grant now: the
/// token granted, negated when the script listed it (`lua/acquire.lua`).
pub(super) fn acquired_listed(reply: &Value) -> Result<(Acquired, bool), StoreError> {
    match reply {
        Value::Int(fence) if *fence < 0 => Ok((
            Acquired::Granted {
                fence: fence.unsigned_abs(),
            },
            true,
        )),
        reply => Ok((acquired(reply)?, false)),
    }
}

/// An acquire's answer: the token (a positive integer) granted, `{2, limit}` conflict,
/// `{0, look, position}` busy. A grant answers a bare integer: converting a Lua table to
/// a reply costs Redis more than a microsecond, the most common answer need not.
pub(super) fn acquired(reply: &Value) -> Result<Acquired, StoreError> {
    let bad = || StoreError::Protocol("acquire: bad reply".into());
    let reply = match reply {
        Value::Int(fence) if *fence > 0 => {
            return Ok(Acquired::Granted {
                fence: *fence as u64,
            });
        }
        Value::Array(reply) => reply,
        _ => return Err(bad()),
    };
    match reply.as_slice() {
        [code, limit] if int(code)? == 2 => Ok(Acquired::Conflict {
            limit: int(limit)?.max(0) as u32,
        }),
        [_, look, position, ticket] => Ok(Acquired::Busy {
            expires_in: Duration::from_millis(int(look)?.max(0) as u64),
            position: int(position)?.max(0) as u32,
            ticket: int(ticket)?.max(0) as u64,
        }),
        // A lock of the previous data model, or the server's hold-off: no ticket.
        [_, look, position] => Ok(Acquired::Busy {
            expires_in: Duration::from_millis(int(look)?.max(0) as u64),
            position: int(position)?.max(0) as u32,
            ticket: 0,
        }),
        _ => Err(bad()),
    }
}

/// Fields per holder in `describe.lua`'s answer.
const HOLDER_FIELDS: usize = 6;

/// `describe.lua`'s answer (see the script for its shape).
pub(super) fn key_state(reply: &[Value]) -> Result<KeyState, StoreError> {
    let bad = || StoreError::Protocol("describe: bad reply".into());
    let [fence, waiters, mode, limit, count, rest @ ..] = reply else {
        return Err(bad());
    };
    let count = usize::try_from(int(count)?).map_err(|_| bad())?;
    if rest.len() < count * HOLDER_FIELDS {
        return Err(bad());
    }
    let (holders, queue) = rest.split_at(count * HOLDER_FIELDS);
    let holders = holders
        .chunks_exact(HOLDER_FIELDS)
        .map(|h| {
            let (client_name, holder) = shown_name(&h[1]);
            Ok(HolderState {
                session_id: text(&h[0]),
                client_name,
                holder,
                hold_count: int(&h[2])?.max(0) as u32,
                ttl_remaining: Duration::from_millis(int(&h[3])?.max(0) as u64),
                fence: int(&h[4])? as u64,
                value: bytes(&h[5]),
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    let queue = queue
        .chunks_exact(3)
        .map(|w| {
            let (client_name, holder) = shown_name(&w[2]);
            QueuedState {
                sharing: sharing(&text(&w[0])).unwrap_or(Sharing::Exclusive),
                session_id: text(&w[1]),
                client_name,
                holder,
            }
        })
        .collect();
    Ok(KeyState {
        holders,
        sharing: sharing(&text(mode)),
        limit: int(limit)?.max(0) as u32,
        waiters: int(waiters)?.max(0) as u32,
        queue,
        fence: int(fence)? as u64,
    })
}

pub(super) fn bytes(v: &Value) -> Vec<u8> {
    match v {
        Value::BulkString(b) => b.clone(),
        Value::SimpleString(s) => s.clone().into_bytes(),
        _ => Vec::new(),
    }
}
