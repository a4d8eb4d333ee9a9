//! A watch on the client's side: the sidecar's states of one key as a `Stream`.

use std::pin::Pin;

use tokio_stream::{Stream, StreamExt};

use super::ClientError;
use super::error::from_status;
use crate::proto;

/// The states of a watched key, from [`super::Client::watch`]: each as `describe`
/// answers it. Ends after an error (the sidecar went away or shut down).
pub type WatchStream =
    Pin<Box<dyn Stream<Item = Result<proto::DescribeResponse, ClientError>> + Send>>;

pub(super) fn from_grpc(responses: tonic::Streaming<proto::WatchResponse>) -> WatchStream {
    Box::pin(responses.map(|response| match response {
        Ok(proto::WatchResponse { state: Some(state) }) => Ok(state),
        Ok(proto::WatchResponse { state: None }) => Err(ClientError::Unavailable(
            "protocol error: a watch message without a state".into(),
        )),
        Err(status) => Err(from_status(&status)),
    }))
}
