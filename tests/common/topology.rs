//! Redis topologies on loopback for the fault suite: Sentinel (1 master, 2 replicas
//! whose replication goes through a [`Proxy`] so a test can cut it, 3 sentinels) and
//! Cluster (3 masters, 3 replicas). Every process is killed on drop, also on panic.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::proxy::Proxy;
use super::{PATIENCE, Redis, TempDir, free_port};

/// The master name the sentinels monitor.
pub const MASTER: &str = "lockside";

/// `redis-cli -p PORT ARGS...`, its output trimmed.
pub fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status();
}

/// Polls `f` every 20 ms until it is true, at most `limit`; whether it became true.
/// Blocks its thread: in async code use [`wait_until`], or tasks queued on this worker
/// (the replication proxy) stall.
pub fn poll(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Polls `f` every 20 ms until it is true, at most `limit`, without blocking the
/// runtime; whether it became true.
pub async fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if tokio::task::block_in_place(&mut f) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// A `redis-server --sentinel` process, killed on drop.
struct SentinelProcess {
    port: u16,
    child: Child,
    _dir: TempDir,
}

impl SentinelProcess {
    fn start(master: u16) -> Self {
        for _ in 0..5 {
            let dir = TempDir::new("sentinel");
            let port = free_port();
            let conf = dir.0.join("sentinel.conf");
            let text = format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                 sentinel monitor {MASTER} 127.0.0.1 {master} 2\n\
                 sentinel down-after-milliseconds {MASTER} 1000\n\
                 sentinel failover-timeout {MASTER} 5000\n\
                 sentinel parallel-syncs {MASTER} 1\n",
                dir = dir.0.display()
            );
            std::fs::write(&conf, text).expect("sentinel.conf");
            let child = Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server --sentinel");
            let mut sentinel = Self {
                port,
                child,
                _dir: dir,
            };
            let up = poll(PATIENCE, || {
                cli(port, &["sentinel", "get-master-addr-by-name", MASTER])
                    .contains(&master.to_string())
                    || matches!(sentinel.child.try_wait(), Ok(Some(_)))
            });
            if up && matches!(sentinel.child.try_wait(), Ok(None)) {
                return sentinel;
            }
            let _ = sentinel.child.kill();
            let _ = sentinel.child.wait();
        }
        panic!("redis-server --sentinel did not start");
    }
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One master, two replicas replicating through proxies, three sentinels (quorum 2,
/// down after 1 s, failover timeout 5 s).
pub struct SentinelSetup {
    /// Data nodes; `nodes[0]` starts as the master.
    pub nodes: Vec<Redis>,
    /// The replication links of `nodes[1]` and `nodes[2]` to the first master.
    pub replication: Vec<Proxy>,
    sentinels: Vec<SentinelProcess>,
    frozen: Vec<u32>,
}

impl SentinelSetup {
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// With more `redis-server` arguments for every data node.
    pub async fn start_with(extra: &[&str]) -> Self {
        // Full syncs start at once (Redis 7 waits 5 s for more replicas by default).
        let extra: Vec<String> = ["--repl-diskless-sync-delay", "0"]
            .iter()
            .chain(extra)
            .map(|s| s.to_string())
            .collect();
        let master = Redis::start_custom(None, &extra, &[], false);
        let mut nodes = vec![master];
        let mut replication = Vec::new();
        for _ in 0..2 {
            let proxy = Proxy::start(nodes[0].port).await;
            let mut args = extra.clone();
            args.extend([
                "--replicaof".into(),
                "127.0.0.1".into(),
                proxy.port.to_string(),
            ]);
            nodes.push(Redis::start_custom(None, &args, &[], false));
            replication.push(proxy);
        }
        let master_port = nodes[0].port;
        let synced = wait_until(PATIENCE, || {
            cli(master_port, &["info", "replication"])
                .matches("state=online")
                .count()
                == 2
        })
        .await;
        assert!(synced, "replicas connected");
        let sentinels: Vec<_> = tokio::task::block_in_place(|| {
            (0..3)
                .map(|_| SentinelProcess::start(master_port))
                .collect()
        });
        // Sentinels find each other and the replicas through the master (hello messages
        // every 2 s); a failover needs that.
        let ready = wait_until(Duration::from_secs(20), || {
            sentinels.iter().all(|s| {
                let info = cli(s.port, &["sentinel", "master", MASTER]);
                let field = |name: &str| {
                    let mut lines = info.lines();
                    lines.find(|l| l.trim() == name);
                    lines.next().map(str::trim).unwrap_or("").to_owned()
                };
                field("num-other-sentinels") == "2" && field("num-slaves") == "2"
            })
        })
        .await;
        assert!(ready, "sentinels know each other and the replicas");
        Self {
            nodes,
            replication,
            sentinels,
            frozen: Vec::new(),
        }
    }

    /// `redis+sentinel://h1,h2,h3/lockside`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        format!("redis+sentinel://{}/{MASTER}", hosts.join(","))
    }

    /// The master's port as the first sentinel that answers sees it.
    pub fn master_port(&self) -> u16 {
        for s in &self.sentinels {
            let out = cli(s.port, &["sentinel", "get-master-addr-by-name", MASTER]);
            if let Some(port) = out.lines().nth(1).and_then(|p| p.trim().parse().ok()) {
                return port;
            }
        }
        panic!("no sentinel names a master");
    }

    /// Whether every sentinel names another master than `old`.
    pub fn failed_over_from(&self, old: u16) -> bool {
        self.sentinels.iter().all(|s| {
            let out = cli(s.port, &["sentinel", "get-master-addr-by-name", MASTER]);
            out.lines()
                .nth(1)
                .and_then(|p| p.trim().parse::<u16>().ok())
                .is_some_and(|p| p != old)
        })
    }

    /// Points every sentinel at the master on `port` instead (`SENTINEL REMOVE`, then
    /// `MONITOR`): the old master stays a master and answers, as one frozen through a
    /// failover does until Sentinel demotes it.
    pub fn monitor_instead(&self, port: u16) {
        for s in &self.sentinels {
            cli(s.port, &["sentinel", "remove", MASTER]);
            let port = port.to_string();
            cli(
                s.port,
                &["sentinel", "monitor", MASTER, "127.0.0.1", &port, "2"],
            );
        }
    }

    /// Blackholes the replication stream from the first master to its replicas: they
    /// stay connected and receive nothing.
    pub fn cut_replication(&self) {
        for proxy in &self.replication {
            proxy.both(super::proxy::Fault::Blackhole);
        }
    }

    /// SIGSTOPs the data node on `port` (SIGCONT on drop).
    pub fn freeze(&mut self, port: u16) {
        freeze(&self.nodes, &mut self.frozen, port);
    }

    /// SIGCONTs every frozen node.
    pub fn thaw(&mut self) {
        thaw(&mut self.frozen);
    }
}

impl Drop for SentinelSetup {
    fn drop(&mut self) {
        self.thaw();
    }
}

/// A Redis Cluster on loopback: six `Redis` nodes with cluster mode on.
pub struct ClusterSetup {
    pub nodes: Vec<Redis>,
    frozen: Vec<u32>,
}

/// The cluster that tests of one binary share while any of them runs (see
/// [`ClusterSetup::shared`]).
static SHARED: std::sync::Mutex<std::sync::Weak<ClusterSetup>> =
    std::sync::Mutex::new(std::sync::Weak::new());

impl ClusterSetup {
    /// A cluster shared with the other tests of this binary that run at the same time
    /// (namespaces keep them apart); it stops when the last of them drops it, also on
    /// a panic, so no process outlives the test binary. Only for tests that do not
    /// freeze or fail over nodes.
    pub fn shared() -> std::sync::Arc<Self> {
        let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(cluster) = shared.upgrade() {
            return cluster;
        }
        let cluster = std::sync::Arc::new(Self::start());
        *shared = std::sync::Arc::downgrade(&cluster);
        cluster
    }

    /// Six nodes, three masters with one replica each, node timeout 1 s. Blocks its
    /// thread for about two seconds (in async tests: inside `block_in_place`).
    pub fn start() -> Self {
        Self::start_with_node_timeout(1000)
    }

    /// As [`ClusterSetup::start`] with `cluster-node-timeout` `ms`: a long one (the
    /// Redis default, 15 s) keeps a frozen master from being failed over during a test.
    pub fn start_with_node_timeout(ms: u64) -> Self {
        let node_timeout = ms.to_string();
        let nodes: Vec<Redis> = (0..6)
            .map(|_| {
                let args: Vec<String> = [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-node-timeout",
                    &node_timeout,
                    "--cluster-config-file",
                    "nodes.conf",
                    // Full syncs start at once (Redis 7 waits 5 s for more replicas).
                    "--repl-diskless-sync-delay",
                    "0",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect();
                Redis::start_custom(None, &args, &[], false)
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
        let ok = poll(PATIENCE, || {
            ports.iter().all(|p| {
                let info = cli(*p, &["cluster", "info"]);
                info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:6")
            }) && ports
                .iter()
                .filter(|p| cli(**p, &["role"]).starts_with("master"))
                .count()
                == 3
                && ports.iter().all(|p| {
                    let role = cli(*p, &["role"]);
                    role.starts_with("master") || role.contains("connected")
                })
        });
        assert!(ok, "cluster ready");
        Self {
            nodes,
            frozen: Vec::new(),
        }
    }

    /// `redis+cluster://` with every node as a seed.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// The port of the master serving the slot of `redis_key`, as `node` sees it.
    pub fn master_of(&self, redis_key: &str) -> u16 {
        for node in self.up() {
            let slot = cli(node.port, &["cluster", "keyslot", redis_key]);
            let Ok(slot) = slot.parse::<u16>() else {
                continue;
            };
            for line in cli(node.port, &["cluster", "nodes"]).lines() {
                let fields: Vec<&str> = line.split(' ').collect();
                if fields.len() < 9 || !fields[2].contains("master") || fields[2].contains("fail") {
                    continue;
                }
                let port = fields[1]
                    .split('@')
                    .next()
                    .and_then(|a| a.rsplit(':').next())
                    .and_then(|p| p.parse::<u16>().ok());
                for range in &fields[8..] {
                    let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                    if let (Ok(lo), Ok(hi)) = (lo.parse::<u16>(), hi.parse::<u16>())
                        && (lo..=hi).contains(&slot)
                        && let Some(port) = port
                    {
                        return port;
                    }
                }
            }
        }
        panic!("no node knows the master of {redis_key}");
    }

    /// A replica of the master on `port`, once the master lists one (on a loaded machine
    /// it may not yet, although the cluster said ok: seen failing a test, and then the
    /// nemesis in CI with 10 s of patience, hence three times that).
    pub fn replica_of(&self, port: u16) -> u16 {
        let node_id = cli(port, &["cluster", "myid"]);
        let find = || {
            let replicas = cli(port, &["cluster", "replicas", &node_id]);
            replicas.split_whitespace().find_map(|f| {
                f.split('@')
                    .next()
                    .and_then(|a| a.rsplit(':').next())
                    .and_then(|p| p.parse().ok())
                    .filter(|p: &u16| self.nodes.iter().any(|n| n.port == *p))
            })
        };
        let mut found = None;
        poll(PATIENCE * 3, || {
            found = find();
            found.is_some()
        });
        found.unwrap_or_else(|| panic!("no replica of the master on {port} listed within 30 s"))
    }

    /// The ports of the three masters, as the nodes see them now.
    pub fn masters(&self) -> Vec<u16> {
        self.up()
            .filter(|n| n.cli(&["role"]).starts_with("master"))
            .map(|n| n.port)
            .collect()
    }

    /// `CLUSTER FAILOVER` on `replica`: a coordinated switch, no write lost.
    pub fn failover(&self, replica: u16) {
        assert_eq!(cli(replica, &["cluster", "failover"]), "OK");
    }

    /// Whether every node that is not frozen sees `port` as a master serving slots.
    pub fn promoted(&self, port: u16) -> bool {
        self.up().all(|n| {
            n.cli(&["cluster", "nodes"]).lines().any(|line| {
                let fields: Vec<&str> = line.split(' ').collect();
                fields.len() > 8
                    && fields[1].starts_with(&format!("127.0.0.1:{port}@"))
                    && fields[2].contains("master")
            })
        })
    }

    /// The nodes neither frozen nor killed.
    fn up(&self) -> impl Iterator<Item = &Redis> {
        (self.nodes.iter()).filter(|n| n.alive() && !self.frozen.contains(&n.pid()))
    }

    /// SIGSTOPs the node on `port` (SIGCONT on drop).
    pub fn freeze(&mut self, port: u16) {
        freeze(&self.nodes, &mut self.frozen, port);
    }

    /// SIGCONTs every frozen node.
    pub fn thaw(&mut self) {
        thaw(&mut self.frozen);
    }

    /// SIGKILLs the node on `port`.
    pub fn kill(&mut self, port: u16) {
        let node = self.nodes.iter_mut().find(|n| n.port == port);
        node.expect("a node").kill();
    }
}

impl Drop for ClusterSetup {
    fn drop(&mut self) {
        self.thaw();
    }
}

/// SIGSTOPs the node of `nodes` on `port` and remembers its pid in `frozen`.
fn freeze(nodes: &[Redis], frozen: &mut Vec<u32>, port: u16) {
    let node = nodes.iter().find(|n| n.port == port).expect("a node");
    let pid = node.pid();
    signal(pid, "STOP");
    frozen.push(pid);
}

/// SIGCONTs every pid in `frozen`.
fn thaw(frozen: &mut Vec<u32>) {
    for pid in frozen.drain(..) {
        signal(pid, "CONT");
    }
}
