//! A `redis-server` on a free loopback port, started for a test and killed on drop.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{PATIENCE, TempDir, free_port};

/// The password of the harness's `admin` user ([`Redis::start_with_acl`]).
pub const ADMIN_PASSWORD: &str = "admin-pa55-Kd2";
/// The password of the least-privilege `lockside` user ([`Redis::least_privilege`]).
pub const LOCKSIDE_PASSWORD: &str = "lockside-pa55-Vb9";

/// The ACL rules of the least-privilege user, as the docs give them (the line
/// `ACL SETUSER lockside ...`), for `namespace` and `password`: the documented line is
/// the one tested.
pub fn least_privilege_rules(namespace: &str, password: &str) -> Vec<String> {
    // The README, or the docs page the line moved to.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let pages = std::fs::read_dir(root.join("docs"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .chain([root.join("README.md")]);
    let docs: String = pages
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .collect();
    let line = docs
        .lines()
        .find_map(|l| l.strip_prefix("ACL SETUSER lockside "))
        .expect("the docs give `ACL SETUSER lockside ...`");
    line.split_whitespace()
        .map(|rule| {
            rule.replace("{lockside:", &format!("{{{namespace}:"))
                .replace(">PASSWORD", &format!(">{password}"))
        })
        .collect()
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

    /// A server whose default user is off: only ACL users log in (add them with
    /// [`Redis::set_user`]), and the harness's own `redis-cli` runs as `admin`, who may
    /// do everything.
    pub fn start_with_acl() -> Self {
        let words = |w: &[&str]| w.iter().map(|w| w.to_string()).collect::<Vec<_>>();
        let admin = format!(">{ADMIN_PASSWORD}");
        let server = words(&[
            "--user", "default", "off", "--user", "admin", "on", &admin, "~*", "&*", "+@all",
        ]);
        let cli = words(&[
            "--user",
            "admin",
            "--pass",
            ADMIN_PASSWORD,
            "--no-auth-warning",
        ]);
        Self::start_custom(None, &server, &cli, false)
    }

    /// `ACL SETUSER name rules...` (as admin, on a server from [`Redis::start_with_acl`]).
    pub fn set_user(&self, name: &str, rules: &[String]) {
        let mut args = vec!["ACL", "SETUSER", name];
        args.extend(rules.iter().map(String::as_str));
        assert_eq!(self.cli(&args), "OK", "ACL SETUSER {name} {rules:?}");
    }

    /// A server whose only user for Lockside is the least-privilege user the README
    /// documents (Security, "Least privilege on Redis"), for `namespace`; and the store
    /// URL that logs in as it.
    pub fn least_privilege(namespace: &str) -> (Self, String) {
        let redis = Self::start_with_acl();
        redis.set_user(
            "lockside",
            &least_privilege_rules(namespace, LOCKSIDE_PASSWORD),
        );
        let url = format!(
            "redis://lockside:{LOCKSIDE_PASSWORD}@127.0.0.1:{}",
            redis.port
        );
        (redis, url)
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

    /// Connections the server has accepted so far (`total_connections_received`), the
    /// `redis-cli` that asks among them: between two readings, one is the second
    /// reading's own.
    pub fn connections_received(&self) -> u64 {
        self.cli(&["INFO", "stats"])
            .lines()
            .find_map(|line| line.strip_prefix("total_connections_received:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("total_connections_received")
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
        let _ = std::fs::remove_file(self.dir.0.join("dump.rdb"));
        self.start_again();
    }

    /// Starts it again on the same port from its last snapshot (`SAVE`), as Redis'
    /// default configuration does after a crash: what came after the snapshot is lost.
    pub fn restart_from_snapshot(&mut self) {
        self.kill();
        assert!(
            self.dir.0.join("dump.rdb").exists(),
            "no snapshot was taken"
        );
        self.start_again();
    }

    /// Starts it again on the same port with whatever its [`Redis::dir`] holds (a
    /// `dump.rdb`, an AOF), as a crashed server's supervisor would.
    pub fn restart_as_is(&mut self) {
        self.kill();
        self.start_again();
    }

    fn start_again(&mut self) {
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

    /// Whether the server runs (it was not killed).
    pub fn alive(&self) -> bool {
        self.child.is_some()
    }

    /// Its pid while it runs (not killed).
    pub fn running_pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Its `--dir`: where `SAVE` writes `dump.rdb` and `appendonly yes` its AOF, read
    /// again by [`Redis::restart`].
    pub fn dir(&self) -> &std::path::Path {
        &self.dir.0
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}
