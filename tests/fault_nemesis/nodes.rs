//! What the nemesis does to Redis nodes: freeze and thaw (SIGSTOP/SIGCONT), SIGKILL,
//! restart (empty, or from the last snapshot: an RDB `SAVE`, or a copy of the AOF
//! directory, so the node comes back with *less* than it had), squeeze it to its
//! `maxmemory`, cut its replicas off (`CLIENT KILL TYPE replica`), a coordinated
//! `CLUSTER FAILOVER`; and healing all of it. Blocking: call from blocking threads.

use std::path::Path;

use super::common::Redis;
use super::topology::{Topology, cli};

/// How a killed node comes back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Restore {
    Empty,
    /// From the last snapshot (`Topology::snapshot`); empty if none was taken.
    Snapshot,
}

impl Topology {
    /// Runs `f` on the node serving `port`.
    fn with_node<T>(&self, port: u16, f: impl FnOnce(&mut Redis) -> T) -> T {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let node = inner
            .nodes_mut()
            .iter_mut()
            .find(|n| n.port == port)
            .expect("a node of the topology");
        f(node)
    }

    pub fn freeze(&self, port: u16) {
        if let Some(pid) = self.with_node(port, |n| n.running_pid()) {
            signal(pid, "STOP");
            self.damage.lock().expect("damage").frozen.insert(port);
        }
    }

    pub fn thaw(&self, port: u16) {
        if self.damage.lock().expect("damage").frozen.remove(&port)
            && let Some(pid) = self.with_node(port, |n| n.running_pid())
        {
            signal(pid, "CONT");
        }
    }

    pub fn kill(&self, port: u16) {
        self.damage.lock().expect("damage").frozen.remove(&port);
        self.with_node(port, |n| n.kill());
        self.damage.lock().expect("damage").down.insert(port);
    }

    /// Starts a killed node again on its port, with what `how` leaves in its dir.
    pub fn restart(&self, port: u16, how: Restore) {
        let snapshot = self.snapshots.0.join(port.to_string());
        self.with_node(port, |n| {
            n.kill();
            let dir = n.dir().to_path_buf();
            let aof = dir.join("appendonlydir");
            match how {
                Restore::Empty => {
                    let _ = std::fs::remove_file(dir.join("dump.rdb"));
                    let _ = std::fs::remove_dir_all(&aof);
                }
                // An RDB snapshot is the dump.rdb the last SAVE wrote; an AOF one is
                // the copy made then.
                Restore::Snapshot if snapshot.exists() => {
                    let _ = std::fs::remove_dir_all(&aof);
                    copy_dir(&snapshot, &aof);
                }
                Restore::Snapshot => {}
            }
            n.restart_as_is();
        });
        let mut damage = self.damage.lock().expect("damage");
        damage.down.remove(&port);
        damage.squeezed.remove(&port);
    }

    /// Takes a snapshot of `port`'s data now: `SAVE` (RDB), or a copy of the AOF.
    pub fn snapshot(&self, port: u16) {
        let aof = self.with_node(port, |n| n.dir().join("appendonlydir"));
        if aof.exists() {
            let copy = self.snapshots.0.join(port.to_string());
            let _ = std::fs::remove_dir_all(&copy);
            copy_dir(&aof, &copy);
        } else {
            cli(port, &["save"]);
        }
    }

    /// Sets `port`'s `maxmemory` just above what it uses (`noeviction`: writes that
    /// need more are refused with OOM), or back to none.
    pub fn squeeze(&self, port: u16, on: bool) {
        if on {
            let info = cli(port, &["info", "memory"]);
            let used: u64 = info
                .lines()
                .find_map(|l| l.strip_prefix("used_memory:"))
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or(0);
            cli(
                port,
                &[
                    "config",
                    "set",
                    "maxmemory",
                    &(used + 48 * 1024).to_string(),
                ],
            );
            self.damage.lock().expect("damage").squeezed.insert(port);
        } else {
            cli(port, &["config", "set", "maxmemory", "0"]);
            self.damage.lock().expect("damage").squeezed.remove(&port);
        }
    }

    /// Closes every replica's connection to `port` (the kernel would otherwise still
    /// deliver what was sent into a stopped replica's socket).
    pub fn cut_replicas(&self, port: u16) {
        cli(port, &["client", "kill", "type", "replica"]);
    }

    /// `CLUSTER FAILOVER` on `replica`: a coordinated switch that loses nothing.
    pub fn cluster_failover(&self, replica: u16) {
        cli(replica, &["cluster", "failover"]);
    }

    /// Undoes every damage: thaws, restarts what is down (empty), lifts `maxmemory`.
    pub fn heal(&self) {
        let (frozen, down, squeezed) = {
            let d = self.damage.lock().expect("damage");
            (d.frozen.clone(), d.down.clone(), d.squeezed.clone())
        };
        frozen.iter().for_each(|p| self.thaw(*p));
        down.iter().for_each(|p| self.restart(*p, Restore::Empty));
        squeezed.iter().for_each(|p| self.squeeze(*p, false));
    }
}

/// Thaws every frozen node, so that dropping the topology can kill them.
impl Drop for Topology {
    fn drop(&mut self) {
        let frozen =
            std::mem::take(&mut self.damage.lock().unwrap_or_else(|e| e.into_inner()).frozen);
        for port in frozen {
            if let Some(pid) = self.with_node(port, |n| n.running_pid()) {
                signal(pid, "CONT");
            }
        }
    }
}

/// `kill -SIG PID`; a process already gone is no error.
pub fn signal(pid: u32, sig: &str) {
    let _ = std::process::Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .stderr(std::process::Stdio::null())
        .status();
}

fn copy_dir(from: &Path, to: &Path) {
    let _ = std::fs::create_dir_all(to);
    for entry in std::fs::read_dir(from).into_iter().flatten().flatten() {
        let _ = std::fs::copy(entry.path(), to.join(entry.file_name()));
    }
}
