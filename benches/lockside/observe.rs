//! Phase 7 (`observe`): what observability costs. Two more sidecars on the same Redis,
//! one with traces exported to an OTLP sink in this process and its `/metrics` scraped
//! every second, one with neither (no traces, no admin listener; the metric counters
//! themselves are always kept: they are a few atomic adds per lock). Uncontended
//! cycles alternate between the two in short rounds, so that drift in the machine's
//! load falls on both alike.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::harness::args::BenchArgs;
use super::harness::context::err;
use super::harness::load::cycles;
use super::harness::process::{Sidecar, free_port};
use super::harness::report::{Report, Stats, us};
use super::harness::rows::{Row, Rule};
use super::harness::session::Session;

const P50: Row = Row::new(
    "observe_p50_us",
    "cycle, traces+metrics on (vs off): p50 (µs)",
)
.target("≤ 1.10× off", Rule::RatioAtMost(1.10));
const P99: Row = Row::new(
    "observe_p99_us",
    "cycle, traces+metrics on (vs off): p99 (µs)",
);
const PER_S: Row = Row::new(
    "observe_per_s",
    "cycle, traces+metrics on (vs off): cycles/s",
);
const SPANS: Row = Row::new(
    "observe_spans",
    "traces on: spans received by the OTLP sink",
);

/// The lines of the table this phase fills, in order; the baseline column is a
/// sidecar with neither traces nor metrics.
pub(super) const ROWS: &[Row] = &[P50, P99, PER_S, SPANS];

/// Rounds per sidecar; each is a tenth of `--seconds`, at least 300 ms.
const ROUNDS: u32 = 10;
/// How often the observed sidecar's /metrics is scraped, as Prometheus would.
const SCRAPE: Duration = Duration::from_secs(1);

/// An OTLP trace service that counts what it receives.
#[derive(Clone, Default)]
struct Sink(Arc<AtomicU64>);

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let spans = request
            .into_inner()
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .map(|s| s.spans.len() as u64)
            .sum::<u64>();
        self.0.fetch_add(spans, Ordering::Relaxed);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// Runs phase 7 and records its lines.
pub(super) async fn run(args: &BenchArgs, tag: &str, report: &mut Report) -> Result<(), String> {
    eprintln!("bench: phase 7: traces and metrics on vs off, uncontended cycles");
    let stop = CancellationToken::new();
    let sink = Sink::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(err("OTLP sink"))?;
    let endpoint = format!(
        "http://{}",
        listener.local_addr().map_err(err("OTLP sink"))?
    );
    let serving = tonic::transport::Server::builder()
        .add_service(TraceServiceServer::new(sink.clone()))
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener),
            stop.clone().cancelled_owned(),
        );
    tokio::spawn(serving);
    let admin = format!("127.0.0.1:{}", free_port()?);
    let (observed, observed_channel) = Sidecar::spawn(args, tag, &admin, Some(&endpoint)).await?;
    let (plain, plain_channel) = Sidecar::spawn(args, tag, "none", None).await?;
    tokio::spawn(scrape(admin, stop.clone()));

    let result = async {
        let mut on = Session::open(observed_channel).await?;
        let mut off = Session::open(plain_channel).await?;
        let round = (Duration::from_secs(args.seconds) / ROUNDS).max(Duration::from_millis(300));
        let (mut on_samples, mut off_samples) = (Vec::new(), Vec::new());
        let (mut on_time, mut off_time) = (Duration::ZERO, Duration::ZERO);
        let key = format!("{}/observe", super::harness::context::namespace(tag));
        for _ in 0..ROUNDS {
            let start = Instant::now();
            on_samples.extend(cycles(&mut on, &key, start + round).await?);
            on_time += start.elapsed();
            let start = Instant::now();
            off_samples.extend(cycles(&mut off, &key, start + round).await?);
            off_time += start.elapsed();
        }
        let on = Stats::new(on_samples, on_time, "observed cycles")?;
        let off = Stats::new(off_samples, off_time, "plain cycles")?;
        Ok::<_, String>((on, off))
    }
    .await;
    let mut notes: Vec<String> = Vec::new();
    notes.extend(observed.stop().await);
    notes.extend(plain.stop().await);
    stop.cancel();
    let (on, off) = result?;
    report.put(&P50, us(on.p50), us(off.p50));
    report.put(&P99, us(on.p99), us(off.p99));
    report.put(&PER_S, Some(on.rate), Some(off.rate));
    // After stop(): the observed sidecar flushed its last spans on SIGTERM.
    report.put(&SPANS, Some(sink.0.load(Ordering::Relaxed) as f64), None);
    report.notes.push(
        "observability lines: the sidecar column has traces exported to an OTLP sink and \
         /metrics scraped every second, the direct column is a sidecar with neither"
            .into(),
    );
    report.notes.extend(notes);
    Ok(())
}

/// GETs /metrics from `admin` every [`SCRAPE`] until `stop`.
async fn scrape(admin: String, stop: CancellationToken) {
    let get = async |admin: &str| -> std::io::Result<usize> {
        let mut conn = tokio::net::TcpStream::connect(admin).await?;
        conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: bench\r\n\r\n")
            .await?;
        let mut body = Vec::new();
        conn.read_to_end(&mut body).await?;
        Ok(body.len())
    };
    let mut tick = tokio::time::interval(SCRAPE);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {
                let _ = get(&admin).await;
            }
        }
    }
}
