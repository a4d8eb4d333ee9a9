//! Resuming a session on this sidecar after the sidecar that served it died: the
//! token's shape, the store's check and claim (`store/sessions.rs`), and the resumed
//! session's start.
//!
//! The token is `session_id.secret`: the secret is the one every owner token of the
//! session carries (`session_id.secret.n`), so the token proves ownership of every
//! grant. Every resume gives the session a new secret, so the old token stops working
//! and the grants' owners change: a sidecar that was only frozen and comes back can
//! neither renew nor release them any more.

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::Stream;

use super::session::{Session, random_secret};
use super::{Engine, EngineError, Event, Inbound};
use crate::store::{Refusal, ResumeClaim, Resumption};

/// The session id and secret of a well-formed token, `None` otherwise: 16 lowercase
/// hex digits (the id), a dot, and 22 characters of URL-safe base64 (128 bits).
fn parse_token(token: &str) -> Option<(&str, &str)> {
    let (id, secret) = token.split_once('.')?;
    let hex = |c: u8| c.is_ascii_digit() || (b'a'..=b'f').contains(&c);
    let base64 = |c: u8| c.is_ascii_alphanumeric() || c == b'-' || c == b'_';
    (id.len() == 16 && id.bytes().all(hex) && secret.len() == 22 && secret.bytes().all(base64))
        .then_some((id, secret))
}

impl Engine {
    /// Resumes the session whose `SessionStarted.resume_token` is `token`, on
    /// `inbound` / `outbound`: the session keeps its id and takes a new secret; its
    /// client first hears `SessionStarted` (a new token), then `Granted` (request id 0)
    /// or `Lost` for each lock its record listed. Refused with
    /// [`EngineError::NotResumable`] when the token is malformed, unknown, expired or
    /// altered (`Unknown`), or its session is attached to a live sidecar (`Attached`);
    /// with
    /// [`EngineError::Unimplemented`] on a store that keeps no session records.
    pub async fn resume_session<S>(
        &self,
        token: &str,
        client_name: String,
        trace: crate::telemetry::TraceContext,
        inbound: S,
        outbound: mpsc::Sender<Event>,
    ) -> Result<(), EngineError>
    where
        S: Stream<Item = Inbound> + Send + Unpin + 'static,
    {
        let store = &self.shared.store;
        if store.keeps_sessions() && !store.outlives_sidecar() {
            // No session of this store has a token: whatever this is, it resumes
            // nothing (as an unknown token).
            return Err(EngineError::NotResumable(Refusal::Unknown));
        }
        if !store.resumes_sessions() {
            return Err(EngineError::Unimplemented(format!(
                "sessions cannot be resumed on this sidecar's store ({})",
                store.kind()
            )));
        }
        let permit = self.session_permit()?;
        let (id, secret) = parse_token(token).ok_or(EngineError::NotResumable(Refusal::Unknown))?;
        match self.shared.live_as(id, secret) {
            // Its stream is open here: as a session attached to a live sidecar.
            Some(true) => return Err(EngineError::NotResumable(Refusal::Attached)),
            // A spent or altered token of a session that runs here.
            Some(false) => return Err(EngineError::NotResumable(Refusal::Unknown)),
            None => {}
        }
        let claim = ResumeClaim {
            session_id: id.to_owned(),
            secret: secret.to_owned(),
            new_secret: random_secret()?,
            sidecar: self.shared.sidecar_id.clone(),
        };
        // Attached before the claim names this sidecar: a session resumed here is
        // never taken from under a live stream.
        store
            .attach(&self.shared.sidecar_id, self.shared.config.attachment_ttl)
            .await?;
        let sent_at = Instant::now();
        let locks = match store.resume(&claim).await? {
            Resumption::Refused(why) => return Err(EngineError::NotResumable(why)),
            Resumption::Claimed(locks) => locks,
        };
        let session = Session::resumed(
            self.shared.clone(),
            client_name,
            outbound,
            claim.session_id,
            claim.new_secret,
            sent_at,
            locks,
        );
        tracing::info!(session = %session.id(), "session resumed");
        self.spawn_session(session, inbound, permit, &trace);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_well_formed_tokens_are_read() {
        let id = "0123456789abcdef";
        let secret = "AAAAAAAAAAAAAAAAAAAA-_";
        assert_eq!(parse_token(&format!("{id}.{secret}")), Some((id, secret)));
        for bad in [
            String::new(),
            ".".into(),
            id.into(),
            format!("{id}."),
            format!("{id}.{secret}x"),
            format!("{id}.{secret}.1"),
            format!("0123456789ABCDEF.{secret}"),
            format!("{id}.AAAAAAAAAAAAAAAAAAAAA="),
            format!("{id}.{}", "é".repeat(11)),
        ] {
            assert_eq!(parse_token(&bad), None, "{bad:?}");
        }
    }
}
