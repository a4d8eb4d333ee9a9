//! The floor under the sidecar's CPU per cycle: a `LockService` built from the same
//! crates as the sidecar (tonic's server on a current-thread runtime; redis-rs'
//! multiplexed connection) that answers every `Acquire` with `Granted` and every
//! `Release` with `Released` and does nothing else: no engine, no store logic, no
//! renewal, no metrics, no logs. With a Redis URL it first runs one EVALSHA (the
//! classic compare-and-delete script) per request, so it makes the same system calls
//! per cycle as the sidecar on Redis: four writes, four reads, four waits.
//!
//! It runs as a process of its own (this bench binary, re-executed as
//! `floor-serve ADDR [REDIS_URL]`), driven by the same client and measured the same way
//! as the sidecar, so the cost phase can say how much of the sidecar's CPU per cycle is
//! Lockside's own and how much the stack's: a target below the floor cannot be met by
//! trimming Lockside's code.

use std::pin::Pin;
use std::process::Stdio;

use deadpool_redis::redis::{self, Script, aio::MultiplexedConnection};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

use super::context::err;
use super::load::{Burn, burn};
use super::process::{free_port, wait_ready};
use lockside::proto::lease_request::Command as Cmd;
use lockside::proto::lease_response::Event as E;
use lockside::proto::lock_service_server::{LockService, LockServiceServer};
use lockside::proto::{
    DescribeRequest, DescribeResponse, Granted, LeaseRequest, LeaseResponse, Released,
    SessionStarted, WatchRequest, WatchResponse,
};

/// The first argument that makes this binary a floor server instead of the bench.
pub(crate) const FLOOR_SERVE: &str = "floor-serve";
/// The key the floor's script reads (it never exists: the script's work is a GET, as
/// in a release that finds the key gone).
const FLOOR_KEY: &str = "lockside-bench-floor";
/// The classic compare-and-delete, as the cost phase's release.
const SCRIPT: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then \
     return redis.call('del', KEYS[1]) else return 0 end";

/// A floor server process; killed when dropped.
pub(crate) struct Floor {
    child: Child,
}

impl Floor {
    /// Starts a floor server on a free loopback port (with `redis`, one EVALSHA on it
    /// per request) and connects to it.
    pub(crate) async fn start(redis: Option<&str>) -> Result<(Self, Channel), String> {
        let addr = format!("127.0.0.1:{}", free_port()?);
        let exe = std::env::current_exe().map_err(err("the bench's own path"))?;
        let mut command = Command::new(exe);
        command
            .args([FLOOR_SERVE, &addr])
            .args(redis)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true);
        let mut child = command.spawn().map_err(err("spawning the floor"))?;
        let channel = wait_ready(&addr, &mut child).await?;
        Ok((Self { child }, channel))
    }

    /// Its process id, for its CPU time.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.id()
    }
}

/// The floor's CPU per cycle (see [`super::harness::floor`]; with `redis`, one EVALSHA per
/// request), by the same client as the sidecar's.
pub(crate) async fn floor_cycles(
    redis: Option<&str>,
    key: &str,
    cycles: u64,
) -> Result<Burn, String> {
    let (floor, channel) = Floor::start(redis).await?;
    let pid = floor.pid().ok_or("the floor exited at once")?;
    burn(channel, key, pid, cycles).await
}

/// `floor-serve ADDR [REDIS_URL]`: serves until killed.
pub(crate) fn serve(args: &[String]) -> std::process::ExitCode {
    let failed = |e: String| {
        eprintln!("floor: {e}");
        std::process::ExitCode::FAILURE
    };
    let Some(addr) = args.first().and_then(|a| a.parse().ok()) else {
        return failed("usage: floor-serve HOST:PORT [REDIS_URL]".into());
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return failed(e.to_string()),
    };
    let result = runtime.block_on(async move {
        let connection = match args.get(1) {
            None => None,
            Some(url) => {
                let client = redis::Client::open(url.as_str()).map_err(|e| e.to_string())?;
                Some(
                    client
                        .get_multiplexed_async_connection()
                        .await
                        .map_err(|e| e.to_string())?,
                )
            }
        };
        let service = LockServiceServer::new(Echo {
            connection,
            script: Script::new(SCRIPT),
        });
        // Without the sidecar's HTTP/2 keep-alive: with it (10 s, 20 s) the floor
        // measured the same (59.6 and 145 µs against 62-69 and 122-152 without).
        tonic::transport::Server::builder()
            .add_service(service)
            .serve(addr)
            .await
            .map_err(|e| e.to_string())
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => failed(e),
    }
}

type Answers<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// The service: answers and, with a connection, one script call per request.
struct Echo {
    connection: Option<MultiplexedConnection>,
    script: Script,
}

#[tonic::async_trait]
impl LockService for Echo {
    type LeaseStream = Answers<LeaseResponse>;
    type WatchStream = Answers<WatchResponse>;

    async fn lease(
        &self,
        request: Request<Streaming<LeaseRequest>>,
    ) -> Result<Response<Self::LeaseStream>, Status> {
        let (tx, rx) = mpsc::channel(64);
        let mut requests = request.into_inner();
        let mut connection = self.connection.clone();
        let script = self.script.clone();
        tokio::spawn(async move {
            let started = E::Started(SessionStarted {
                session_id: "floor".into(),
                default_ttl: Some(prost_types::Duration {
                    seconds: 10,
                    nanos: 0,
                }),
                ..Default::default()
            });
            if tx.send(Ok(answer(started))).await.is_err() {
                return;
            }
            while let Some(Ok(request)) = requests.next().await {
                let event = match request.command {
                    Some(Cmd::Acquire(a)) => E::Granted(Granted {
                        request_id: a.request_id,
                        key: a.key,
                        fencing_token: 1,
                        hold_count: 1,
                        ..Default::default()
                    }),
                    Some(Cmd::Release(r)) => E::Released(Released {
                        request_id: r.request_id,
                        key: r.key,
                        hold_count: 0,
                        ..Default::default()
                    }),
                    _ => continue,
                };
                if let Some(connection) = connection.as_mut() {
                    let called: redis::RedisResult<i64> = script
                        .key(FLOOR_KEY)
                        .arg("floor")
                        .invoke_async(connection)
                        .await;
                    if let Err(e) = called {
                        let _ = tx.send(Err(Status::unavailable(e.to_string()))).await;
                        return;
                    }
                }
                if tx.send(Ok(answer(event))).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn describe(
        &self,
        _: Request<DescribeRequest>,
    ) -> Result<Response<DescribeResponse>, Status> {
        Err(Status::unimplemented("the floor keeps no locks"))
    }

    async fn watch(&self, _: Request<WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("the floor keeps no locks"))
    }
}

fn answer(event: E) -> LeaseResponse {
    LeaseResponse { event: Some(event) }
}
