//! The processes of a round besides Redis: real `lockside serve` sidecars (on fixed
//! ports, so a killed one restarts where its clients' proxy points; one with
//! `--instance`; some under libfaketime) and the client processes (this binary's
//! `client` role, and the Python package). Each runs in a process group of its own and
//! is killed (after a SIGCONT) when dropped, also when the test panics.

use std::io::{BufRead, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::history::{Event, now_ns};
use super::nodes::signal;
use super::plan::WorkerArgs;

/// Debian's libfaketime (`.ci/run` installs the `faketime` package).
fn libfaketime() -> PathBuf {
    std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|arch| arch.path().join("faketime/libfaketime.so.1"))
        .chain([PathBuf::from("/usr/lib/faketime/libfaketime.so.1")])
        .find(|p| p.exists())
        .expect("libfaketime must be installed (.ci/run installs the faketime package)")
}

/// A `lockside serve` process on a fixed loopback port.
pub struct SidecarProc {
    pub name: String,
    pub port: u16,
    args: Vec<String>,
    env: Vec<(String, String)>,
    log: PathBuf,
    child: Option<Child>,
}

impl SidecarProc {
    /// Not started yet; `flags` go after `serve --listen ADDR`; `rate` (≠ 1) runs it
    /// under libfaketime at that clock rate.
    pub fn new(name: &str, flags: Vec<String>, rate: f64, log_dir: &Path) -> Self {
        let env = match rate == 1.0 {
            true => vec![],
            false => vec![
                (
                    "LD_PRELOAD".into(),
                    libfaketime().to_string_lossy().into_owned(),
                ),
                ("FAKETIME".into(), format!("+0 x{rate}")),
                // Without it libfaketime reads FAKETIME once every 10 s only.
                ("FAKETIME_NO_CACHE".into(), "1".into()),
            ],
        };
        Self {
            name: name.to_owned(),
            port: super::common::free_port(),
            args: flags,
            env,
            log: log_dir.join(format!("{name}.log")),
            child: None,
        }
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Starts it on its port (retrying while the port is still taken); false if it
    /// did not come up.
    pub fn start(&mut self) -> bool {
        for _ in 0..50 {
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.log);
            let mut child = Command::new(env!("CARGO_BIN_EXE_lockside"))
                .args(["serve", "--listen", &self.addr()])
                .args(&self.args)
                .envs(self.env.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log.map(Stdio::from).unwrap_or_else(|_| Stdio::null()))
                .process_group(0)
                .spawn()
                .expect("spawn lockside serve");
            let deadline = std::time::Instant::now() + super::common::PATIENCE;
            while std::time::Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break; // the port is still taken, or the flags are refused
                }
                if std::net::TcpStream::connect(self.addr()).is_ok() {
                    std::thread::sleep(Duration::from_millis(20));
                    if let Ok(None) = child.try_wait() {
                        self.child = Some(child);
                        return true;
                    }
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn log(&self) -> &Path {
        &self.log
    }
}

impl Drop for SidecarProc {
    fn drop(&mut self) {
        if let Some(pid) = self.pid() {
            signal(pid, "CONT");
        }
        self.kill();
    }
}

/// Events as the test process gathers them from every client process.
pub type Events = Arc<Mutex<Vec<Event>>>;

/// A client process; a killed one is started again as its next incarnation.
pub struct ClientProc {
    pub name: String,
    pub python: bool,
    pub incarnation: u32,
    pub args: WorkerArgs,
    events: Events,
    log_dir: PathBuf,
    child: Option<Child>,
    stdin: Option<ChildStdin>,
}

/// The venv `clients/prepare.sh` installs the Python package into.
pub fn venv_python() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = root.join("target/clients/venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: build the clients first (bash clients/prepare.sh; `bash .ci/run` does it)",
        python.display()
    );
    python
}

impl ClientProc {
    pub fn new(name: &str, python: bool, args: WorkerArgs, events: Events, log_dir: &Path) -> Self {
        Self {
            name: name.to_owned(),
            python,
            incarnation: 0,
            args,
            events,
            log_dir: log_dir.to_owned(),
            child: None,
            stdin: None,
        }
    }

    /// The id its events carry now (`r0#2`: its second run).
    pub fn id(&self) -> String {
        format!("{}#{}", self.name, self.incarnation)
    }

    /// Starts the next incarnation.
    pub fn start(&mut self) {
        self.incarnation += 1;
        self.args.id = self.id();
        self.args.seed = self.args.seed.wrapping_add(7919);
        let mut command = match self.python {
            true => {
                let script =
                    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/clients/nemesis.py");
                let mut c = Command::new(venv_python());
                c.arg(script);
                c
            }
            false => {
                // This very binary, also when a rebuild replaced its file meanwhile.
                let mut c = Command::new("/proc/self/exe");
                c.arg("client");
                c
            }
        };
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_dir.join(format!("{}.log", self.name)));
        let mut child = command
            .args(self.args.to_args())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr.map(Stdio::from).unwrap_or_else(|_| Stdio::null()))
            .process_group(0)
            .spawn()
            .expect("spawn a client process");
        let stdout = child.stdout.take().expect("stdout");
        let events = self.events.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if let Ok(event) = serde_json::from_str::<Event>(&line) {
                    events.lock().unwrap_or_else(|e| e.into_inner()).push(event);
                }
            }
        });
        self.stdin = child.stdin.take();
        self.child = Some(child);
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Tells it the faults have healed: no more long holds.
    pub fn calm(&mut self) {
        if let Some(stdin) = self.stdin.as_mut() {
            let _ = stdin.write_all(b"calm\n");
            let _ = stdin.flush();
        }
    }

    /// Closes its stdin (it releases and exits) and waits up to `limit`; kills it after.
    pub fn stop(&mut self, limit: Duration) {
        self.stdin = None;
        let deadline = std::time::Instant::now() + limit;
        while let Some(child) = self.child.as_mut() {
            if !matches!(child.try_wait(), Ok(None)) || std::time::Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
    }

    /// SIGKILLs its process group; returns when.
    pub fn kill(&mut self) -> u64 {
        if let Some(mut child) = self.child.take() {
            signal(child.id(), "CONT");
            let _ = rustix::process::kill_process_group(
                rustix::process::Pid::from_raw(child.id() as i32).expect("a pid"),
                rustix::process::Signal::KILL,
            );
            let _ = child.kill();
            let _ = child.wait();
        }
        self.stdin = None;
        now_ns()
    }
}

impl Drop for ClientProc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Kills every child process of this one that is still there (SIGCONT, then SIGKILL),
/// by pid: the last line of defence when a panic kept a round from being dropped (a
/// task still holding it). Returns how many there were.
pub fn reap_children() -> usize {
    let mut pids = Vec::new();
    for task in std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
    {
        if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
            pids.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            );
        }
    }
    for pid in &pids {
        if let Some(pid) = rustix::process::Pid::from_raw(*pid) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::CONT);
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
    pids.len()
}
