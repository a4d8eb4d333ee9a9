//! The fenced register: the resource the locks protect, outside the lock store, built
//! the way docs/guarantees.md tells users to build one. A small TCP server on loopback
//! in the test process (no fault touches it). Per key it keeps the largest fencing
//! token it accepted and refuses a write with a smaller one.
//!
//! Protocol, one line each way: `W KEY TOKEN HOLDER T_NS` (a fenced write, by an
//! exclusive holder) or `U KEY TOKEN HOLDER T_NS` (a use that is logged only: shared
//! readers and semaphore permits hold side by side with different tokens, so fencing
//! them against each other would refuse honest uses); the answer is `OK` or
//! `NO HIGHEST`. `T_NS` is the client's stamp taken just before sending. Every line is
//! logged with the register's own stamp.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

use super::history::now_ns;

/// One write or use the register received.
#[derive(Clone, Debug)]
pub struct Write {
    /// The register's stamp.
    pub received: u64,
    /// The client's stamp, taken before sending.
    pub sent: u64,
    pub key: String,
    pub token: u64,
    pub holder: String,
    pub fenced: bool,
    pub accepted: bool,
}

#[derive(Default)]
struct State {
    highest: BTreeMap<String, u64>,
    log: Vec<Write>,
}

/// The register server; its task ends with the runtime or on drop.
pub struct Register {
    pub addr: String,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Register {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind register");
        let addr = listener.local_addr().expect("register addr").to_string();
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let _ = socket.set_nodelay(true);
                tokio::spawn(serve(socket, shared.clone()));
            }
        });
        Self { addr, state, task }
    }

    /// Everything received so far, in arrival order.
    pub fn log(&self) -> Vec<Write> {
        self.state.lock().expect("register").log.clone()
    }
}

impl Drop for Register {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(socket: tokio::net::TcpStream, state: Arc<Mutex<State>>) {
    let (read, mut write) = socket.into_split();
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let answer = match handle(&line, &state) {
            Some(Ok(())) => "OK\n".to_owned(),
            Some(Err(highest)) => format!("NO {highest}\n"),
            None => "ERR\n".to_owned(),
        };
        if write.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// Applies one line: `Ok` accepted, `Err(highest)` refused, `None` malformed.
fn handle(line: &str, state: &Mutex<State>) -> Option<Result<(), u64>> {
    let received = now_ns();
    let mut words = line.split_whitespace();
    let fenced = match words.next()? {
        "W" => true,
        "U" => false,
        _ => return None,
    };
    let key = words.next()?.to_owned();
    let token: u64 = words.next()?.parse().ok()?;
    let holder = words.next()?.to_owned();
    let sent: u64 = words.next()?.parse().ok()?;
    let mut state = state.lock().expect("register");
    let verdict = match fenced {
        false => Ok(()),
        true => {
            let highest = state.highest.entry(key.clone()).or_default();
            if token < *highest {
                Err(*highest)
            } else {
                *highest = token;
                Ok(())
            }
        }
    };
    state.log.push(Write {
        received,
        sent,
        key,
        token,
        holder,
        fenced,
        accepted: verdict.is_ok(),
    });
    Some(verdict)
}
