//! The gRPC face: the `LockService` implementation. It translates protobuf to engine
//! calls and engine events back to protobuf (`wire.rs`, the only place where engine
//! outcomes become gRPC codes) and holds no lock logic.

use std::pin::Pin;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};

mod decode;
mod wire;
use decode::{decode, trace_context};
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;
use wire::encode;
pub use wire::{reject_code, status};

use crate::engine::{self, Engine, EngineError, Inbound};
use crate::proto;
use crate::proto::limits::{CLIENT_NAME_HEADER, MAX_CLIENT_NAME_BYTES, RESUME_HEADER};
use crate::proto::lock_service_server::LockService;

/// Largest `LeaseRequest` the sidecar answers; larger ones are `Rejected`
/// RESOURCE_EXHAUSTED and the session goes on. No valid request comes near it (a key
/// is at most 512 bytes).
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// Largest message the transport decodes at all. Between [`MAX_REQUEST_BYTES`] and this,
/// a message is rejected but the stream lives; above it, gRPC itself ends the stream
/// with RESOURCE_EXHAUSTED, as it cannot skip a message it refused to read.
pub const MAX_DECODED_BYTES: usize = 4 * 1024 * 1024;

/// Events buffered per session for a client that reads slowly. A client that lets
/// this many answers pile up is not reading at all; its session is ended.
const OUTBOUND_BUFFER: usize = 4096;

/// The `LockService` implementation.
#[derive(Clone, Debug)]
pub struct LockApi {
    engine: Engine,
}

impl LockApi {
    /// Serves `engine`.
    pub fn new(engine: Engine) -> Self {
        Self { engine }
    }
}

/// Who calls, for the log: the client's address over TCP (TLS included), the process
/// and user on the other end of a Unix socket. Nothing secret.
pub fn peer<T>(request: &Request<T>) -> String {
    if let Some(addr) = request.remote_addr() {
        return addr.to_string();
    }
    let unix = request
        .extensions()
        .get::<tonic::transport::server::UdsConnectInfo>();
    match unix.and_then(|u| u.peer_cred) {
        Some(cred) => match cred.pid() {
            Some(pid) => format!("unix (pid {pid}, uid {})", cred.uid()),
            None => format!("unix (uid {})", cred.uid()),
        },
        None if unix.is_some() => "unix".into(),
        None => "unknown".into(),
    }
}

type LeaseStream = Pin<Box<dyn Stream<Item = Result<proto::LeaseResponse, Status>> + Send>>;
type WatchStream = Pin<Box<dyn Stream<Item = Result<proto::WatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl LockService for LockApi {
    type LeaseStream = LeaseStream;
    type WatchStream = WatchStream;

    async fn lease(
        &self,
        request: Request<Streaming<proto::LeaseRequest>>,
    ) -> Result<Response<LeaseStream>, Status> {
        let client_name = request
            .metadata()
            .get(CLIENT_NAME_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(|name| {
                let clean: String = name.chars().filter(|c| !c.is_control()).collect();
                engine::prefix(&clean, MAX_CLIENT_NAME_BYTES).to_owned()
            })
            .unwrap_or_default();
        let trace = trace_context(request.metadata());
        // A header that is not text is no token either: refused like a wrong one.
        let resume = request
            .metadata()
            .get(RESUME_HEADER)
            .map(|v| v.to_str().unwrap_or_default().to_owned());
        let peer = peer(&request);
        let inbound = request.into_inner().map(|message| match message {
            Ok(message) => decode(message),
            Err(status) => Inbound::Broken(status.message().to_owned()),
        });
        let (tx, rx) = mpsc::channel(OUTBOUND_BUFFER);
        match resume {
            None => self.engine.start_session(client_name, trace, inbound, tx),
            Some(token) => {
                let resumed = (self.engine)
                    .resume_session(&token, client_name.clone(), trace, inbound, tx)
                    .await;
                if let Err(EngineError::NotResumable(why)) = &resumed {
                    // The session id only (public: Describe shows it), never the secret.
                    let session = token.split_once('.').map_or("", |(id, _)| id);
                    let session = engine::prefix(session, 16);
                    match why {
                        // A client that retries while its old stream is being noticed
                        // gone: routine.
                        engine::Refusal::Attached => tracing::debug!(%peer, %session, client = %client_name, "not resumed yet: the session is still attached to a live stream"),
                        engine::Refusal::Unknown => tracing::warn!(%peer, %session, client = %client_name, "refused to resume a session: no session has this token (never issued, spent, expired or malformed)"),
                    }
                }
                resumed
            }
        }
        .map_err(status)?;
        let outbound = ReceiverStream::new(rx).map(encode);
        Ok(Response::new(Box::pin(outbound)))
    }

    async fn describe(
        &self,
        request: Request<proto::DescribeRequest>,
    ) -> Result<Response<proto::DescribeResponse>, Status> {
        let trace = trace_context(request.metadata());
        let key = request.into_inner().key;
        let span = tracing::info_span!("describe", key = %engine::prefix(&key, 128));
        crate::telemetry::set_remote_parent(&span, &trace);
        let state = self
            .engine
            .describe(&key)
            .instrument(span)
            .await
            .map_err(status)?;
        Ok(Response::new(wire::describe_response(key, state)))
    }

    async fn watch(
        &self,
        request: Request<proto::WatchRequest>,
    ) -> Result<Response<WatchStream>, Status> {
        let trace = trace_context(request.metadata());
        let key = request.into_inner().key;
        // The span covers the start (the first read); the states after it are not
        // requests of their own.
        let span = tracing::info_span!("watch", key = %engine::prefix(&key, 128));
        crate::telemetry::set_remote_parent(&span, &trace);
        let states = self
            .engine
            .watch(&key)
            .instrument(span)
            .await
            .map_err(status)?;
        // No buffer between the engine and the transport: the stream is polled only
        // when HTTP/2 can take another message, so a slow reader skips states (the
        // engine keeps only the latest) instead of queueing them here.
        // The engine's stream ends right after an error (shutdown).
        let responses = states.map(move |state| wire::watch_response(&key, state));
        Ok(Response::new(Box::pin(responses)))
    }
}
