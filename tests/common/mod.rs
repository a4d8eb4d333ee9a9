//! Test harness: real `redis-server` processes on free loopback ports, in-process and
//! out-of-process sidecars, and a small `Lease` client. Every process started here is
//! killed on drop, also when a test panics.
#![allow(dead_code)]

pub mod certs;

use std::net::TcpListener as StdListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

pub mod prometheus;
pub mod proxy;
pub mod topology;
pub mod workload;

use lockside::engine::{Engine, EngineConfig};
use lockside::proto::lock_service_client::LockServiceClient;
use lockside::proto::{self, lease_request, lease_response};
use lockside::server::{self, Listener, ServerConfig};
use lockside::store::{Store, memory::MemoryStore, redis::RedisStore};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};

/// Upper bound for anything a test awaits. Generous: it only bounds a failing test.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// A free loopback port (below 55536, so Cluster bus ports fit too).
pub fn free_port() -> u16 {
    loop {
        let port = StdListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("bind a free port");
        // A Cluster node also listens on port + 10000 (its bus): keep both free.
        if port < 55536 && StdListener::bind(("127.0.0.1", port + 10000)).is_ok() {
            return port;
        }
    }
}

/// A scratch directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let name = lockside::engine::random_hex(8).expect("randomness");
        let path = std::env::temp_dir().join(format!("lockside-{tag}-{name}"));
        std::fs::create_dir_all(&path).expect("create temp dir");
        Self(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{sig} {pid} failed");
}

/// A `redis-server` on a free loopback port, killed on drop.
pub struct Redis {
    pub port: u16,
    child: Option<Child>,
    dir: TempDir,
    /// `requirepass`, when the server wants one.
    password: Option<String>,
    /// More `redis-server` arguments (ACL users, TLS files).
    server_args: Vec<String>,
    /// How `redis-cli` reaches it (`--tls --cacert ...`, `--user ... --pass ...`).
    cli_args: Vec<String>,
    /// Serve TLS only (`--port 0 --tls-port P`).
    tls: bool,
}

impl Redis {
    pub fn start() -> Self {
        Self::start_with_password(None)
    }

    /// A server that requires `password` (AUTH).
    pub fn start_with_password(password: Option<&str>) -> Self {
        Self::start_custom(password, &[], &[], false)
    }

    /// A server with more arguments; `cli_args` tell `redis-cli` how to reach it, `tls`
    /// serves TLS only.
    pub fn start_custom(
        password: Option<&str>,
        server_args: &[String],
        cli_args: &[String],
        tls: bool,
    ) -> Self {
        let dir = TempDir::new("redis");
        let mut redis = Self {
            port: 0,
            child: None,
            dir,
            password: password.map(str::to_owned),
            server_args: server_args.to_vec(),
            cli_args: cli_args.to_vec(),
            tls,
        };
        // A port found free can be taken before redis binds it: retry on failure.
        for _ in 0..5 {
            redis.port = free_port();
            if redis.spawn() {
                return redis;
            }
        }
        panic!("redis-server did not start");
    }

    fn spawn(&mut self) -> bool {
        let port = self.port.to_string();
        let ports = match self.tls {
            true => vec!["--port", "0", "--tls-port", &port],
            false => vec!["--port", &port],
        };
        let child = Command::new("redis-server")
            .args(ports)
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(&self.server_args)
            .args(["--dir", &self.dir.0.to_string_lossy()])
            .args(
                self.password
                    .iter()
                    .flat_map(|p| ["--requirepass", p.as_str()]),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (.ci/run installs it)");
        self.child = Some(child);
        let deadline = std::time::Instant::now() + PATIENCE;
        while std::time::Instant::now() < deadline {
            if self.ping() {
                return true;
            }
            if let Some(Ok(Some(_))) = self.child.as_mut().map(|c| c.try_wait()) {
                self.child = None;
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
        false
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Whether the server on our port answers and is *our* child: a port found free
    /// may have been taken by another test's server, which would answer PING too.
    fn ping(&self) -> bool {
        let Some(pid) = self.child.as_ref().map(|c| c.id()) else {
            return false;
        };
        Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(&self.cli_args)
            .args(
                self.password
                    .iter()
                    .flat_map(|p| ["--no-auth-warning", "-a", p.as_str()]),
            )
            .args(["info", "server"])
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .any(|l| l.trim() == format!("process_id:{pid}"))
            })
            .unwrap_or(false)
    }

    /// Runs one redis-cli command and returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(&self.cli_args)
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Kills the server (SIGKILL) and waits for it to go.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        for _ in 0..50 {
            if self.spawn() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("redis-server did not restart on port {}", self.port);
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Which store a test runs on.
#[derive(Clone, Debug)]
pub enum StoreKind {
    Memory,
    Redis(String),
}

/// A namespace unique to this call, so tests sharing a Redis never meet.
pub fn namespace() -> String {
    TempDir::new("ns")
        .0
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

pub fn make_store(kind: &StoreKind, ns: &str) -> Arc<dyn Store> {
    match kind {
        StoreKind::Memory => Arc::new(MemoryStore::new()),
        StoreKind::Redis(url) => {
            Arc::new(RedisStore::new(url, ns, Duration::from_millis(500)).expect("redis store"))
        }
    }
}

/// Server settings for tests: short keepalive so a frozen client is noticed fast.
pub fn test_server_config() -> ServerConfig {
    ServerConfig {
        keepalive_interval: Duration::from_millis(300),
        keepalive_timeout: Duration::from_millis(300),
        drain_timeout: Duration::from_secs(5),
        ..ServerConfig::default()
    }
}

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
        let child = Command::new(env!("CARGO_BIN_EXE_lockside"))
            .args([
                "serve",
                "--listen",
                addr,
                "--store",
                store,
                "--namespace",
                namespace,
                // Tests run sidecars side by side: no fixed admin port.
                "--admin-listen",
                "127.0.0.1:0",
            ])
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

/// A gRPC connection to a sidecar.
#[derive(Clone)]
pub struct Client {
    pub grpc: LockServiceClient<Channel>,
}

impl Client {
    pub async fn connect(addr: &str) -> Self {
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .expect("endpoint")
            .http2_keep_alive_interval(Duration::from_secs(1))
            .keep_alive_timeout(Duration::from_secs(1))
            .connect()
            .await
            .expect("connect to sidecar");
        Self {
            grpc: LockServiceClient::new(channel),
        }
    }

    /// Opens a Lease stream and reads its SessionStarted.
    pub async fn lease(&self) -> Lease {
        self.lease_named("").await
    }

    pub async fn lease_named(&self, name: &str) -> Lease {
        let (tx, rx) = mpsc::channel(1024);
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        if !name.is_empty() {
            request
                .metadata_mut()
                .insert("lockside-client-name", name.parse().expect("ascii name"));
        }
        let mut grpc = self.grpc.clone();
        let responses = tokio::time::timeout(PATIENCE, grpc.lease(request))
            .await
            .expect("lease in time")
            .expect("lease accepted")
            .into_inner();
        Lease::open(tx, responses).await
    }

    /// Opens a Lease stream that resumes the session of `token`; the refusal's status
    /// if it is refused.
    pub async fn resume(&self, token: &str) -> Result<Lease, tonic::Status> {
        let (tx, rx) = mpsc::channel(1024);
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        let value = token
            .parse()
            .map_err(|_| tonic::Status::invalid_argument("not a header value"))?;
        request.metadata_mut().insert("lockside-resume", value);
        let mut grpc = self.grpc.clone();
        let responses = tokio::time::timeout(PATIENCE, grpc.lease(request))
            .await
            .expect("lease in time")?
            .into_inner();
        Ok(Lease::open(tx, responses).await)
    }

    pub async fn describe(&self, key: &str) -> proto::DescribeResponse {
        let mut grpc = self.grpc.clone();
        grpc.describe(proto::DescribeRequest { key: key.into() })
            .await
            .expect("describe")
            .into_inner()
    }
}

/// One open `Lease` stream.
pub struct Lease {
    tx: Option<mpsc::Sender<proto::LeaseRequest>>,
    rx: tonic::Streaming<proto::LeaseResponse>,
    pub session_id: String,
    /// `SessionStarted.resume_token`.
    pub resume_token: String,
    /// `SessionStarted.resumed_locks`.
    pub resumed_locks: u32,
    next_id: u64,
}

pub fn secs(d: f64) -> prost_types::Duration {
    prost_types::Duration::try_from(Duration::from_secs_f64(d)).expect("duration")
}

/// Builds an Acquire with everything but id and key at its default.
pub fn acquire(key: &str) -> proto::Acquire {
    proto::Acquire {
        key: key.into(),
        ..Default::default()
    }
}

impl Lease {
    /// The stream's first event must be `SessionStarted`.
    async fn open(
        tx: mpsc::Sender<proto::LeaseRequest>,
        rx: tonic::Streaming<proto::LeaseResponse>,
    ) -> Self {
        let mut lease = Lease {
            tx: Some(tx),
            rx,
            session_id: String::new(),
            resume_token: String::new(),
            resumed_locks: 0,
            next_id: 1,
        };
        match lease.next().await {
            lease_response::Event::Started(s) => {
                lease.session_id = s.session_id;
                lease.resume_token = s.resume_token;
                lease.resumed_locks = s.resumed_locks;
            }
            other => panic!("first event must be SessionStarted, got {other:?}"),
        }
        lease
    }

    pub async fn send(&self, command: lease_request::Command) {
        self.tx
            .as_ref()
            .expect("stream open")
            .send(proto::LeaseRequest {
                command: Some(command),
            })
            .await
            .expect("send");
    }

    pub async fn send_raw(&self, request: proto::LeaseRequest) {
        self.tx
            .as_ref()
            .expect("stream open")
            .send(request)
            .await
            .expect("send");
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Sends an Acquire (its request_id is set here) and returns the id.
    pub async fn send_acquire(&mut self, mut a: proto::Acquire) -> u64 {
        if a.request_id == 0 {
            a.request_id = self.id();
        }
        let id = a.request_id;
        self.send(lease_request::Command::Acquire(a)).await;
        id
    }

    pub async fn send_release(&mut self, key: &str) -> u64 {
        let id = self.id();
        self.send(lease_request::Command::Release(proto::Release {
            request_id: id,
            key: key.into(),
        }))
        .await;
        id
    }

    /// The next event; panics if none comes in time or the stream ends.
    pub async fn next(&mut self) -> lease_response::Event {
        match self.try_next().await {
            Ok(Some(event)) => event,
            Ok(None) => panic!("stream ended"),
            Err(status) => panic!("stream failed: {status}"),
        }
    }

    /// The next event, the end of the stream, or its error status.
    pub async fn try_next(&mut self) -> Result<Option<lease_response::Event>, tonic::Status> {
        let message = tokio::time::timeout(PATIENCE, self.rx.next())
            .await
            .expect("an event in time");
        match message {
            None => Ok(None),
            Some(Err(status)) => Err(status),
            Some(Ok(response)) => Ok(Some(response.event.expect("event set"))),
        }
    }

    /// Acquires `key` without waiting and expects a grant; returns it.
    pub async fn grant(&mut self, key: &str) -> proto::Granted {
        let id = self.send_acquire(acquire(key)).await;
        self.expect_granted(id).await
    }

    pub async fn expect_granted(&mut self, id: u64) -> proto::Granted {
        match self.next().await {
            lease_response::Event::Granted(g) if g.request_id == id => g,
            other => panic!("expected Granted for {id}, got {other:?}"),
        }
    }

    /// The grant for `id`, after any `Waiting` for it.
    pub async fn granted_after_wait(&mut self, id: u64) -> proto::Granted {
        loop {
            match self.next().await {
                lease_response::Event::Waiting(w) if w.request_id == id => continue,
                lease_response::Event::Granted(g) if g.request_id == id => return g,
                other => panic!("expected Granted for {id}, got {other:?}"),
            }
        }
    }

    pub async fn expect_not_acquired(&mut self, id: u64) -> i32 {
        match self.next().await {
            lease_response::Event::NotAcquired(n) if n.request_id == id => n.reason,
            other => panic!("expected NotAcquired for {id}, got {other:?}"),
        }
    }

    pub async fn expect_waiting(&mut self, id: u64) {
        match self.next().await {
            lease_response::Event::Waiting(w) if w.request_id == id => {}
            other => panic!("expected Waiting for {id}, got {other:?}"),
        }
    }

    pub async fn expect_released(&mut self, id: u64) -> u32 {
        match self.next().await {
            lease_response::Event::Released(r) if r.request_id == id => r.hold_count,
            other => panic!("expected Released for {id}, got {other:?}"),
        }
    }

    pub async fn expect_rejected(&mut self, id: u64) -> proto::Rejected {
        match self.next().await {
            lease_response::Event::Rejected(r) if r.request_id == id => r,
            other => panic!("expected Rejected for {id}, got {other:?}"),
        }
    }

    pub async fn release(&mut self, key: &str) -> u32 {
        let id = self.send_release(key).await;
        self.expect_released(id).await
    }

    /// Half-closes the request side, as a client that is done.
    pub fn close(&mut self) {
        self.tx = None;
    }
}

/// One holding interval recorded by a client: from the grant's arrival (before first
/// use) to just before the release was sent (after last use).
#[derive(Clone, Debug)]
pub struct Interval {
    pub key: String,
    pub start: tokio::time::Instant,
    pub end: tokio::time::Instant,
    pub token: u64,
}

/// What the checker found in a history.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    pub intervals: usize,
    pub overlaps: usize,
    pub token_regressions: usize,
}

/// Checks a history of exclusive holds: per key, no interval may start before every
/// earlier one ended, and tokens must strictly increase in grant order.
pub fn check_history(history: &[Interval]) -> Verdict {
    let mut by_key: std::collections::BTreeMap<&str, Vec<&Interval>> = Default::default();
    for i in history {
        by_key.entry(&i.key).or_default().push(i);
    }
    let mut verdict = Verdict {
        intervals: history.len(),
        ..Verdict::default()
    };
    for intervals in by_key.values_mut() {
        intervals.sort_by_key(|i| i.start);
        let mut max_end: Option<tokio::time::Instant> = None;
        let mut last_token = 0;
        for i in intervals.iter() {
            if max_end.is_some_and(|end| i.start < end) {
                verdict.overlaps += 1;
            }
            if i.token <= last_token {
                verdict.token_regressions += 1;
            }
            last_token = i.token;
            max_end = Some(max_end.map_or(i.end, |end| end.max(i.end)));
        }
    }
    verdict
}

/// A small deterministic random source (xorshift), so tests need no extra crate and a
/// failing run can be replayed from its seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The most intervals that overlap at any instant (for semaphores: must stay within
/// the limit).
pub fn max_concurrent(history: &[Interval]) -> usize {
    let mut edges: Vec<(tokio::time::Instant, i32)> = history
        .iter()
        .flat_map(|i| [(i.start, 1), (i.end, -1)])
        .collect();
    // At equal instants, ends before starts: touching intervals do not overlap.
    edges.sort_by_key(|&(t, delta)| (t, delta));
    let (mut now, mut max) = (0i32, 0i32);
    for (_, delta) in edges {
        now += delta;
        max = max.max(now);
    }
    max as usize
}

/// A sidecar in this process on the store under test ("memory" or "redis"), with a
/// client; the Redis (if any) lives as long as the setup.
pub struct Setup {
    pub sidecar: Sidecar,
    pub client: Client,
    _redis: Option<Redis>,
}

pub async fn setup(kind: &str) -> Setup {
    setup_with(kind, EngineConfig::default()).await
}

pub async fn setup_with(kind: &str, config: EngineConfig) -> Setup {
    let (kind, redis) = match kind {
        "memory" => (StoreKind::Memory, None),
        _ => {
            let redis = Redis::start();
            (StoreKind::Redis(redis.url()), Some(redis))
        }
    };
    let sidecar = Sidecar::start_with(make_store(&kind, &namespace()), config).await;
    let client = sidecar.client().await;
    Setup {
        sidecar,
        client,
        _redis: redis,
    }
}

/// An Acquire that waits up to `seconds`.
pub fn waiting_for(key: &str, seconds: f64) -> proto::Acquire {
    proto::Acquire {
        wait_timeout: Some(secs(seconds)),
        ..acquire(key)
    }
}

/// Runs each `async fn NAME(Setup)` of the calling file once on the memory store and
/// once on a real Redis, as `memory::NAME` and `redis::NAME`.
#[macro_export]
macro_rules! for_each_store {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(#[tokio::test] async fn $name() { super::$name($crate::common::setup("memory").await).await; })*
        }
        mod redis {
            $(#[tokio::test] async fn $name() { super::$name($crate::common::setup("redis").await).await; })*
        }
    };
}

/// Two sidecars in this process on one Redis and one namespace.
pub async fn two_sidecars(redis: &Redis) -> [Sidecar; 2] {
    let ns = namespace();
    [
        Sidecar::start(make_store(&StoreKind::Redis(redis.url()), &ns)).await,
        Sidecar::start(make_store(&StoreKind::Redis(redis.url()), &ns)).await,
    ]
}
