//! Sidecars under test: in this process on a free port ([`Sidecar`]), or as the real
//! binary ([`SidecarProcess`], for tests that SIGKILL or SIGSTOP it), and the example
//! holder process ([`HolderProcess`]).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use lockside::engine::{Engine, EngineConfig};
use lockside::server::{self, Listener, ServerConfig};
use lockside::store::Store;
use tokio::sync::{mpsc, oneshot};

use super::{
    Client, PATIENCE, Redis, StoreKind, free_port, make_store, namespace, signal,
    test_server_config,
};

/// A sidecar running in this process on a free port.
pub struct Sidecar {
    pub addr: String,
    /// The admin listener (/livez, /readyz, /metrics).
    pub admin: String,
    pub engine: Engine,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Sidecar {
    pub async fn start(store: Arc<dyn Store>) -> Self {
        Self::start_with(store, EngineConfig::default()).await
    }

    pub async fn start_with(store: Arc<dyn Store>, config: EngineConfig) -> Self {
        Self::start_configured(store, config, test_server_config()).await
    }

    /// With the server's own settings (e.g. the production keepalive, for tests that
    /// load the machine so much that a 300 ms PING deadline would be missed).
    pub async fn start_configured(
        store: Arc<dyn Store>,
        config: EngineConfig,
        server: ServerConfig,
    ) -> Self {
        let listener = Listener::bind(&"127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("bind");
        let addr = listener.local_addr();
        let admin_listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind admin");
        let admin = admin_listener.local_addr().expect("admin addr").to_string();
        let engine = Engine::new(store, config);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server::run(
            listener,
            Some(admin_listener),
            engine.clone(),
            server,
            async {
                let _ = stopped.await;
            },
        ));
        let task = tokio::spawn(async move {
            task.await.expect("server task").expect("server");
        });
        Self {
            addr,
            admin,
            engine,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Graceful shutdown, as on SIGTERM; returns when the server has stopped.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(PATIENCE, task)
                .await
                .expect("shutdown in time")
                .expect("task");
        }
    }

    pub async fn client(&self) -> Client {
        Client::connect(&self.addr).await
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        self.engine.shutdown();
    }
}

/// The real `lockside` binary, killed on drop.
pub struct SidecarProcess {
    pub addr: String,
    child: Option<Child>,
}

impl SidecarProcess {
    pub fn start(store: &str, namespace: &str, extra: &[&str]) -> Self {
        Self::launch(store, namespace, extra, &[], None)
    }

    /// On `addr` (e.g. the address of one that was killed), retrying while the port is
    /// still taken.
    pub fn start_at(addr: &str, store: &str, namespace: &str, extra: &[&str]) -> Self {
        for _ in 0..50 {
            if let Some(process) = Self::try_launch(addr, store, namespace, extra, &[], None) {
                return process;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("lockside serve did not start on {addr}");
    }

    /// With environment variables, and stderr appended to `log` (else discarded).
    pub fn launch(
        store: &str,
        namespace: &str,
        extra: &[&str],
        env: &[(&str, &str)],
        log: Option<&Path>,
    ) -> Self {
        for _ in 0..5 {
            let addr = format!("127.0.0.1:{}", free_port());
            if let Some(process) = Self::try_launch(&addr, store, namespace, extra, env, log) {
                return process;
            }
        }
        panic!("lockside serve did not start");
    }

    /// Starts one on `addr`; `None` if it did not come up (the port is taken).
    fn try_launch(
        addr: &str,
        store: &str,
        namespace: &str,
        extra: &[&str],
        env: &[(&str, &str)],
        log: Option<&Path>,
    ) -> Option<Self> {
        let stderr = match log {
            None => Stdio::null(),
            Some(path) => std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .expect("open the sidecar's log")
                .into(),
        };
        // Tests run sidecars side by side: no fixed admin port, unless `extra` names one.
        let admin = match extra.contains(&"--admin-listen") {
            true => None,
            false => Some(["--admin-listen", "127.0.0.1:0"]),
        };
        let child = Command::new(env!("CARGO_BIN_EXE_lockside"))
            .args([
                "serve",
                "--listen",
                addr,
                "--store",
                store,
                "--namespace",
                namespace,
            ])
            .args(admin.into_iter().flatten())
            .args([
                "--keepalive-interval",
                "300ms",
                "--keepalive-timeout",
                "300ms",
            ])
            .args(extra)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn lockside");
        let mut process = Self {
            addr: addr.to_owned(),
            child: Some(child),
        };
        let deadline = std::time::Instant::now() + PATIENCE;
        while std::time::Instant::now() < deadline {
            if std::net::TcpStream::connect(addr).is_ok() {
                // Someone else may own the port: ours would then exit on its
                // failed bind, so make sure it is still running.
                std::thread::sleep(Duration::from_millis(20));
                if let Some(Ok(None)) = process.child.as_mut().map(|c| c.try_wait()) {
                    return Some(process);
                }
                break;
            }
            if let Some(Ok(Some(_))) = process.child.as_mut().map(|c| c.try_wait()) {
                break; // port taken: try another
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        process.kill();
        None
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then waits for the exit status.
    pub async fn terminate(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        signal(child.id(), "TERM");
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return status;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "sidecar did not exit on SIGTERM"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for SidecarProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A child process that runs `examples/holder.rs`: it takes a lock and holds it until
/// killed, printing `granted TOKEN` when it has it.
pub struct HolderProcess {
    child: Option<Child>,
}

pub fn example_path(name: &str) -> PathBuf {
    // target/debug/lockside -> target/debug/examples/NAME
    Path::new(env!("CARGO_BIN_EXE_lockside"))
        .parent()
        .expect("target dir")
        .join("examples")
        .join(name)
}

impl HolderProcess {
    /// Starts the holder and waits until it holds `key`. Returns its fencing token.
    pub async fn start(addr: &str, key: &str) -> (Self, u64) {
        use std::io::BufRead;
        let path = example_path("holder");
        let mut child = Command::new(&path)
            .args([addr, key])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e} (plain `cargo test` builds it; with a filter, run `cargo build --examples` first)", path.display()));
        let stdout = child.stdout.take().expect("stdout");
        let (tx, mut rx) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                let _ = tx.send(line);
            }
        });
        let line = tokio::time::timeout(PATIENCE, rx.recv())
            .await
            .expect("holder reports its grant in time")
            .expect("holder reports its grant");
        let token = line
            .strip_prefix("granted ")
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("unexpected holder output {line:?}"));
        (Self { child: Some(child) }, token)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn sigkill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn sigstop(&self) {
        signal(self.pid(), "STOP");
    }
}

impl Drop for HolderProcess {
    fn drop(&mut self) {
        if let Some(child) = &self.child {
            // A stopped process must be continued to die cleanly.
            let _ = Command::new("kill")
                .args(["-CONT", &child.id().to_string()])
                .status();
        }
        self.sigkill();
    }
}

/// Two sidecars in this process on one Redis and one namespace.
pub async fn two_sidecars(redis: &Redis) -> [Sidecar; 2] {
    let ns = namespace();
    [
        Sidecar::start(make_store(&StoreKind::Redis(redis.url()), &ns)).await,
        Sidecar::start(make_store(&StoreKind::Redis(redis.url()), &ns)).await,
    ]
}
