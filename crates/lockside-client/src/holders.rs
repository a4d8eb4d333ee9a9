//! The names of the holders a session makes itself: each `lock()` of the Rust and
//! Node clients is a holder of its own ("", the session itself, then "1", "2", ...: a
//! client that holds one lock at a time looks as it did before holders), and a name
//! is given again once
//! nothing of its last user is held or asked for any more. Given again, a name keeps
//! a new lock of the same key on the same holder's queue in the sidecar, behind the
//! release of the last one: the release need not be answered before the next grant
//! of that key is asked for (see `releasing.rs`).

use std::collections::HashMap;

/// The names in use (how many grants and requests use each) and those free again.
#[derive(Debug)]
pub(crate) struct Holders {
    next: u64,
    free: Vec<String>,
    uses: HashMap<String, u32>,
}

impl Default for Holders {
    fn default() -> Self {
        Self {
            next: 0,
            free: vec![String::new()],
            uses: HashMap::new(),
        }
    }
}

impl Holders {
    /// A name nobody in the session uses now.
    pub(crate) fn take(&mut self) -> String {
        let name = self.free.pop().unwrap_or_else(|| {
            self.next += 1;
            self.next.to_string()
        });
        self.uses.insert(name.clone(), 1);
        name
    }

    /// One more use of `name`, if it is one of the session's own (a caller asking
    /// with a lock's holder, to re-enter it).
    pub(crate) fn again(&mut self, name: &str) -> bool {
        match self.uses.get_mut(name) {
            Some(uses) => {
                *uses += 1;
                true
            }
            None => false,
        }
    }

    /// One use of `name` fewer; at none it may be given again.
    pub(crate) fn done(&mut self, name: &str) {
        let Some(uses) = self.uses.get_mut(name) else {
            return;
        };
        *uses = uses.saturating_sub(1);
        if *uses == 0 {
            self.uses.remove(name);
            self.free.push(name.to_owned());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Holders;

    #[test]
    fn a_name_is_given_again_only_once_nothing_uses_it() {
        let mut h = Holders::default();
        let (a, b) = (h.take(), h.take());
        assert_eq!((a.as_str(), b.as_str()), ("", "1"));
        assert!(h.again(&a));
        h.done(&a);
        assert_ne!(h.take(), a, "still used once");
        h.done(&a);
        assert_eq!(h.take(), a);
        assert!(!h.again("mine"), "not one of the session's names");
    }
}
