//! What the core tells Python without being asked, and how asyncio hears its answers.
//!
//! The core's I/O thread never takes the GIL (a Python thread holding it for long
//! would stall every session's I/O and keepalive): it queues what Python must hear.
//! Locks' state changes and the core's log lines go to one queue per process that a
//! Python thread reads (`next_events`, waiting with the GIL released); an answer an
//! asyncio task awaits goes to its client's `Completions` and one byte to a socket the
//! event loop watches, which then takes the answers on its own thread.

use std::collections::VecDeque;
use std::io::Write;
use std::os::fd::{IntoRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, LazyLock, Mutex};
use std::time::Duration;

use lockside_client::{LockCell, LockState};
use pyo3::prelude::*;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};

/// One thing to tell Python: a lock's new state, or a log line.
pub(crate) enum News {
    State(u64, &'static str, String),
    Log(u8, String),
}

#[derive(Default)]
pub(crate) struct NewsQueue {
    queue: Mutex<(u32, VecDeque<News>)>,
    ready: Condvar,
}

pub(crate) static NEWS: LazyLock<NewsQueue> = LazyLock::new(NewsQueue::default);

impl NewsQueue {
    pub(crate) fn push(&self, news: News) {
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let pid = std::process::id();
        if queue.0 != pid {
            // The parent's, in a forked child: what it held is not this process's.
            *queue = (pid, VecDeque::new());
        }
        queue.1.push_back(news);
        drop(queue);
        self.ready.notify_one();
    }
}

/// The news of `cell`'s state, for the listener the core calls.
pub(crate) fn state_changed(cell: &Arc<LockCell>) {
    let (state, reason) = match cell.state() {
        LockState::Held => ("held", String::new()),
        LockState::Suspended => ("suspended", String::new()),
        LockState::Lost(why) => ("lost", why),
    };
    NEWS.push(News::State(cell.id(), state, reason));
}

/// Waits (the GIL released) up to `timeout` seconds for news: a list of `("state",
/// lock_id, state, reason)` and `("log", level, message)`.
#[pyfunction]
pub(crate) fn next_events(py: Python<'_>, timeout: f64) -> Vec<(String, u64, String, String)> {
    let taken: Vec<News> = py.detach(|| {
        let mut queue = NEWS.queue.lock().unwrap_or_else(|e| e.into_inner());
        let pid = std::process::id();
        if queue.0 != pid {
            *queue = (pid, VecDeque::new());
        }
        if queue.1.is_empty() {
            let wait = Duration::from_secs_f64(timeout.clamp(0.0, 3600.0));
            queue = self_wait(&NEWS.ready, queue, wait);
        }
        queue.1.drain(..).collect()
    });
    taken
        .into_iter()
        .map(|news| match news {
            News::State(id, state, reason) => ("state".to_owned(), id, state.to_owned(), reason),
            News::Log(level, message) => {
                ("log".to_owned(), u64::from(level), message, String::new())
            }
        })
        .collect()
}

fn self_wait<'a>(
    ready: &Condvar,
    guard: std::sync::MutexGuard<'a, (u32, VecDeque<News>)>,
    wait: Duration,
) -> std::sync::MutexGuard<'a, (u32, VecDeque<News>)> {
    match ready.wait_timeout_while(guard, wait, |q| q.1.is_empty()) {
        Ok((guard, _)) => guard,
        Err(poisoned) => poisoned.into_inner().0,
    }
}

/// Forwards the core's log lines (target `lockside_client`, info and up) to Python's
/// `logging` (logger "lockside"), through the news queue.
pub(crate) fn install_logging() {
    struct ToPython;
    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for ToPython {
        fn enabled(&self, metadata: &tracing::Metadata<'_>, _: Context<'_, S>) -> bool {
            metadata.target().starts_with("lockside_client")
                && *metadata.level() <= tracing::Level::INFO
        }
        fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
            let level = match *event.metadata().level() {
                tracing::Level::ERROR => 40,
                tracing::Level::WARN => 30,
                _ => 20,
            };
            let mut line = Line::default();
            event.record(&mut line);
            NEWS.push(News::Log(level, line.0));
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
    let subscriber = tracing_subscriber::registry().with(ToPython);
    // Another subscriber set by the application's own Rust code wins.
    let _ = tracing::subscriber::set_global_default(subscriber);
}

/// Makes the Python value of an answer, on the event loop's thread.
pub(crate) type MakeValue = Box<dyn FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send>;

/// What an asyncio task awaits, once it is there.
pub(crate) enum Outcome {
    Value(MakeValue),
    Failed((&'static str, String, i32, String)),
}

/// The answers a client's asyncio tasks await: the core pushes `(token, outcome)` and
/// writes one byte to a socket whose other end the event loop watches
/// (`loop.add_reader`); the loop then `take()`s them on its own thread.
#[pyclass(frozen)]
pub(crate) struct Completions {
    pub(crate) inner: Arc<CompletionsInner>,
    read_fd: Mutex<Option<RawFd>>,
}

pub(crate) struct CompletionsInner {
    done: Mutex<Vec<(u64, Outcome)>>,
    poke: UnixStream,
}

impl CompletionsInner {
    pub(crate) fn finish(&self, token: u64, outcome: Outcome) {
        let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        let first = done.is_empty();
        done.push((token, outcome));
        drop(done);
        if first {
            let _ = (&self.poke).write(&[1]);
        }
    }
}

#[pymethods]
impl Completions {
    #[new]
    fn new() -> PyResult<Self> {
        let (read, write) = UnixStream::pair()?;
        write.set_nonblocking(true)?;
        read.set_nonblocking(true)?;
        Ok(Self {
            inner: Arc::new(CompletionsInner {
                done: Mutex::new(Vec::new()),
                poke: write,
            }),
            read_fd: Mutex::new(Some(read.into_raw_fd())),
        })
    }

    /// The socket's end to watch, handed over once (the caller owns it then).
    fn take_fd(&self) -> Option<RawFd> {
        self.read_fd.lock().ok().and_then(|mut fd| fd.take())
    }

    /// The answers that came: `(token, ok, value)`, value a `Failure`'s arguments
    /// when not ok.
    fn take(&self, py: Python<'_>) -> PyResult<Vec<(u64, bool, Py<PyAny>)>> {
        let done = std::mem::take(&mut *self.inner.done.lock().unwrap_or_else(|e| e.into_inner()));
        let mut out = Vec::with_capacity(done.len());
        for (token, outcome) in done {
            match outcome {
                Outcome::Value(make) => out.push((token, true, make(py)?)),
                Outcome::Failed(args) => {
                    out.push((token, false, args.into_pyobject(py)?.into_any().unbind()))
                }
            }
        }
        Ok(out)
    }
}
