//! Session records as Redis holds them (`src/store/lua/record.lua`): the record hash
//! `{ns:session/SID}:s`, with its lines either inline (`k:KEY` fields) or, past a few
//! dozen, in bucket hashes `{ns:session/SID}:s:N`. Read with `redis-cli` on whichever
//! node serves the record's slot: `cli` runs one command there.

use std::collections::BTreeMap;

/// Counts a record's lines wherever they are (`KEYS[1]` the record).
const LINES: &str = "local n, b = 0, 0 \
    local all = redis.call('HGETALL', KEYS[1]) \
    for i = 1, #all, 2 do \
      if string.sub(all[i], 1, 2) == 'k:' then n = n + 1 \
      elseif all[i] == 'b' then b = tonumber(all[i + 1]) end \
    end \
    for j = 0, b - 1 do n = n + redis.call('HLEN', KEYS[1] .. ':' .. j) end \
    return n";

/// The record's time left and the shortest of its buckets' (ms; -1 none, -2 gone),
/// read at one instant.
const EXPIRIES: &str = "local r = KEYS[1] \
    local b = tonumber(redis.call('HGET', r, 'b')) or 0 \
    local least = nil \
    for j = 0, b - 1 do \
      local p = redis.call('PTTL', r .. ':' .. j) \
      if p ~= -2 and (least == nil or p < least) then least = p end \
    end \
    return {redis.call('PTTL', r), least or -2}";

/// Rewrites a record as a sidecar before the buckets wrote it: one hash, every line a
/// `k:KEY` field, no 'b', 'n' or 'e'; keeps its TTL.
const FOLD: &str = "local r = KEYS[1] \
    local ttl = redis.call('PTTL', r) \
    local b = tonumber(redis.call('HGET', r, 'b')) or 0 \
    for j = 0, b - 1 do \
      local all = redis.call('HGETALL', r .. ':' .. j) \
      for i = 1, #all, 2 do redis.call('HSET', r, 'k:' .. all[i], all[i + 1]) end \
      redis.call('DEL', r .. ':' .. j) \
    end \
    redis.call('HDEL', r, 'b', 'n', 'e') \
    redis.call('PEXPIRE', r, ttl) \
    return redis.call('HLEN', r)";

/// The record key of session `sid` in namespace `ns`.
pub fn record_key(ns: &str, sid: &str) -> String {
    format!("{{{ns}:session/{sid}}}:s")
}

/// How many locks the record lists (0 when there is none).
pub fn record_lines(cli: impl Fn(&[&str]) -> String, record: &str) -> usize {
    cli(&["eval", LINES, "1", record]).parse().unwrap_or(0)
}

/// Every key of the record (itself and its buckets): name → (fields, encoding).
pub fn record_keys(
    cli: impl Fn(&[&str]) -> String,
    record: &str,
) -> BTreeMap<String, (usize, String)> {
    let pattern = format!("{record}*");
    cli(&["--scan", "--pattern", &pattern])
        .lines()
        .filter(|k| !k.is_empty())
        .map(|k| {
            let fields = cli(&["hlen", k]).parse().unwrap_or(0);
            (k.to_owned(), (fields, cli(&["object", "encoding", k])))
        })
        .collect()
}

/// Rewrites the record in the layout of an older sidecar (see [`FOLD`]); returns its
/// fields.
pub fn fold_to_old_layout(cli: impl Fn(&[&str]) -> String, record: &str) -> usize {
    cli(&["eval", FOLD, "1", record]).parse().unwrap_or(0)
}

/// Locks of one session in [`many_locks_resume`]: past the record's inline lines (64)
/// and past the 128 fields a deployment may set `hash-max-listpack-entries` to.
pub const MANY: usize = 300;

/// A session of a sidecar of `store` holds [`MANY`] locks; its record must be kept in
/// hashes of at most 128 fields, each a listpack (the compact encoding). The sidecar is
/// killed; another resumes every lock with its fencing token. With `old_layout` the
/// record is first rewritten as an older sidecar kept it (one hash): a rolling restart
/// resumes those too, and the next write splits it. Releasing one lock rewrites the
/// record; once the resumed session ends, no key of its record is left.
/// `cli(key, args)` runs a redis-cli command on the node serving `key`.
pub async fn many_locks_resume(
    store: &str,
    ns: &str,
    cli: impl Fn(&str, &[&str]) -> String,
    old_layout: bool,
) {
    use super::{Client, PATIENCE, SidecarProcess, acquire, secs};
    use lockside::proto::{self, lease_response::Event};
    use tokio::time::{Duration, Instant};

    let args = ["--attachment-ttl", "600ms"];
    let mut doomed = SidecarProcess::start(store, ns, &args);
    let other = SidecarProcess::start(store, ns, &args);
    let on_doomed = Client::connect(&doomed.addr).await;
    let on_other = Client::connect(&other.addr).await;
    let mut app = on_doomed.lease().await;
    let mut fences = BTreeMap::new();
    for i in 0..MANY {
        let key = format!("many-{i}");
        let request = proto::Acquire {
            ttl: Some(secs(10.0)),
            ..acquire(&key)
        };
        let id = app.send_acquire(request).await;
        fences.insert(key, app.expect_granted(id).await.fencing_token);
    }
    let record = record_key(ns, &app.session_id);
    let on = |args: &[&str]| cli(&record, args);
    listing(&on, &record, MANY).await;
    small(&on, &record);
    if old_layout {
        assert_eq!(fold_to_old_layout(on, &record), 3 + MANY);
        assert_eq!(record_keys(on, &record).len(), 1, "one hash");
    }

    let token = app.resume_token.clone();
    doomed.kill();
    let deadline = Instant::now() + PATIENCE;
    let mut resumed = loop {
        match on_other.resume(&token).await {
            Ok(lease) => break lease,
            Err(status) if status.code() == tonic::Code::FailedPrecondition => {}
            Err(status) => panic!("resume: {status}"),
        }
        assert!(Instant::now() < deadline, "resumed in time");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(resumed.resumed_locks as usize, MANY);
    let mut back = BTreeMap::new();
    for _ in 0..MANY {
        match resumed.next().await {
            Event::Granted(g) => back.insert(g.key, g.fencing_token),
            other => panic!("expected Granted after a resume, got {other:?}"),
        };
    }
    assert_eq!(back, fences, "every lock back with its token");

    let id = resumed.send_release("many-0").await;
    resumed.expect_released(id).await;
    listing(&on, &record, MANY - 1).await;
    small(&on, &record);
    drop(resumed);
    // A resumed session's record leaves only its spent mark (no bucket, no line), which
    // expires by itself: no secret opens it, so a sidecar the session left cannot
    // write the record again.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let left = record_keys(on, &record);
        if left.len() == 1 && left.get(&record).is_some_and(|(fields, _)| *fields == 1) {
            break;
        }
        assert!(Instant::now() < deadline, "left behind: {left:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(on(&["HGET", &record, "t"]), "-", "the spent mark");
    let ttl: i64 = on(&["PTTL", &record]).parse().expect("a number");
    assert!(ttl > 0, "it expires: {ttl}");
    drop(other);
}

/// Waits until `record` lists `n` locks.
async fn listing(on: &impl Fn(&[&str]) -> String, record: &str, n: usize) {
    use tokio::time::{Duration, Instant};
    let deadline = Instant::now() + super::PATIENCE;
    loop {
        let listed = record_lines(on, record);
        if listed == n {
            return;
        }
        assert!(Instant::now() < deadline, "{record}: {listed} lines");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `record` is split, every key of it a listpack of at most 128 fields, and every
/// bucket expires, not before the record.
fn small(on: &impl Fn(&[&str]) -> String, record: &str) {
    let keys = record_keys(on, record);
    assert!(keys.len() > 1, "split: {keys:?}");
    for (key, (fields, encoding)) in &keys {
        assert!(
            *fields <= 128 && encoding == "listpack",
            "{key}: {fields} fields, {encoding}"
        );
    }
    let expiries = on(&["eval", EXPIRIES, "1", record]);
    let ms: Vec<i64> = expiries.lines().filter_map(|l| l.parse().ok()).collect();
    assert!(
        matches!(ms[..], [record, bucket] if record > 0 && bucket >= record),
        "the record and its shortest-lived bucket live {ms:?} ms"
    );
}
