//! An acquire (`lua/acquire.lua`): the one store call that may also list its grant in
//! the session's record (`Store::acquire_listed`), and the replica acknowledgements a
//! grant needs under `--min-replica-acks`.

use std::time::Duration;

use super::RedisStore;
use super::args::{claimed, tail};
use super::replies::{acquired, acquired_listed, ms};
use crate::store::{Acquired, Claim, Listing, Store, StoreError};

impl RedisStore {
    /// An acquire (`lua/acquire.lua`), listing the grant in the session's record where
    /// `listing` is given and this topology can: on one server (a Cluster keeps the
    /// record in another slot) without replica acknowledgements (a grant they refuse is
    /// given back, and its line must not stay).
    pub(super) async fn acquire_with(
        &self,
        claim: &Claim,
        listing: Option<Listing<'_>>,
    ) -> Result<(Acquired, bool), StoreError> {
        let ttl = ms(claim.ttl);
        let tail = tail(claim);
        let claimed = claimed(claim);
        let notice = self.notice(&claim.key);
        let ticket = claim.ticket.map(|t| t.to_string()).unwrap_or_default();
        let listing = listing.filter(|_| !self.link.is_cluster() && self.acks.min == 0);
        let record = listing.map(|l| format!("session/{}", l.session_id));
        let listed = listing.map(|l| {
            let digest = sha1_smol::Sha1::from(l.secret).digest().to_string();
            (digest, format!("{}|{}", l.grant, claim.ttl.as_millis()))
        });
        let (ttl, tail, claimed, notice, ticket) = (&ttl, &tail, &claimed, &notice, &ticket);
        let (record, listed) = (record.as_deref(), &listed);
        // What every acquire sends but its guard (`lua/acquire.lua`).
        let fixed: [&[u8]; 5] = [
            ttl.as_bytes(),
            tail,
            claimed.as_bytes(),
            notice.as_bytes(),
            ticket.as_bytes(),
        ];
        let fixed = &fixed;
        // Not sent while new grants are held off after the store may have lost data.
        let held_off = || {
            self.held_off().unwrap_or(Acquired::Busy {
                expires_in: Duration::ZERO,
                position: 0,
                ticket: 0,
            })
        };
        if self.acks.min == 0 {
            let acquire = &self.scripts.acquire;
            let reply = self.guarded(&claim.key, false, |guard| async move {
                let mut args: Vec<&[u8]> = with_guard(fixed, &guard).to_vec();
                if let (Some(l), Some((digest, line))) = (listing, listed) {
                    args.extend([digest.as_bytes(), l.name.as_bytes(), line.as_bytes()]);
                }
                let call = self.invoke_on(acquire, &claim.key, record, &args, true);
                call.await
            });
            return match reply.await? {
                Some(reply) => acquired_listed(&reply),
                None => Ok((held_off(), false)),
            };
        }
        let acked = self.guarded(&claim.key, false, |guard| async move {
            (self.invoke_acked(
                &self.scripts.acquire,
                &claim.key,
                &with_guard(fixed, &guard),
            ))
            .await
        });
        let Some((reply, acked)) = acked.await? else {
            return Ok((held_off(), false));
        };
        if !acked && let Ok(Acquired::Granted { fence }) = acquired(&reply) {
            // Not on enough replicas: a failover could hand it out again. Undo it
            // rather than hand out a grant that is not safe.
            let _ = self
                .release_grant(&claim.key, &claim.owner, fence, Duration::ZERO)
                .await;
            return Err(StoreError::Unavailable(format!(
                "the grant was not acknowledged by {} replicas within {:?}",
                self.acks.min, self.acks.timeout
            )));
        }
        Ok((acquired(&reply)?, false))
    }
}

/// An acquire's six arguments: `fixed`, with the guard before the ticket.
fn with_guard<'a>(fixed: &[&'a [u8]; 5], guard: &'a [u8]) -> [&'a [u8]; 6] {
    [fixed[0], fixed[1], fixed[2], fixed[3], guard, fixed[4]]
}
