//! A watch on the client's side: the sidecar's states of one key as a `Stream`.

use std::pin::Pin;

use lockside_proto as proto;
use tokio_stream::{Stream, StreamExt};

use crate::ClientError;
use crate::error::from_status;

/// The states of a watched key, from [`crate::Client::watch`]: each as `describe`
/// answers it. Ends after an error (the sidecar went away or shut down).
pub type WatchStream =
    Pin<Box<dyn Stream<Item = Result<proto::DescribeResponse, ClientError>> + Send>>;

pub(crate) fn from_grpc(responses: tonic::Streaming<proto::WatchResponse>) -> WatchStream {
    Box::pin(responses.map(|response| match response {
        Ok(proto::WatchResponse { state: Some(state) }) => Ok(state),
        Ok(proto::WatchResponse { state: None }) => Err(ClientError::Unavailable(
            "protocol error: a watch message without a state".into(),
        )),
        Err(status) => Err(from_status(&status)),
    }))
}
