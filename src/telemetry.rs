//! Logs and traces. Logs go to stderr, as text or JSON, filtered by `RUST_LOG`. When
//! an OTLP endpoint is configured (`OTEL_EXPORTER_OTLP_ENDPOINT`), the sidecar's own
//! spans (a `session` per Lease stream, an `acquire` per first acquire of a key, a
//! `describe` per call) are exported to it over OTLP/gRPC, as children of the caller's
//! trace when the request carries W3C `traceparent` metadata.
//!
//! Spans are exported in batches from a background thread; a collector that is slow
//! or gone costs dropped spans (the batch queue is bounded), never a blocked lock.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{EnvFilter, FilterExt, LevelFilter, Targets, filter_fn};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Log formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The W3C trace context header (and metadata key) a caller's trace arrives in.
pub const TRACEPARENT: &str = "traceparent";
/// Its vendor-specific companion.
pub const TRACESTATE: &str = "tracestate";

/// A caller's W3C trace context, as it arrived (unchecked).
#[derive(Clone, Debug, Default)]
pub struct TraceContext {
    /// `traceparent`; empty: none.
    pub traceparent: String,
    /// `tracestate`, if any.
    pub tracestate: Option<String>,
}

/// How long shutdown waits for the last spans to be exported.
const FLUSH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// Where to send traces.
#[derive(Clone, Debug)]
pub struct TraceConfig {
    /// The OTLP/gRPC collector, e.g. `http://otel-collector:4317`.
    pub endpoint: String,
    /// `service.name` of every span.
    pub service_name: String,
}

/// The installed logging and tracing; flushes exported spans on [`Telemetry::shutdown`].
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

/// Installs the process-wide subscriber: logs to stderr, and spans to `traces` when
/// given. Must run inside the tokio runtime (the exporter's channel lives on it).
pub fn init(format: LogFormat, traces: Option<&TraceConfig>) -> Result<Telemetry, String> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    // Colours only for a person at a terminal, not in a pod's log file.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(colour);
    // Logs show events inside their session's span, but not inside the per-request
    // `acquire` span: that one is for traces, and when no layer wants it (traces off),
    // it is never made at all (measured: about 8% of the sidecar's CPU per cycle).
    let filter = filter.and(filter_fn(|meta| {
        !(meta.is_span() && meta.name() == "acquire")
    }));
    let logs = match format {
        LogFormat::Json => logs.json().with_filter(filter).boxed(),
        LogFormat::Text => logs.with_filter(filter).boxed(),
    };
    let (otel, provider) = match traces {
        None => (None, None),
        Some(config) => {
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(config.endpoint.clone())
                .build()
                .map_err(|e| format!("OTLP exporter: {e}"))?;
            let resource = opentelemetry_sdk::Resource::builder()
                .with_service_name(config.service_name.clone())
                .build();
            let provider = SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(resource)
                .build();
            let layer = tracing_opentelemetry::layer()
                .with_tracer(provider.tracer("lockside"))
                // A session's span is entered on every poll of its task: keep enter and
                // exit cheap (no busy/idle timing, no context switch-in), and leave out
                // attributes nobody reads (code location, thread, target).
                .with_tracked_inactivity(false)
                .with_context_activation(false)
                .with_location(false)
                .with_threads(false)
                .with_target(false)
                // Only the sidecar's own spans, whatever RUST_LOG says about logs.
                .with_filter(Targets::new().with_target("lockside", LevelFilter::INFO));
            (Some(layer), Some(provider))
        }
    };
    // No `Option` layer when traces are off: a `None` layer answers "always" for every
    // callsite, and then every library's trace-level span (h2 makes several per frame)
    // is created and filtered span by span (measured: the registry's span bookkeeping
    // was 8% of the sidecar's CPU per cycle with traces off).
    let logs = tracing_subscriber::registry().with(logs);
    match otel {
        Some(otel) => logs.with(otel).try_init(),
        None => logs.try_init(),
    }
    .map_err(|e| format!("logging: {e}"))?;
    Ok(Telemetry { provider })
}

impl Telemetry {
    /// Exports the spans still buffered, then stops the exporter.
    pub async fn shutdown(self) {
        let Some(provider) = self.provider else {
            return;
        };
        // shutdown() blocks until the last batch is sent or the export fails; a gone
        // collector must not hold up the pod's termination for long.
        let flush = tokio::task::spawn_blocking(move || provider.shutdown());
        match tokio::time::timeout(FLUSH_TIMEOUT, flush).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "flushing traces failed"),
            Ok(Err(e)) => tracing::warn!(error = %e, "flushing traces failed"),
            Err(_) => tracing::warn!("flushing traces took too long; the last spans are lost"),
        }
    }
}

/// Makes `span` a child of the remote span in `trace`. A missing or malformed header leaves the span where it was: a bad
/// header from a client must never cost it its lock.
pub fn set_remote_parent(span: &tracing::Span, trace: &TraceContext) {
    if trace.traceparent.is_empty() || span.is_disabled() {
        return;
    }
    let mut carrier = HashMap::with_capacity(2);
    carrier.insert(TRACEPARENT.to_owned(), trace.traceparent.clone());
    if let Some(state) = &trace.tracestate {
        carrier.insert(TRACESTATE.to_owned(), state.clone());
    }
    let context = TraceContextPropagator::new().extract(&carrier);
    use opentelemetry::trace::TraceContextExt;
    if context.span().span_context().is_valid() {
        let _ = span.set_parent(context);
    }
}

/// A retried operation's failures as an operator wants them logged: one line when a
/// streak of failures starts and one when it ends, rather than one per retry (a 2 s
/// outage retried every 100 ms would print twenty lines, and hide the one that says
/// when it ended).
#[derive(Debug, Default)]
pub struct Streak {
    /// Failures since the last success, and when the first of them came.
    failing: Option<(u64, tokio::time::Instant)>,
}

impl Streak {
    /// Counts a failure: `true` for the first of a streak, the one to log.
    pub fn failed(&mut self) -> bool {
        match &mut self.failing {
            Some((failures, _)) => {
                *failures += 1;
                false
            }
            None => {
                self.failing = Some((1, tokio::time::Instant::now()));
                true
            }
        }
    }

    /// Counts a success: after a streak, how many failures it had and how long it
    /// lasted, to log that it ended.
    pub fn recovered(&mut self) -> Option<(u64, std::time::Duration)> {
        (self.failing.take()).map(|(failures, since)| (failures, since.elapsed()))
    }

    /// Whether a streak of failures is under way.
    pub fn failing(&self) -> bool {
        self.failing.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_streak_is_told_once_when_it_starts_and_once_when_it_ends() {
        let mut streak = Streak::default();
        assert_eq!(streak.recovered(), None, "no streak, nothing to tell");
        assert!(streak.failed());
        assert!(!streak.failed());
        assert!(!streak.failed());
        assert_eq!(streak.recovered().map(|(n, _)| n), Some(3));
        assert_eq!(streak.recovered(), None);
        assert!(streak.failed(), "a new streak is told again");
    }
}
