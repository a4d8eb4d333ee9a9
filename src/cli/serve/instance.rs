//! `--instance` and `--instance-dir`: a sidecar's stable name, and the proof that no
//! other process runs under it.
//!
//! A sidecar restarted in place (the same pod and container: the kubelet restarts a
//! crashed native sidecar on the same address) would otherwise wait for its dead
//! predecessor's attachment to expire before resuming the sessions it served. With a
//! stable name it has the same id in the store as its predecessor, and it may take
//! their sessions over at once, but only if it knows the predecessor is gone: it takes
//! an exclusive `flock` on `DIR/NAME.lock` (a pod-local directory, such as an
//! `emptyDir` that outlives container restarts). The kernel releases the lock when a
//! process dies, whatever kills it; a second live process under the same name is
//! refused at start.

use std::fs::File;
use std::path::Path;

use rustix::fs::{FlockOperation, flock};

/// The longest instance name.
const MAX_NAME: usize = 64;

/// An instance name held by this process: the lock lasts as long as this value.
#[derive(Debug)]
pub struct Instance {
    pub(super) name: String,
    _lock: File,
}

/// Checks `name` and takes the lock of instance `name` in `dir`.
pub fn take(name: &str, dir: &Path) -> Result<Instance, String> {
    check(name)?;
    let path = dir.join(format!("{name}.lock"));
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("--instance-dir: cannot open {}: {e}", path.display()))?;
    flock(&file, FlockOperation::NonBlockingLockExclusive).map_err(|e| {
        format!(
            "--instance {name}: another process holds {} ({e}); each sidecar needs a \
             name of its own (one per pod and container)",
            path.display()
        )
    })?;
    Ok(Instance {
        name: name.to_owned(),
        _lock: file,
    })
}

/// A name that fits a file name and a Redis key: 1 to 64 of `A-Z a-z 0-9 . _ -`.
fn check(name: &str) -> Result<(), String> {
    let fits = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if name.is_empty() || name.len() > MAX_NAME || !name.chars().all(fits) || name.starts_with('.')
    {
        return Err(format!(
            "--instance {name:?}: 1 to {MAX_NAME} letters, digits, '.', '_' or '-' (not \
             starting with '.'), e.g. the pod's UID"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(check("0b3c6f6e-2f7a-4c1e-9a51-3f8a2d0c9e11").is_ok());
        for bad in ["", ".hidden", "a/b", "a b", "{x}", &"n".repeat(65)] {
            assert!(check(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn one_process_holds_a_name_at_a_time() {
        let dir = std::env::temp_dir().join(format!("lockside-instance-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let first = take("pod-1", &dir).expect("first");
        // flock locks belong to the open file: a second open is a second holder.
        let second = take("pod-1", &dir).expect_err("taken");
        assert!(second.contains("another process holds"), "{second}");
        drop(first);
        take("pod-1", &dir).expect("free again once the holder is gone");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
