//! A minimal Rust client: takes a lock through a Lockside sidecar and holds it until
//! the process is killed. The tests run it as a child process to SIGKILL or SIGSTOP a
//! real client while it holds a lock.
//!
//! Usage: `holder ADDR KEY`; prints `granted TOKEN` once it holds KEY.

use std::io::Write;
use std::time::Duration;

use lockside::proto::lock_service_client::LockServiceClient;
use lockside::proto::{Acquire, LeaseRequest, lease_request, lease_response};
use tokio_stream::StreamExt;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(addr), Some(key)) = (args.next(), args.next()) else {
        return Err("usage: holder ADDR KEY".into());
    };
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        // Notice a frozen sidecar well within the TTL (docs/protocol.md, "Client guidance").
        .http2_keep_alive_interval(Duration::from_secs(1))
        .keep_alive_timeout(Duration::from_secs(1))
        .connect()
        .await?;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut events = LockServiceClient::new(channel)
        .lease(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    tx.send(LeaseRequest {
        command: Some(lease_request::Command::Acquire(Acquire {
            request_id: 1,
            key,
            wait_timeout: Some(prost_types::Duration {
                seconds: 30,
                nanos: 0,
            }),
            ..Default::default()
        })),
    })
    .await?;
    while let Some(response) = events.next().await {
        match response?.event {
            Some(lease_response::Event::Granted(g)) => {
                println!("granted {}", g.fencing_token);
                std::io::stdout().flush()?;
            }
            // Any stream error or Lost means: stop using the resource.
            Some(lease_response::Event::Lost(l)) => return Err(format!("lost {}", l.key).into()),
            _ => {}
        }
    }
    Err("the stream ended".into())
}
