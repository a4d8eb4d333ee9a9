//! Traces: the real binary, configured by the standard OpenTelemetry variables,
//! exports its spans to an OTLP collector running in this test, as children of the
//! caller's W3C trace context.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use common::{PATIENCE, SidecarProcess, acquire, secs};
use lockside::proto::lock_service_client::LockServiceClient;
use lockside::proto::{LeaseRequest, lease_request, lease_response};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use tokio::sync::{Notify, mpsc};
use tokio_stream::wrappers::ReceiverStream;

/// A span as the collector received it.
#[derive(Clone, Debug)]
struct Received {
    service: String,
    name: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    attributes: HashMap<String, String>,
}

#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<Received>>>,
    arrived: Arc<Notify>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(value: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().expect("spans");
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .map(|kv| text(kv.value.as_ref()))
                .unwrap_or_default();
            for span in resource_spans.scope_spans.into_iter().flat_map(|s| s.spans) {
                spans.push(Received {
                    service: service.clone(),
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    attributes: span
                        .attributes
                        .iter()
                        .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
                        .collect(),
                });
            }
        }
        self.arrived.notify_waiters();
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Collector {
    /// Starts the collector on a free loopback port; returns its endpoint.
    async fn start(&self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind collector");
        let endpoint = format!("http://{}", listener.local_addr().expect("addr"));
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let service = TraceServiceServer::new(self.clone());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(incoming),
        );
        endpoint
    }

    /// Waits until `count` spans named `name` have arrived.
    async fn wait_for(&self, name: &str, count: usize) -> Vec<Received> {
        let found = async {
            loop {
                let arrived = self.arrived.notified();
                let spans: Vec<_> = self.spans.lock().expect("spans").clone();
                if spans.iter().filter(|s| s.name == name).count() >= count {
                    return spans;
                }
                arrived.await;
            }
        };
        tokio::time::timeout(PATIENCE, found)
            .await
            .unwrap_or_else(|_| panic!("{count} {name} spans did not arrive"))
    }
}

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";
const OP_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const OP_SPAN: &str = "b7ad6b7169203331";

struct Stream {
    tx: mpsc::Sender<LeaseRequest>,
    rx: tonic::Streaming<lockside::proto::LeaseResponse>,
}

impl Stream {
    async fn open(addr: &str, traceparent: Option<String>) -> Self {
        let mut grpc = LockServiceClient::connect(format!("http://{addr}"))
            .await
            .expect("connect");
        let (tx, rx) = mpsc::channel(16);
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        if let Some(tp) = traceparent {
            let value = tp.parse().expect("ascii");
            request.metadata_mut().insert("traceparent", value);
        }
        let rx = grpc.lease(request).await.expect("lease").into_inner();
        let mut stream = Self { tx, rx };
        stream.next().await; // SessionStarted
        stream
    }

    async fn send(&self, command: lease_request::Command) {
        let request = LeaseRequest {
            command: Some(command),
        };
        self.tx.send(request).await.expect("send");
    }

    async fn next(&mut self) -> lease_response::Event {
        let next = tokio::time::timeout(PATIENCE, self.rx.message()).await;
        let message = next
            .expect("an event in time")
            .expect("stream")
            .expect("open");
        message.event.expect("an event")
    }

    async fn granted(&mut self) -> u64 {
        loop {
            match self.next().await {
                lease_response::Event::Granted(g) => return g.fencing_token,
                lease_response::Event::Waiting(_) => continue,
                other => panic!("expected Granted, got {other:?}"),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_the_collector_as_children_of_the_callers_trace() {
    let collector = Collector::default();
    let endpoint = collector.start().await;
    let mut sidecar = SidecarProcess::launch(
        "memory",
        "traces",
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_SERVICE_NAME", "lockside-under-test"),
        ],
        None,
    );
    let caller = format!("00-{TRACE}-{CALLER_SPAN}-01");
    let mut holder = Stream::open(&sidecar.addr, Some(caller)).await;
    holder
        .send(lease_request::Command::Acquire(acquire("orders")))
        .await;
    let first_token = holder.granted().await;
    // An acquire with its own operation's trace context.
    let mut own = acquire("invoices");
    own.request_id = 2;
    own.traceparent = format!("00-{OP_TRACE}-{OP_SPAN}-01");
    holder.send(lease_request::Command::Acquire(own)).await;
    holder.granted().await;
    // A second session waits for "orders" until the holder lets go.
    let mut waiter = Stream::open(&sidecar.addr, None).await;
    let mut wait = acquire("orders");
    wait.wait_timeout = Some(secs(10.0));
    waiter.send(lease_request::Command::Acquire(wait)).await;
    assert!(matches!(
        waiter.next().await,
        lease_response::Event::Waiting(_)
    ));
    let release = lockside::proto::Release {
        request_id: 3,
        key: "orders".into(),
        holder: String::new(),
    };
    holder.send(lease_request::Command::Release(release)).await;
    let second_token = waiter.granted().await;
    drop((holder, waiter));
    // SIGTERM: the sidecar flushes its spans before it exits.
    assert!(sidecar.terminate().await.success());

    let spans = collector.wait_for("acquire", 3).await;
    let sessions: Vec<_> = spans.iter().filter(|s| s.name == "session").collect();
    assert!(spans.iter().all(|s| s.service == "lockside-under-test"));
    let traced = sessions
        .iter()
        .find(|s| s.trace_id == TRACE)
        .expect("the holder's session span is in the caller's trace");
    assert_eq!(
        traced.parent_span_id, CALLER_SPAN,
        "child of the caller's span"
    );
    let acquires = |key: &str| -> Vec<&Received> {
        spans
            .iter()
            .filter(|s| {
                s.name == "acquire" && s.attributes.get("key").map(String::as_str) == Some(key)
            })
            .collect()
    };
    let orders = acquires("orders");
    let first = orders
        .iter()
        .find(|s| s.trace_id == TRACE)
        .expect("the holder's acquire");
    assert_eq!(
        first.parent_span_id, traced.span_id,
        "a child of its session"
    );
    assert_eq!(first.attributes["outcome"], "granted");
    assert_eq!(first.attributes["mode"], "exclusive");
    assert_eq!(first.attributes["fencing_token"], first_token.to_string());
    let waited = orders
        .iter()
        .find(|s| s.trace_id != TRACE)
        .expect("the waiter's acquire");
    assert_eq!(waited.attributes["outcome"], "granted");
    assert_eq!(waited.attributes["fencing_token"], second_token.to_string());
    // Unfair waiters have no place in a queue: position 0 (see Waiting.position).
    assert_eq!(waited.attributes["queue_position"], "0");
    assert!(waited.attributes.contains_key("waited_ms"));
    let invoices = acquires("invoices");
    let [invoice] = invoices.as_slice() else {
        panic!("one invoices acquire: {invoices:?}");
    };
    assert_eq!(invoice.trace_id, OP_TRACE, "in the operation's own trace");
    assert_eq!(invoice.parent_span_id, OP_SPAN);
}
