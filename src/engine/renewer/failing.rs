//! What the log says of failing renewals: one line per store error when renewals start
//! failing, and one when they all succeed again, not a line per retry (failing grants
//! are retried every TTL/20, so a 2 s outage would otherwise print one every few
//! hundred milliseconds, and one per grant: 100,000 lines for a frozen Redis).

use std::sync::Arc;

use crate::store::{StoreError, names};

/// The grants of one tick that went failing, by error: a chunk's grants share its
/// error, so one line per failed call, not one per grant.
#[derive(Default)]
pub(super) struct Failing(Vec<(Arc<StoreError>, usize, Arc<str>)>);

impl Failing {
    pub(super) fn add(&mut self, error: &Arc<StoreError>, key: &Arc<str>) {
        match self.0.iter_mut().find(|(e, ..)| Arc::ptr_eq(e, error)) {
            Some((_, n, _)) => *n += 1,
            None => self.0.push((error.clone(), 1, key.clone())),
        }
    }

    /// Logs a tick: its new failures when none failed before it (`before` grants were
    /// failing, `after` are now), and the end of the streak when its renewals
    /// (`restored` of them after failures) left none failing.
    pub(super) fn log(self, before: usize, after: usize, restored: usize) {
        if before == 0 {
            for (error, grants, key) in self.0 {
                let first_key = names::key_of(&key);
                tracing::warn!(grants, %first_key, error = %error, "renewals failed; retrying until they succeed or the locks' deadlines pass");
            }
        } else if after == 0 && restored > 0 {
            tracing::info!(grants = restored, "renewals succeed again");
        }
    }
}
