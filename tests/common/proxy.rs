//! A small TCP proxy for network faults between a client (the sidecar, a replica) and
//! a server: latency, blackhole, freeze and reset, each per direction. `tc netem` is not
//! available on these machines; a proxy in the test process is enough for loopback.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What happens to the bytes of one direction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Fault {
    /// Bytes pass.
    #[default]
    Pass,
    /// Bytes pass after this delay.
    Latency(Duration),
    /// Bytes are read and thrown away: the connection looks alive, nothing arrives.
    Blackhole,
    /// Bytes are not read: they pile up in the kernel until the fault ends.
    Freeze,
}

/// The two directions: client to server (`up`) and server to client (`down`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    pub up: Fault,
    pub down: Fault,
}

/// A proxy on a free loopback port to `upstream`; stops with the test's runtime.
pub struct Proxy {
    pub port: u16,
    faults: watch::Sender<Faults>,
    /// Bumped by [`Proxy::reset`]: every open connection is reset.
    resets: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
    open: Arc<Mutex<usize>>,
}

impl Proxy {
    pub async fn start(upstream: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("proxy addr").port();
        let faults = watch::channel(Faults::default()).0;
        let resets = watch::channel(0u64).0;
        let open = Arc::new(Mutex::new(0));
        let (f, r, o) = (faults.clone(), resets.clone(), open.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (f, r, o) = (f.subscribe(), r.subscribe(), o.clone());
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                        return;
                    };
                    *o.lock().expect("count") += 1;
                    pipe(client, server, f, r).await;
                    *o.lock().expect("count") -= 1;
                });
            }
        });
        Self {
            port,
            faults,
            resets,
            task,
            open,
        }
    }

    pub fn set(&self, faults: Faults) {
        self.faults.send_replace(faults);
    }

    /// Both directions at once.
    pub fn both(&self, fault: Fault) {
        self.set(Faults {
            up: fault,
            down: fault,
        });
    }

    pub fn heal(&self) {
        self.set(Faults::default());
    }

    /// Resets every open connection (RST); new ones are accepted.
    pub fn reset(&self) {
        self.resets.send_modify(|n| *n += 1);
    }

    /// Connections open through the proxy.
    pub fn open(&self) -> usize {
        *self.open.lock().expect("count")
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn pipe(
    client: TcpStream,
    server: TcpStream,
    faults: watch::Receiver<Faults>,
    mut resets: watch::Receiver<u64>,
) {
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let up = copy(cr, sw, faults.clone(), |f| f.up);
    let down = copy(sr, cw, faults, |f| f.down);
    resets.borrow_and_update();
    tokio::select! {
        _ = up => {}
        _ = down => {}
        _ = resets.changed() => {}
    }
    // Dropping both halves closes both sockets; SO_LINGER 0 is not reachable on split
    // halves, but a closed peer that gets more bytes answers with RST.
}

/// Copies one direction. A reader stamps each chunk with its arrival and a writer
/// sends it at arrival + latency: a delay line, so latency does not queue chunks behind
/// each other (pipelined requests stay pipelined).
async fn copy(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut faults: watch::Receiver<Faults>,
    pick: fn(&Faults) -> Fault,
) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let writer = async move {
        while let Some((at, bytes)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
    };
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            // A frozen direction reads nothing until the fault changes.
            loop {
                let fault = pick(&faults.borrow_and_update());
                if fault != Fault::Freeze {
                    break;
                }
                if faults.changed().await.is_err() {
                    return;
                }
            }
            let n = tokio::select! {
                n = from.read(&mut buf) => match n {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                },
                changed = faults.changed() => {
                    if changed.is_err() { return }
                    continue;
                }
            };
            let fault = pick(&faults.borrow());
            let at = match fault {
                Fault::Blackhole => continue,
                Fault::Latency(d) => tokio::time::Instant::now() + d,
                Fault::Pass | Fault::Freeze => tokio::time::Instant::now(),
            };
            if tx.send((at, buf[..n].to_vec())).is_err() {
                return;
            }
        }
    };
    tokio::select! {
        _ = writer => {}
        _ = reader => {}
    }
}
