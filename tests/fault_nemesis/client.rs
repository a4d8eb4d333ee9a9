//! The Rust client process of the workload: this test binary run as
//! `fault_nemesis client ARGS` (so `cargo test --test fault_nemesis` needs nothing else
//! built). Its workers contend for the round's keys through `lockside::client` (each
//! lock its own session, resumed when its stream breaks), write to the fenced register
//! while they hold, and print every event as a JSON line (`history.rs`). Stdin: `calm`
//! (no more long holds: the faults have healed), end of file (release and exit).
//!
//! `--wrong` makes the deliberately wrong client of `NEMESIS_SELF_CHECK`: it takes the
//! first key, holds it for long, and keeps writing after `Suspended` and `Lost`.

use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lockside::client::{Client, ClientError, LockOptions, LockState};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio_util::sync::CancellationToken;

use super::common::Rng;
use super::history::{Event, now_ns};
use super::plan::{KeySpec, WorkerArgs};

/// Prints events, one JSON line each, stamped when printed.
pub(super) struct Out {
    process: String,
    stdout: std::sync::Mutex<std::io::Stdout>,
}

impl Out {
    pub(super) fn emit(&self, worker: u32, mut e: Event) {
        e.t = now_ns();
        e.h = format!("{}.{worker}", self.process);
        let line = serde_json::to_string(&e).expect("an event is JSON");
        let mut out = self.stdout.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
}

/// One connection to the fenced register.
pub(super) struct Register {
    lines: tokio::io::Lines<BufReader<tokio::net::tcp::OwnedReadHalf>>,
    write: tokio::net::tcp::OwnedWriteHalf,
}

impl Register {
    async fn connect(addr: &str) -> Self {
        let socket = tokio::net::TcpStream::connect(addr)
            .await
            .expect("reach the register");
        let _ = socket.set_nodelay(true);
        let (read, write) = socket.into_split();
        Self {
            lines: BufReader::new(read).lines(),
            write,
        }
    }

    /// One write (fenced) or use (logged only); whether it was accepted.
    pub(super) async fn write(
        &mut self,
        fenced: bool,
        key: &str,
        token: u64,
        holder: &str,
    ) -> bool {
        let op = if fenced { "W" } else { "U" };
        let line = format!("{op} {key} {token} {holder} {}\n", now_ns());
        self.write
            .write_all(line.as_bytes())
            .await
            .expect("the register is up for the whole round");
        let answer = self.lines.next_line().await.expect("the register answers");
        answer.is_some_and(|a| a == "OK")
    }
}

/// Runs the client process until stdin ends.
pub async fn run(args: WorkerArgs) {
    let out = Arc::new(Out {
        process: args.id.clone(),
        stdout: std::sync::Mutex::new(std::io::stdout()),
    });
    let stop = CancellationToken::new();
    let calm = Arc::new(AtomicBool::new(false));
    let (c_stop, c_calm) = (stop.clone(), calm.clone());
    std::thread::spawn(move || control(c_stop, c_calm));
    out.emit(0, ev("start"));
    let workers: Vec<_> = (0..args.workers)
        .map(|w| {
            let (args, out, stop, calm) = (args.clone(), out.clone(), stop.clone(), calm.clone());
            tokio::spawn(async move { worker(w, args, out, stop, calm).await })
        })
        .collect();
    for w in workers {
        let _ = w.await;
    }
    out.emit(0, ev("exit"));
}

/// Reads stdin (on a thread of its own): `calm`, then the end of file.
fn control(stop: CancellationToken, calm: Arc<AtomicBool>) {
    use std::io::BufRead;
    for line in std::io::stdin().lock().lines().map_while(Result::ok) {
        if line.trim() == "calm" {
            calm.store(true, Ordering::Relaxed);
        }
    }
    stop.cancel();
}

pub(super) fn ev(name: &str) -> Event {
    Event {
        ev: name.to_owned(),
        ..Event::default()
    }
}

async fn worker(
    w: u32,
    args: WorkerArgs,
    out: Arc<Out>,
    stop: CancellationToken,
    calm: Arc<AtomicBool>,
) {
    let holder = format!("{}.{w}", args.id);
    let mut rng = Rng::new(args.seed.wrapping_mul(31).wrapping_add(u64::from(w) + 1));
    let mut register = Register::connect(&args.register).await;
    let client = loop {
        match Client::connect(&args.addr).await {
            Ok(c) => break c,
            Err(_) if !stop.is_cancelled() => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(_) => return,
        }
    };
    // The round's plain exclusive keys: one acquire in four takes them all at once
    // (`AcquireAll`; on a Cluster they are on different masters).
    let several: Vec<String> = (args.keys.iter())
        .filter(|k| k.kind == 'x')
        .map(|k| k.name.clone())
        .collect();
    let mut n = 0;
    while !stop.is_cancelled() {
        n += 1;
        if !args.wrong && several.len() >= 2 && rng.below(4) == 0 {
            let calm = calm.load(Ordering::Relaxed);
            let long = !calm && rng.below(5) == 0;
            let at = super::several::Worker {
                w,
                n,
                client: &client,
                out: out.clone(),
                register: &mut register,
                stop: &stop,
                holder: &holder,
            };
            at.hold_all(&several, &args, long, &mut rng).await;
            if !calm {
                tokio::time::sleep(Duration::from_millis(rng.below(40))).await;
            }
            continue;
        }
        let spec = match args.wrong {
            true => args.keys[0].clone(),
            false => args.keys[rng.below(args.keys.len() as u64) as usize].clone(),
        };
        let (mode, options) = choose(&spec, &args, &mut rng);
        let base = Event {
            key: spec.name.clone(),
            n,
            mode: mode.to_owned(),
            limit: options.limit,
            ..Event::default()
        };
        out.emit(
            w,
            Event {
                ev: "acq".into(),
                ..base.clone()
            },
        );
        let got = tokio::select! {
            got = client.lock_with(&spec.name, options) => got,
            _ = stop.cancelled() => break,
        };
        let lock = match got {
            Ok(lock) => lock,
            Err(e) => {
                let why = failure(&e);
                out.emit(
                    w,
                    Event {
                        ev: "fail".into(),
                        why,
                        ..base.clone()
                    },
                );
                let pause = 30 + rng.below(120);
                tokio::time::sleep(Duration::from_millis(pause)).await;
                continue;
            }
        };
        let token = lock.fencing_token();
        let base = Event { token, ..base };
        out.emit(
            w,
            Event {
                ev: "granted".into(),
                ..base.clone()
            },
        );
        let watcher = tokio::spawn(watch_states(lock.states(), out.clone(), w, base.clone()));
        // One hold in five is long: a lock held across a fault is what a fault can take
        // from its holder.
        let hold = match (args.wrong, calm.load(Ordering::Relaxed), rng.below(5)) {
            (true, _, _) => Duration::from_secs(8),
            (false, false, 0) => Duration::from_millis(1000 + rng.below(2000)),
            _ => Duration::from_millis(20 + rng.below(130)),
        };
        let until = tokio::time::Instant::now() + hold;
        let fenced = matches!(mode, "x" | "f" | "w");
        while tokio::time::Instant::now() < until && !stop.is_cancelled() {
            // Use the resource only while the lock is held (the wrong client: always).
            let usable = args.wrong || lock.state() == LockState::Held;
            if lock.is_lost() && !args.wrong {
                break;
            }
            if usable {
                register.write(fenced, &spec.name, token, &holder).await;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        if lock.is_lost() {
            drop(lock);
            let _ = watcher.await;
            continue;
        }
        out.emit(
            w,
            Event {
                ev: "release".into(),
                ..base.clone()
            },
        );
        watcher.abort();
        let released = tokio::select! {
            r = lock.release() => r,
            _ = tokio::time::sleep(args.ttl * 2) => Err(ClientError::Unavailable("release took too long".into())),
        };
        let (name, why) = match released {
            Ok(()) => ("released", String::new()),
            Err(e) => ("release-failed", failure(&e)),
        };
        out.emit(
            w,
            Event {
                ev: name.into(),
                why,
                ..base.clone()
            },
        );
        if !calm.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(rng.below(40))).await;
        }
    }
}

/// The mode and options of one acquire of `spec`.
fn choose(spec: &KeySpec, args: &WorkerArgs, rng: &mut Rng) -> (&'static str, LockOptions) {
    let mut options = LockOptions {
        wait: Some(if args.wrong { args.wait * 5 } else { args.wait }),
        ttl: Some(args.ttl),
        ..LockOptions::default()
    };
    let mode = match spec.kind {
        'f' => {
            options.fair = true;
            "f"
        }
        'r' if rng.below(3) > 0 => {
            options.shared = true;
            "s"
        }
        'r' => "w",
        'm' => {
            options.limit = spec.limit;
            "m"
        }
        _ => "x",
    };
    (mode, options)
}

/// Prints each change of the lock's state the moment the client library makes it.
pub(super) async fn watch_states(
    mut states: tokio::sync::watch::Receiver<LockState>,
    out: Arc<Out>,
    w: u32,
    base: Event,
) {
    // A state changed before this watcher began (a stream reset the instant the grant
    // arrived: suspended, then lost at once where no session is resumable) is told
    // first; else the history would see the holder hold on until its next grant (the
    // nemesis met it: seed 854332250, round 4, a false overlap).
    let mut first = Some(states.borrow_and_update().clone()).filter(|s| *s != LockState::Held);
    loop {
        let state = match first.take() {
            Some(state) => state,
            None if states.changed().await.is_ok() => states.borrow_and_update().clone(),
            None => return,
        };
        let (name, why) = match state {
            LockState::Held => ("restored", String::new()),
            LockState::Suspended => ("suspended", String::new()),
            LockState::Lost(why) => ("lost", why),
        };
        out.emit(
            w,
            Event {
                ev: name.into(),
                why,
                ..base.clone()
            },
        );
        if name == "lost" {
            return;
        }
    }
}

/// A short word for an acquire's failure.
pub(super) fn failure(e: &ClientError) -> String {
    let text = e.to_string();
    text.chars().take(160).collect()
}
