//! What the core tells JavaScript without being asked: a lock's new state (the
//! core's listener, called on the I/O thread) and the core's log lines (info and up).
//! Both go through one thread-safe function the package registers (`setListener`),
//! queued without blocking and called on the JavaScript thread; it is weak, so it
//! never keeps the process alive by itself.

use std::sync::{Arc, Mutex};

use lockside_client::{LockCell, LockState};
use napi::bindgen_prelude::Function;
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi_derive::napi;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};

/// `(kind, id, state, reason)`: `("state", lock id, "held" | "suspended" | "lost",
/// reason)` or `("log", level, "info" | "warn" | "error", line)`.
type News = (String, i64, String, String);
type Listener = ThreadsafeFunction<News, (), News, napi::Status, false, true>;

static LISTENER: Mutex<Option<Arc<Listener>>> = Mutex::new(None);

/// Registers the function that hears every lock's state changes and the core's log
/// lines (the package does it once, when it loads).
// (napi-derive registers the function with Node only outside `cfg(test)`, which
// `cargo clippy --all-targets` also checks.)
#[napi]
#[cfg_attr(test, allow(dead_code))]
pub fn set_listener(callback: Function<News, ()>) -> napi::Result<()> {
    let tsfn = callback
        .build_threadsafe_function::<News>()
        .weak::<true>()
        .build()?;
    if let Ok(mut listener) = LISTENER.lock() {
        *listener = Some(Arc::new(tsfn));
    }
    Ok(())
}

fn tell(news: News) {
    let listener = LISTENER.lock().ok().and_then(|l| l.clone());
    if let Some(listener) = listener {
        listener.call(news, ThreadsafeFunctionCallMode::NonBlocking);
    }
}

/// The state of `cell` as the package names it, with its reason.
pub(crate) fn state_of(cell: &LockCell) -> (&'static str, String) {
    match cell.state() {
        LockState::Held => ("held", String::new()),
        LockState::Suspended => ("suspended", cell.suspended_reason().unwrap_or_default()),
        LockState::Lost(why) => ("lost", why),
    }
}

/// The core's listener: hands the news of `cell` on (it runs with the session's
/// bookkeeping locked, so it only queues).
pub(crate) fn state_changed(cell: &Arc<LockCell>) {
    let (state, reason) = state_of(cell);
    tell(("state".into(), cell.id() as i64, state.into(), reason));
}

/// Forwards the core's log lines (target `lockside_client`, info and up) to the
/// package, which writes them to the console (`src/native.ts`).
pub(crate) fn install_logging() {
    struct ToNode;
    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for ToNode {
        fn enabled(&self, metadata: &tracing::Metadata<'_>, _: Context<'_, S>) -> bool {
            metadata.target().starts_with("lockside_client")
                && *metadata.level() <= tracing::Level::INFO
        }
        fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
            let level = match *event.metadata().level() {
                tracing::Level::ERROR => "error",
                tracing::Level::WARN => "warn",
                _ => "info",
            };
            let mut line = Line::default();
            event.record(&mut line);
            tell(("log".into(), 0, level.into(), line.0));
        }
    }
    #[derive(Default)]
    struct Line(String);
    impl Visit for Line {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            if field.name() == "message" {
                self.0.insert_str(0, &format!("{value:?}"));
            } else {
                self.0.push_str(&format!(" {}={value:?}", field.name()));
            }
        }
        fn record_str(&mut self, field: &Field, value: &str) {
            if field.name() == "message" {
                self.0.insert_str(0, value);
            } else {
                self.0.push_str(&format!(" {}={value}", field.name()));
            }
        }
    }
    let subscriber = tracing_subscriber::registry().with(ToNode);
    // Another subscriber set by other Rust code in the process wins.
    let _ = tracing::subscriber::set_global_default(subscriber);
}
