//! One renewal round of the renewer: the grants due, renewed in one store call, and
//! what each answer does to its grant (moved on, lost, or failing and tried again).

use std::sync::Arc;

use tokio::time::Instant;

use super::failing::Failing;
use super::{Entry, MIN_RETRY, RenewEvent, Task, period};
use crate::metrics::Renewed as Counted;
use crate::store::drift_margin;
use crate::store::{Renewal, Renewed, StoreError};

impl Task {
    /// Renews every grant due within half its renewal period, in one store call.
    pub(super) async fn tick(&mut self) {
        let batch = self.due(Instant::now());
        if batch.is_empty() {
            return;
        }
        let sent_at = Instant::now();
        let result = {
            let renewals: Vec<Renewal<'_>> = (batch.iter())
                .map(|e| Renewal {
                    key: e.key(),
                    owner: &e.owner,
                    ttl: e.ttl,
                })
                .collect();
            // A grant's clock moves the moment its part of the batch is answered: a
            // frozen Cluster master's chunk, answered only at its timeout, holds back
            // no other master's renewals (their sessions' deadline timers read the
            // clocks). The rest of the answer waits for the whole batch, as before.
            let drift = self.drift;
            let early = |i: usize, renewed: &Renewed| {
                if let (Renewed::Extended, Some(e)) = (renewed, batch.get(i)) {
                    e.clock.extend(sent_at + e.ttl - drift_margin(e.ttl, drift));
                }
            };
            self.store.renew_early(&renewals, &early).await
        };
        let done = Instant::now();
        self.metrics
            .renewal_time
            .observe((done - sent_at).as_secs_f64());
        let answers = match result {
            Ok(answers) if answers.len() == batch.len() => answers,
            Ok(answers) => {
                let e = StoreError::Protocol(format!(
                    "{} renewal answers for a batch of {}",
                    answers.len(),
                    batch.len()
                ));
                vec![Renewed::Failed(Arc::new(e)); batch.len()]
            }
            Err(e) => vec![Renewed::Failed(Arc::new(e)); batch.len()],
        };
        self.count(&answers);
        let (mut failing, mut restored) = (Failing::default(), 0);
        let already_failing = self.failing;
        let mut left = batch.len();
        for (mut entry, renewed) in batch.into_iter().zip(answers) {
            left -= 1;
            // Released while the call ran: the session hears nothing more of it, and a
            // renewal that landed is undone. A clock not released takes the extension.
            let ttl = entry.ttl;
            let released = match renewed {
                Renewed::Extended => {
                    !(entry.clock).extend(sent_at + ttl - drift_margin(ttl, self.drift))
                }
                _ => entry.clock.released(),
            };
            if released {
                self.forget(&entry);
                if matches!(renewed, Renewed::Extended) {
                    self.undo(&entry);
                }
                continue;
            }
            match renewed {
                Renewed::Extended => {
                    if entry.failing {
                        entry.failing = false;
                        self.failing = self.failing.saturating_sub(1);
                        restored += 1;
                        entry.event(RenewEvent::Restored);
                    }
                    self.schedule(sent_at + period(ttl), entry, left + 1);
                }
                Renewed::NotHeld => {
                    entry.event(RenewEvent::NotHeld);
                    self.forget(&entry);
                }
                // Only the grants whose part of the batch failed (one frozen Cluster
                // node, too few Redlock masters) are in jeopardy; the others go on.
                Renewed::Failed(e) => {
                    if !entry.failing {
                        failing.add(&e, &entry.name);
                        entry.failing = true;
                        self.failing += 1;
                        entry.event(RenewEvent::Failing);
                    }
                    self.schedule(done + (ttl / 20).max(MIN_RETRY), entry, 1);
                }
            }
        }
        failing.log(already_failing, self.failing, restored);
    }

    /// Counts a batch's answers in the metrics: each failure once per store error (a
    /// failed node's chunk shares one), not once per grant.
    fn count(&self, answers: &[Renewed]) {
        // Failed calls themselves are counted by the metered store; these count grants.
        let mut counts = [0u64; 3];
        for answer in answers {
            match answer {
                Renewed::Extended => counts[0] += 1,
                Renewed::NotHeld => counts[1] += 1,
                Renewed::Failed(_) => counts[2] += 1,
            }
        }
        self.metrics.renewed(Counted::Ok, counts[0]);
        self.metrics.renewed(Counted::NotHeld, counts[1]);
        self.metrics.renewed(Counted::Failed, counts[2]);
    }

    /// Releases a grant whose renewal landed after its session dropped it, so the
    /// store does not keep it for a whole TTL.
    fn undo(&self, entry: &Entry) {
        let (key, owner) = (entry.key().to_owned(), entry.owner.to_string());
        crate::engine::release_in_background(&self.store, key, owner, entry.ttl);
    }
}
