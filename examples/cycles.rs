//! The client core's own uncontended cycle, with no binding in between: what the
//! Python and Node packages' benchmark (`clients/python/bench.py`) reports as the
//! floor under them (the gRPC hop, the sidecar and Redis). It runs the core as the
//! bindings do: one I/O thread, each cycle an acquire without waiting and a release
//! that returns once it is on the stream.
//!
//! Usage: `cycles ADDR KEY`; for each line N on stdin, N cycles, then one line on
//! stdout: a JSON array of the cycle times in microseconds.

use std::io::{BufRead, Write};

use lockside::client::{Client, ClientSettings, ConnectOptions, LockOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(addr), Some(key)) = (args.next(), args.next()) else {
        return Err("usage: cycles ADDR KEY".into());
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let client = {
        let _entered = runtime.enter();
        Client::lazy(&addr, &ConnectOptions::default(), ClientSettings::default())?
    };
    let options = LockOptions::default();
    let mut out = std::io::stdout().lock();
    for line in std::io::stdin().lock().lines() {
        let n: usize = line?.trim().parse()?;
        let mut times = Vec::with_capacity(n);
        for _ in 0..n {
            let started = std::time::Instant::now();
            let lock = runtime.block_on(client.acquire(&key, &options, None))?;
            lock.release()?;
            times.push(format!("{:.1}", started.elapsed().as_secs_f64() * 1e6));
        }
        writeln!(out, "[{}]", times.join(","))?;
        out.flush()?;
    }
    runtime.block_on(client.close());
    Ok(())
}
