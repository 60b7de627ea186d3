//! The control endpoint: an HTTP server beside a running job (Flink's REST API and its
//! `flink checkpoint|savepoint|stop` as the model), off unless asked for, on loopback unless
//! explicitly allowed elsewhere. It takes a checkpoint or a savepoint with the job running,
//! stops the job with a savepoint (through whoever supervises the job, who owns its handle),
//! changes the live checkpoint configuration, lists the checkpoints with their statistics, and
//! serves metrics in Prometheus's text format. A bad request gets a status and a message; the
//! job keeps running. `weir control ADDR …` (the `weir` command's `control_client`) is its
//! client.
//!
//! | request | what |
//! |---|---|
//! | `GET /` | the dashboard: one page, its script bundled (`dashboard.html`), that reads the rest |
//! | `GET /job` | the job: name, uptime, workers, records, restarts, the last restore and where it came from (JSON) |
//! | `GET /health` | `{"status": "running"}` (or `finished`): the endpoint and the job answer |
//! | `POST /checkpoints` | a checkpoint now: `{"checkpoint": id}` once complete |
//! | `GET /checkpoints` | Flink's shape: counts, summary (min/avg/max/percentiles), latest completed/failed/restored/savepoint, the history and the failures with their times (JSON) |
//! | `POST /savepoints?dir=DIR` | a savepoint, the job going on: `{"savepoint": path}` once taken |
//! | `POST /stop?dir=DIR[&drain=true]` | stop with a savepoint (with `drain`, Flink's `stop --drain`: every window fires, the job finishes, its final checkpoint is the savepoint): `{"savepoint": path}` once taken |
//! | `POST /jobs/JOB/savepoints` | Flink's: `{"target-directory": DIR, "cancel-job": bool}` → 202 `{"request-id": ID}` at once |
//! | `GET /jobs/JOB/savepoints/ID` | `{"status": {"id": "IN_PROGRESS" or "COMPLETED"}, "operation": {"location" or "failure-cause"}}` |
//! | `POST /jobs/JOB/stop` | a stop with a savepoint by request id, as above (`{"targetDirectory", "drain"}`) |
//! | `POST /cancel`, `PATCH /jobs/JOB?mode=cancel` | cancels the job (no savepoint) |
//! | `GET /config` | the checkpoint configuration in force (JSON, the keys below) |
//! | `POST /config?KEY=VALUE…` | changes it, all or nothing |
//! | `GET /metrics` | OpenMetrics text (Prometheus scrapes it) |
//!
//! Savepoints go only where the operator allowed ([`ControlBinding::savepoint_roots`], the
//! command's `--control-savepoint-root`): a folder a request names outside them, or with a
//! `..` in it, is refused with 403.
//!
//! May touch: `metrics`, `settings` (the live keys), `stored` (savepoint folders); the job's
//! [`JobController`]; the supervisor through [`StopRequest`]s.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::Duration;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use weir::checkpoint::CheckpointConfig;
use weir::{Error, JobController, JobState};

use crate::settings::CheckpointSettings;

/// A stop-with-savepoint asked for through the endpoint, for the job's supervisor to carry out
/// (it owns the job's handle); it answers with the savepoint's folder, or why it failed.
#[derive(Debug)]
pub struct StopRequest {
    /// Where the savepoint goes.
    pub dir: PathBuf,
    /// Drain first (Flink's `stop --drain`): [`weir::JobHandle::stop_with_drain`].
    pub drain: bool,
    /// The answer: the savepoint's folder, or why there is none.
    pub reply: Sender<Result<String, StopRefused>>,
}

/// Why a stop with a savepoint asked through the endpoint did not end in a savepoint: what
/// the job's supervisor answers a [`StopRequest`] with, and the endpoint says in words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopRefused {
    /// The job is already stopping (Ctrl-C, or an earlier stop): it goes on stopping.
    AlreadyStopping,
    /// The job was reaching the end of its input: it finished instead.
    Finished,
    /// The savepoint's folder could not be made (the job goes on), or the stop failed: why.
    Failed(String),
}

impl std::fmt::Display for StopRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StopRefused::AlreadyStopping => f.write_str("the job is already stopping"),
            StopRefused::Finished => f.write_str("the job was reaching the end of its input: it finished instead"),
            StopRefused::Failed(why) => f.write_str(why),
        }
    }
}

/// A running control endpoint; dropped, it stops serving.
pub struct ControlEndpoint {
    addr: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    stops: Mutex<Receiver<StopRequest>>,
    triggers: std::sync::Arc<Mutex<Triggers>>,
    /// How long it serves on after the job ended ([`ControlBinding::linger`]).
    linger: Duration,
}

impl std::fmt::Debug for ControlEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlEndpoint").field("addr", &self.addr).finish_non_exhaustive()
    }
}

/// What the handlers share.
#[derive(Clone)]
struct Shared {
    job: JobController,
    /// Where savepoints may go; empty, anywhere.
    roots: std::sync::Arc<Vec<String>>,
    /// The newest savepoint taken through this endpoint: its location and when (Unix ms).
    last_savepoint: std::sync::Arc<Mutex<Option<(String, u64)>>>,
    /// Where stops with a savepoint go; none, they are refused.
    stops: Option<Sender<StopRequest>>,
    triggers: std::sync::Arc<Mutex<Triggers>>,
}

/// The savepoints and stops asked for by trigger (Flink's asynchronous operations): each
/// request's state by its id, the newest [`TRIGGERS_KEPT`].
#[derive(Default)]
struct Triggers {
    next: u64,
    states: std::collections::VecDeque<(String, TriggerState)>,
    /// Requests whose outcome is known and was not polled yet.
    unread: std::collections::HashSet<String>,
}

/// The trigger requests whose outcome the endpoint keeps.
const TRIGGERS_KEPT: usize = 100;
/// The trigger requests that may be in progress at once; more are refused (429).
const TRIGGERS_IN_PROGRESS: usize = 4;

#[derive(Clone)]
enum TriggerState {
    InProgress,
    Completed(String),
    Failed(String),
}

/// How long a command's endpoint stays up after its job ended while a savepoint or stop asked
/// for by trigger has an outcome nobody polled yet ([`ControlEndpoint::linger`]): a stop by
/// trigger ends the job, and its caller learns the savepoint's location only by polling.
pub const TRIGGER_LINGER: Duration = Duration::from_secs(30);

impl Triggers {
    /// A new request's id, or none when too many are in progress.
    fn start(&mut self) -> Option<String> {
        if self.states.iter().filter(|(_, s)| matches!(s, TriggerState::InProgress)).count() >= TRIGGERS_IN_PROGRESS {
            return None;
        }
        self.next += 1;
        let id = format!("{:016x}", weir::prng::mix(self.next ^ std::process::id() as u64));
        self.states.push_back((id.clone(), TriggerState::InProgress));
        while self.states.len() > TRIGGERS_KEPT {
            // The oldest finished one goes (one in progress stays until it ends).
            match self.states.iter().position(|(_, s)| !matches!(s, TriggerState::InProgress)) {
                Some(i) => drop(self.states.remove(i)),
                None => break,
            }
        }
        Some(id)
    }

    fn finish(&mut self, id: &str, outcome: Result<String, String>) {
        if let Some((_, s)) = self.states.iter_mut().find(|(i, _)| i == id) {
            *s = match outcome {
                Ok(location) => TriggerState::Completed(location),
                Err(why) => TriggerState::Failed(why),
            };
            self.unread.insert(id.to_string());
        }
    }

    /// Request `id`'s state, its outcome counted as read.
    fn read(&mut self, id: &str) -> Option<TriggerState> {
        let state = self.states.iter().find(|(i, _)| i == id).map(|(_, s)| s.clone())?;
        if !matches!(state, TriggerState::InProgress) {
            self.unread.remove(id);
        }
        Some(state)
    }

    /// Whether a request is in progress, or has an outcome nobody polled.
    fn awaited(&self) -> bool {
        !self.unread.is_empty() || self.states.iter().any(|(_, s)| matches!(s, TriggerState::InProgress))
    }
}

/// Who may reach a control endpoint's address ([`ControlBinding::bind`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// Loopback only: an address elsewhere is refused (the default, and the command's unless
    /// `--control-public`).
    Loopback,
    /// Any address: whoever reaches it can stop the job.
    Anywhere,
}

impl Reach {
    /// [`Reach::Anywhere`] when `public` (the command's `--control-public`), else loopback.
    pub fn of_public(public: bool) -> Reach {
        if public {
            Reach::Anywhere
        } else {
            Reach::Loopback
        }
    }
}

/// What a control endpoint may do beyond asking the job ([`router`]), by name.
#[derive(Debug, Default)]
pub struct ControlOptions {
    roots: Vec<String>,
    stops: Option<Sender<StopRequest>>,
}

impl ControlOptions {
    /// Savepoints anywhere this process may write, and no stops with a savepoint.
    pub fn new() -> ControlOptions {
        ControlOptions::default()
    }

    /// Lets savepoints go only into folders under `roots` ([`ControlBinding::savepoint_roots`]).
    pub fn savepoint_roots(mut self, roots: impl IntoIterator<Item = impl Into<String>>) -> ControlOptions {
        self.roots = roots.into_iter().map(Into::into).collect();
        self
    }

    /// Hands stops with a savepoint (`POST /stop`, `/jobs/JOB/stop`, a savepoint with
    /// `cancel-job`) to whoever holds the job's handle, which answers each one
    /// ([`crate::supervisor`] does it for the command). Without it they are refused with 501:
    /// only the handle can stop a job with a savepoint.
    pub fn stop_requests(mut self, stops: Sender<StopRequest>) -> ControlOptions {
        self.stops = Some(stops);
        self
    }
}

/// The control endpoint's routes for `job` (the table in this module's doc), to mount in a
/// program's own axum server: `Router::new().nest("/weir", router(job, options))` serves them
/// under `/weir`. A program that has no HTTP server of its own uses [`ControlBinding`] instead.
///
/// ```no_run
/// # fn host(job: weir::JobController) -> axum::Router {
/// use weir_ops::control::{router, ControlOptions};
/// axum::Router::new().nest("/weir", router(job, ControlOptions::new().savepoint_roots(["/var/lib/savepoints"])))
/// # }
/// ```
pub fn router(job: JobController, options: ControlOptions) -> Router {
    routes(Shared::new(job, options))
}

impl Shared {
    fn new(job: JobController, options: ControlOptions) -> Shared {
        let ControlOptions { roots, stops } = options;
        let roots = std::sync::Arc::new(roots);
        Shared { job, roots, last_savepoint: Default::default(), stops, triggers: Default::default() }
    }
}

/// The control endpoint's address, bound before the job starts (a bad address or one in use
/// is found before anything runs); [`ControlBinding::serve`] then serves the job there.
#[derive(Debug)]
pub struct ControlBinding {
    listener: std::net::TcpListener,
    addr: SocketAddr,
    roots: Vec<String>,
    linger: Duration,
}

impl ControlBinding {
    /// Binds `addr` (`HOST:PORT`; port 0 picks a free one). An address off loopback is
    /// refused unless `reach` is [`Reach::Anywhere`] (anyone who reaches it can stop the job).
    /// An address in use is an error naming it.
    pub fn bind(addr: &str, reach: Reach) -> weir::Result<ControlBinding> {
        let resolved: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|e| Error::config(format!("control endpoint address '{addr}' is not HOST:PORT: {e}")))?
            .collect();
        let Some(&first) = resolved.first() else {
            return Err(Error::config(format!("control endpoint address '{addr}' resolves to nothing")));
        };
        if reach == Reach::Loopback && !resolved.iter().all(|a| a.ip().is_loopback()) {
            return Err(Error::config(format!(
                "control endpoint address '{addr}' is not on loopback: anyone who reaches it can stop the job. \
                 Give --control-public to serve there anyway"
            )));
        }
        let cannot = |e: std::io::Error| Error::config(format!("cannot serve the control endpoint at {addr}: {e}"));
        let listener = std::net::TcpListener::bind(first).map_err(cannot)?;
        listener.set_nonblocking(true).map_err(cannot)?;
        let addr = listener.local_addr().map_err(cannot)?;
        Ok(ControlBinding { listener, addr, roots: Vec::new(), linger: Duration::ZERO })
    }

    /// Lets savepoints go only into folders under `roots` (local folders, or `s3://` ones);
    /// none given, anywhere this process may write. A request naming another folder is
    /// refused with 403 and the job goes on.
    pub fn savepoint_roots(mut self, roots: impl IntoIterator<Item = impl Into<String>>) -> ControlBinding {
        self.roots = roots.into_iter().map(Into::into).collect();
        self
    }

    /// Keeps serving `linger` after the job ended ([`ControlEndpoint::linger`]), so that how
    /// it ended can be read; none by default.
    pub fn linger(mut self, linger: Duration) -> ControlBinding {
        self.linger = linger;
        self
    }

    /// Where it will serve.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves `job` from now on.
    pub fn serve(self, job: JobController) -> weir::Result<ControlEndpoint> {
        let ControlBinding { listener, addr, roots, linger } = self;
        let (stop_tx, stop_rx) = std::sync::mpsc::channel();
        let shared = Shared::new(job.clone(), ControlOptions::new().savepoint_roots(roots).stop_requests(stop_tx));
        let triggers = std::sync::Arc::clone(&shared.triggers);
        let routes = routes(shared);
        let (shutdown, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .map_err(|e| Error::config(format!("cannot start the control endpoint's runtime: {e}")))?;
        let thread = std::thread::Builder::new()
            .name("weir-control".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
                    let _ = axum::serve(listener, routes)
                        .with_graceful_shutdown(async move {
                            let _ = shutdown_rx.await;
                        })
                        .await;
                });
                // The job's last reference may be this thread's (the program joined its
                // handle), and a job with checkpoints in an object store owns that client's
                // runtime: dropped inside `block_on` it panicked ("Cannot drop a runtime in a
                // context where blocking is not allowed"). It goes here, outside any runtime.
                drop(runtime);
                drop(job);
            })
            .map_err(|e| Error::config(format!("cannot start the control endpoint's thread: {e}")))?;
        Ok(ControlEndpoint {
            addr,
            shutdown: Some(shutdown),
            thread: Some(thread),
            stops: Mutex::new(stop_rx),
            triggers,
            linger,
        })
    }
}

impl ControlEndpoint {
    /// Serves `job` at `addr` ([`ControlBinding::bind`], then [`ControlBinding::serve`]).
    pub fn start(addr: &str, reach: Reach, job: JobController) -> weir::Result<ControlEndpoint> {
        ControlBinding::bind(addr, reach)?.serve(job)
    }

    /// Where it serves.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Keeps serving once the job ended: for its [`ControlBinding::linger`], and, up to
    /// [`TRIGGER_LINGER`], while a savepoint or stop asked for by trigger is in progress or has
    /// an outcome nobody polled (a stop by trigger ends the job, and its caller learns where
    /// the savepoint went by polling). Returns at once when neither holds.
    pub fn linger(&self) {
        let started = std::time::Instant::now();
        let awaited = || self.triggers.lock().unwrap_or_else(|e| e.into_inner()).awaited();
        while started.elapsed() < self.linger || (awaited() && started.elapsed() < TRIGGER_LINGER) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A stop-with-savepoint asked for since the last call, if any: the supervisor's to carry
    /// out and answer.
    pub fn stop_request(&self) -> Option<StopRequest> {
        self.stops.lock().unwrap_or_else(|e| e.into_inner()).try_recv().ok()
    }
}

impl Drop for ControlEndpoint {
    fn drop(&mut self) {
        // Stop requests nobody will carry out any more are answered now (their handlers see
        // the reply's sender go, and say the job ended), and later ones are refused: the
        // server's graceful shutdown waits for its handlers, and a second of two stop requests
        // kept the process alive for the hour its handler waits.
        drop(std::mem::replace(
            &mut *self.stops.lock().unwrap_or_else(|e| e.into_inner()),
            std::sync::mpsc::channel().1,
        ));
        if let Some(s) = self.shutdown.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn routes(shared: Shared) -> Router {
    Router::new()
        .route("/", get(dashboard))
        .route("/job", get(job))
        .route("/checkpoints", get(checkpoints).post(checkpoint_now))
        .route("/savepoints", post(savepoint))
        .route("/stop", post(stop))
        .route("/config", get(config).post(change_config))
        .route("/metrics", get(metrics))
        .route("/health", get(health))
        .route("/cancel", post(cancel))
        .route("/jobs", get(jobs))
        .route("/jobs/overview", get(jobs_overview))
        .route("/jobs/{job}", get(job_details).patch(cancel_job))
        .route("/jobs/{job}/checkpoints", get(job_checkpoints))
        .route("/jobs/{job}/checkpoints/config", get(job_checkpoint_config))
        .route("/jobs/{job}/savepoints", post(trigger_savepoint))
        .route("/jobs/{job}/savepoints/{trigger}", get(trigger_status))
        .route("/jobs/{job}/stop", post(trigger_stop))
        // A known path asked with the wrong method: the status and a JSON error too.
        .method_not_allowed_fallback(|method: axum::http::Method, uri: axum::http::Uri| async move {
            refuse(StatusCode::METHOD_NOT_ALLOWED, format!("{} does not take {method}", uri.path()))
        })
        .fallback(|| async {
            refuse(
                StatusCode::NOT_FOUND,
                "no such request: GET / (the dashboard), /job, /health, /checkpoints, /config, /metrics, \
                 /jobs/JOB/savepoints/TRIGGER; POST /checkpoints[?type=full|incremental], \
                 /savepoints?dir=DIR, /stop?dir=DIR, /cancel, /config?KEY=VALUE, /jobs/JOB/savepoints, \
                 /jobs/JOB/stop; PATCH /jobs/JOB?mode=cancel",
            )
        })
        .layer(axum::middleware::map_response(json_errors))
        .with_state(shared)
}

/// Every error answer is JSON, `{"error": …}`: axum's own rejections (a query that does not
/// parse, a body too large) are plain text, turned into the same shape here.
async fn json_errors(response: Response) -> Response {
    let status = response.status();
    let json =
        response.headers().get(header::CONTENT_TYPE).is_some_and(|t| t.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || json {
        return response;
    }
    let text = axum::body::to_bytes(response.into_body(), 64 * 1024).await.unwrap_or_default();
    refuse(status, String::from_utf8_lossy(&text).trim().to_string())
}

/// An error answer: the status and a message (`{"error": …}`).
fn refuse(status: StatusCode, message: impl Into<String>) -> Response {
    Refusal(status, message.into()).into_response()
}

/// A request refused: its status and why.
struct Refusal(StatusCode, String);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        (self.0, axum::Json(serde_json::json!({ "error": self.1 }))).into_response()
    }
}

fn json(value: serde_json::Value) -> Response {
    axum::Json(value).into_response()
}

/// Runs blocking work (a checkpoint's wait) off the server's thread.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Result<T, Refusal> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Refusal(StatusCode::INTERNAL_SERVER_ERROR, format!("the request's work failed: {e}")))
}

/// The dashboard: throughput, the operators' records and watermarks, the checkpoint history
/// (durations by how their barriers went, and each one's tasks), refreshed every second.
async fn dashboard() -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], include_str!("dashboard.html")).into_response()
}

async fn job(State(s): State<Shared>) -> Response {
    let m = s.job.metrics();
    json(serde_json::json!({
        "name": s.job.name(),
        "uptime_s": s.job.elapsed().as_secs_f64(),
        "workers": s.job.workers(),
        "source_records": m.source_records(),
        "sink_records": m.sink_records(),
        "late_records": m.late_records(),
        "restarts": s.job.restarts(),
        // What the current attempt restored and from where: memory (local recovery), files or
        // savepoint.
        "last_restore": s.job.last_restore(),
        // Why it restarted, the newest last (the job's notes: `restart N after: …`).
        "restart_causes": s.job.notes().into_iter().filter(|n| n.starts_with("restart ")).collect::<Vec<_>>(),
        "finished": s.job.is_finished(),
        "state": s.job.state().name(),
        "start_unix_ms": s.job.started_unix_ms(),
        // Why the job (or its newest attempt) failed: Flink's root exception.
        "last_failure": s.job.last_failure(),
        "checkpointing": s.job.checkpoint_config().is_some(),
    }))
}

/// Whether the endpoint and the job answer, for a probe: 200 with the job's state in lower
/// case (`running`, `restarting`, `finished`, `cancelled`, …), 503 once it failed for good.
async fn health(State(s): State<Shared>) -> Response {
    let state = s.job.state();
    let body = serde_json::json!({
        "status": health_word(state),
        "state": state.name(),
        "job": s.job.name(),
        "last_failure": s.job.last_failure().filter(|_| state == JobState::Failed).map(|f| f.cause),
    });
    match state {
        JobState::Failed => (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response(),
        _ => json(body),
    }
}

/// `/health`'s word for a state.
fn health_word(state: JobState) -> &'static str {
    match state {
        JobState::Running => "running",
        JobState::Failing => "failing",
        JobState::Restarting => "restarting",
        JobState::Cancelling => "cancelling",
        JobState::Cancelled => "cancelled",
        JobState::Failed => "failed",
        JobState::Finished => "finished",
    }
}

/// Flink's `GET /jobs`: the jobs with their states (this endpoint's one).
async fn jobs(State(s): State<Shared>) -> Response {
    json(serde_json::json!({ "jobs": [{ "id": s.job.name(), "status": s.job.state().name() }] }))
}

/// Flink's `GET /jobs/overview`.
async fn jobs_overview(State(s): State<Shared>) -> Response {
    json(serde_json::json!({ "jobs": [job_summary(&s)] }))
}

/// Flink's `GET /jobs/:id`: the job's details.
async fn job_details(State(s): State<Shared>, axum::extract::Path(job): axum::extract::Path<String>) -> Response {
    if let Err(r) = this_job(&s, &job) {
        return r.into_response();
    }
    let mut details = job_summary(&s);
    details["restarts"] = s.job.restarts().into();
    details["last-failure"] = serde_json::to_value(s.job.last_failure()).unwrap_or_default();
    details["workers"] = s.job.workers().into();
    json(details)
}

/// A job as Flink's overview and details name it (`jid` is the job's name: one job an
/// endpoint).
fn job_summary(s: &Shared) -> serde_json::Value {
    let start = s.job.started_unix_ms();
    let duration = s.job.elapsed().as_millis() as u64;
    serde_json::json!({
        "jid": s.job.name(),
        "name": s.job.name(),
        "state": s.job.state().name(),
        "start-time": start,
        // Flink's -1 while it runs; the time of the endpoint's answer after, as it keeps no end.
        "end-time": if s.job.state().is_terminal() { (start + duration) as i64 } else { -1 },
        "duration": duration,
        "now": start + duration,
    })
}

/// The checkpoints in Flink's shape (`/jobs/:id/checkpoints`, and `/checkpoints`): counts
/// (with `restored`), a summary of the kept history (min, average, max and percentiles), the
/// latest completed, failed, restored and savepoint, and the history, newest first, a row per
/// checkpoint with its status (`IN_PROGRESS`, `COMPLETED`, `FAILED`) and epoch-millisecond
/// times. The keys of weir's first shape stay beside Flink's: `completed` (the completed rows
/// with their details, oldest first), `failures`, `completed_total`, `failed_total`.
async fn checkpoints(State(s): State<Shared>) -> Response {
    json(checkpoint_statistics(&s))
}

/// `GET /jobs/:id/checkpoints`: [`checkpoints`] for the job it names.
async fn job_checkpoints(State(s): State<Shared>, axum::extract::Path(job): axum::extract::Path<String>) -> Response {
    match this_job(&s, &job) {
        Ok(()) => json(checkpoint_statistics(&s)),
        Err(r) => r.into_response(),
    }
}

/// `GET /jobs/:id/checkpoints/config`: the checkpoint configuration in Flink's names.
async fn job_checkpoint_config(
    State(s): State<Shared>,
    axum::extract::Path(job): axum::extract::Path<String>,
) -> Response {
    if let Err(r) = this_job(&s, &job) {
        return r.into_response();
    }
    let Some(c) = s.job.checkpoint_config() else {
        return refuse(StatusCode::CONFLICT, "the job takes no checkpoints");
    };
    let ms = |d: Duration| d.as_millis() as u64;
    json(serde_json::json!({
        "mode": if c.mode.exactly_once() { "exactly_once" } else { "at_least_once" },
        "interval": ms(c.interval),
        "timeout": ms(c.checkpoint_timeout),
        "min_pause": ms(c.min_pause),
        "max_concurrent": c.max_concurrent,
        "tolerable_failed_checkpoints": c.tolerable_failed_checkpoints,
        "unaligned_checkpoints": c.mode.may_overtake(),
        "aligned_checkpoint_timeout": c.mode.alignment_timeout().map_or(0, ms),
        "checkpoint_storage": if c.store.is_some() { "object store" } else { "filesystem" },
        "state_changelog_enabled": c.changelog.is_some(),
        "incremental": c.incremental,
        "local_recovery": c.local_recovery,
        "retained": c.retained,
        "weir": config_values(&c, s.job.state_memory().map(|m| m.limit_bytes)),
    }))
}

/// The body of [`checkpoints`].
fn checkpoint_statistics(s: &Shared) -> serde_json::Value {
    let completed = s.job.checkpoint_stats();
    let failures = s.job.checkpoint_failures();
    let in_progress_rows = s.job.checkpoints_in_progress_now();
    let (done, failed) = (s.job.checkpoints_completed(), s.job.checkpoints_failed());
    let in_progress = in_progress_rows.len() as u64;
    let summary = |figure: fn(&weir::metrics::CheckpointStats) -> f64| summary(completed.iter().map(figure).collect());
    let mut history: Vec<(u64, serde_json::Value)> = completed.iter().map(|c| (c.id, completed_row(c))).collect();
    history.extend(failures.iter().map(|f| {
        (
            f.checkpoint,
            serde_json::json!({
                "id": f.checkpoint, "status": "FAILED", "failure_timestamp": f.failed_unix_ms,
                "failure_message": f.reason,
            }),
        )
    }));
    history.extend(in_progress_rows.iter().map(|p| {
        (
            p.id,
            serde_json::json!({
                "id": p.id, "status": "IN_PROGRESS", "is_savepoint": p.savepoint,
                "trigger_timestamp": p.trigger_unix_ms, "num_subtasks": p.tasks,
                "num_acknowledged_subtasks": p.acknowledged,
            }),
        )
    }));
    history.sort_by_key(|row| std::cmp::Reverse(row.0));
    serde_json::json!({
        "counts": {
            "restored": s.job.restores(),
            "total": done + failed + in_progress,
            "in_progress": in_progress,
            "completed": done,
            "failed": failed,
        },
        "summary": {
            "end_to_end_duration_ms": summary(|c| c.duration_ms),
            "start_delay_ms": summary(|c| c.start_delay_ms),
            "alignment_ms": summary(|c| c.alignment_ms),
            "sync_ms": summary(|c| c.sync_ms),
            "async_ms": summary(|c| c.async_ms),
            "state_bytes": summary(|c| c.state_bytes as f64),
            "written_bytes": summary(|c| c.written_bytes as f64),
            "inflight_bytes": summary(|c| c.inflight_bytes as f64),
        },
        "latest": {
            "completed": completed.last(),
            "failed": failures.last(),
            "restored": s.job.last_restore(),
            "savepoint": s.last_savepoint.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|(location, at)| {
                serde_json::json!({ "location": location, "completed_unix_ms": at })
            }),
        },
        "history": history.into_iter().map(|(_, row)| row).collect::<Vec<_>>(),
        "completed": completed,
        "completed_total": done,
        "failures": failures,
        "failed_total": failed,
    })
}

/// A completed checkpoint as a row of Flink's history.
fn completed_row(c: &weir::metrics::CheckpointStats) -> serde_json::Value {
    let ms = |f: f64| f.round() as u64;
    serde_json::json!({
        "id": c.id,
        "status": "COMPLETED",
        "is_savepoint": c.mode.is_none(),
        "trigger_timestamp": c.trigger_unix_ms,
        "latest_ack_timestamp": c.trigger_unix_ms + ms(c.duration_ms),
        "end_to_end_duration": ms(c.duration_ms),
        "state_size": c.state_bytes,
        "checkpointed_size": c.written_bytes,
        "persisted_data": c.inflight_bytes,
        "alignment_duration": ms(c.alignment_ms),
        "num_subtasks": c.tasks.len(),
        "num_acknowledged_subtasks": c.tasks.len(),
    })
}

/// Min, average, max and percentiles of `values` (none: all zero), as Flink summarizes.
fn summary(mut values: Vec<f64>) -> serde_json::Value {
    values.sort_by(f64::total_cmp);
    let at = |q: f64| values.get(((values.len() as f64 * q).ceil() as usize).saturating_sub(1)).copied().unwrap_or(0.0);
    let avg = if values.is_empty() { 0.0 } else { values.iter().sum::<f64>() / values.len() as f64 };
    serde_json::json!({
        "min": values.first().copied().unwrap_or(0.0),
        "avg": avg,
        "max": values.last().copied().unwrap_or(0.0),
        "p50": at(0.5), "p90": at(0.9), "p95": at(0.95), "p99": at(0.99), "p999": at(0.999),
    })
}

#[derive(serde::Deserialize)]
struct CheckpointQuery {
    /// full, incremental or configured (Flink's checkpoint types); none: as configured.
    #[serde(rename = "type")]
    kind: Option<String>,
}

async fn checkpoint_now(State(s): State<Shared>, Query(q): Query<CheckpointQuery>) -> Response {
    let incremental = s.job.checkpoint_config().is_some_and(|c| c.incremental);
    let full = match q.kind.as_deref() {
        None | Some("configured") => false,
        Some("full") => true,
        Some("incremental") if incremental => false,
        Some("incremental") => {
            return refuse(
                StatusCode::CONFLICT,
                "the job's checkpoints are not incremental (it was not started with them)",
            )
        }
        Some(other) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                format!("unknown checkpoint type '{other}': full, incremental or configured"),
            )
        }
    };
    match blocking(move || if full { s.job.trigger_full_checkpoint() } else { s.job.trigger_checkpoint() }).await {
        Ok(Ok(id)) => json(serde_json::json!({ "checkpoint": id })),
        Ok(Err(e)) => refuse(StatusCode::CONFLICT, e.to_string()),
        Err(r) => r.into_response(),
    }
}

#[derive(serde::Deserialize)]
struct DirQuery {
    dir: Option<String>,
    #[serde(default)]
    drain: bool,
}

/// Whether savepoint folder `dir` lies under one of `roots` (none: anywhere). A `..` in it
/// is refused outright: lexically under a root, it may point anywhere.
fn within_roots(roots: &[String], dir: &str) -> Result<(), Refusal> {
    if roots.is_empty() {
        return Ok(());
    }
    let forbidden = |why: &str| {
        Refusal(
            StatusCode::FORBIDDEN,
            format!("savepoint folder '{dir}' {why}: this endpoint writes savepoints only under {}", roots.join(", ")),
        )
    };
    if dir.split(['/', '\\']).any(|part| part == "..") {
        return Err(forbidden("has a '..' in it"));
    }
    let s3 = crate::stored::is_stored;
    let inside = |root: &String| match (s3(root), s3(dir)) {
        (true, true) => {
            let root = root.trim_end_matches('/');
            dir.strip_prefix(root).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
        }
        (false, false) => resolved(dir).zip(resolved(root)).is_some_and(|(dir, root)| dir.starts_with(root)),
        _ => false,
    };
    match roots.iter().any(inside) {
        true => Ok(()),
        false => Err(forbidden("is outside the folders the operator allowed")),
    }
}

/// `folder` as the operating system will find it: absolute, with every symbolic link in the
/// part that exists resolved (a link inside a root led outside it, and the text said inside),
/// and the part that does not exist yet (made as plain folders) appended. `None` where a part
/// is there and cannot be resolved: a link to nothing (made, the folder would be its target).
fn resolved(folder: &str) -> Option<PathBuf> {
    let absolute = std::path::absolute(folder).ok()?;
    let mut existing = absolute.as_path();
    let mut missing = Vec::new();
    loop {
        if let Ok(real) = existing.canonicalize() {
            return Some(missing.iter().rev().fold(real, |path, part| path.join(part)));
        }
        if existing.symlink_metadata().is_ok() {
            return None;
        }
        missing.push(existing.file_name()?.to_os_string());
        existing = existing.parent()?;
    }
}

/// The `dir` of a savepoint request, or the answer that it is missing or not allowed.
fn savepoint_dir(roots: &[String], dir: Option<&str>) -> Result<PathBuf, Refusal> {
    let Some(d) = dir.filter(|d| !d.is_empty()) else {
        return Err(Refusal(StatusCode::BAD_REQUEST, "a savepoint needs ?dir=DIR: the folder it goes into".into()));
    };
    within_roots(roots, d)?;
    // Percent-encoded bytes that are no UTF-8 text arrive as U+FFFD: a folder of that name is
    // nobody's.
    if d.contains('\u{FFFD}') {
        return Err(Refusal(
            StatusCode::BAD_REQUEST,
            format!("the savepoint folder '{d}' is not valid UTF-8 (its percent-encoded bytes are no text)"),
        ));
    }
    Ok(PathBuf::from(d))
}

/// Refuses a local savepoint folder among the job's own (before anything makes it); one in an
/// object store is taken into a staging folder of its own.
fn check_folder(job: &JobController, dir: &std::path::Path) -> weir::Result<()> {
    match dir.to_str().is_some_and(crate::stored::is_stored) {
        true => Ok(()),
        false => job.check_savepoint_folder(dir),
    }
}

async fn savepoint(State(s): State<Shared>, Query(q): Query<DirQuery>) -> Response {
    let dir = match savepoint_dir(&s.roots, q.dir.as_deref()) {
        Ok(d) => d,
        Err(r) => return r.into_response(),
    };
    let taken = blocking(move || savepoint_now(&s, &dir));
    match taken.await {
        Ok(Ok(kept)) => json(serde_json::json!({ "savepoint": kept })),
        Ok(Err(e)) => refuse(StatusCode::CONFLICT, e.to_string()),
        Err(r) => r.into_response(),
    }
}

async fn stop(State(s): State<Shared>, Query(q): Query<DirQuery>) -> Response {
    let dir = match savepoint_dir(&s.roots, q.dir.as_deref()) {
        Ok(d) => d,
        Err(r) => return r.into_response(),
    };
    if let Err(e) = check_folder(&s.job, &dir) {
        return refuse(StatusCode::CONFLICT, e.to_string());
    }
    match blocking(move || stop_now(&s, dir, q.drain)).await {
        Ok(Ok(path)) => json(serde_json::json!({ "savepoint": path })),
        Ok(Err(why)) => refuse(StatusCode::CONFLICT, why),
        Err(r) => r.into_response(),
    }
}

/// Cancels the job (no savepoint, nothing committed after it): Flink's `cancel`.
async fn cancel(State(s): State<Shared>) -> Response {
    let state = s.job.state();
    if state.is_terminal() {
        return refuse(
            StatusCode::CONFLICT,
            format!("the job has ended already ({}): nothing to cancel", state.name()),
        );
    }
    s.job.cancel();
    (StatusCode::ACCEPTED, axum::Json(serde_json::json!({ "cancelled": s.job.name() }))).into_response()
}

#[derive(serde::Deserialize)]
struct CancelQuery {
    mode: Option<String>,
}

/// `PATCH /jobs/:id?mode=cancel`, as Flink's REST API cancels.
async fn cancel_job(
    State(s): State<Shared>,
    axum::extract::Path(job): axum::extract::Path<String>,
    Query(q): Query<CancelQuery>,
) -> Response {
    if let Err(r) = this_job(&s, &job) {
        return r.into_response();
    }
    match q.mode.as_deref() {
        None | Some("cancel") => cancel(State(s)).await,
        Some(other) => refuse(StatusCode::BAD_REQUEST, format!("unknown mode '{other}': cancel")),
    }
}

/// The job a `/jobs/:id/…` request names is this endpoint's (by its name).
fn this_job(s: &Shared, job: &str) -> Result<(), Refusal> {
    let name = s.job.name();
    match job == name {
        true => Ok(()),
        false => Err(Refusal(StatusCode::NOT_FOUND, format!("no job '{job}': this endpoint serves job '{name}'"))),
    }
}

/// A trigger request's body (Flink's names; `dir` as the other requests name it).
#[derive(serde::Deserialize, Default)]
struct TriggerBody {
    #[serde(rename = "target-directory", alias = "targetDirectory", alias = "dir")]
    target_directory: Option<String>,
    #[serde(rename = "cancel-job", default)]
    cancel_job: bool,
    /// A stop's: drain first (Flink's `stop --drain`).
    #[serde(default)]
    drain: bool,
}

/// `POST /jobs/:id/savepoints`: starts a savepoint (with `cancel-job`, a stop with one) and
/// answers at once with the request's id to poll (`GET /jobs/:id/savepoints/:trigger`).
async fn trigger_savepoint(
    State(s): State<Shared>,
    axum::extract::Path(job): axum::extract::Path<String>,
    body: Result<axum::Json<TriggerBody>, JsonRejection>,
) -> Response {
    match trigger_body(body) {
        Ok(body) => start_trigger(s, &job, body.target_directory, body.cancel_job, false),
        Err(r) => r.into_response(),
    }
}

/// `POST /jobs/:id/stop`: a stop with a savepoint, by trigger.
async fn trigger_stop(
    State(s): State<Shared>,
    axum::extract::Path(job): axum::extract::Path<String>,
    body: Result<axum::Json<TriggerBody>, JsonRejection>,
) -> Response {
    match trigger_body(body) {
        Ok(body) => start_trigger(s, &job, body.target_directory, true, body.drain),
        Err(r) => r.into_response(),
    }
}

/// A trigger's body: none (no body, or not JSON by its content type) is the defaults; one that
/// is not the JSON it should be is refused with a JSON error, not axum's plain text.
fn trigger_body(body: Result<axum::Json<TriggerBody>, JsonRejection>) -> Result<TriggerBody, Refusal> {
    match body {
        Ok(axum::Json(body)) => Ok(body),
        Err(JsonRejection::MissingJsonContentType(_)) => Ok(TriggerBody::default()),
        Err(e) => Err(Refusal(
            StatusCode::BAD_REQUEST,
            format!("the request's body is not the JSON it should be: {}", e.body_text()),
        )),
    }
}

fn start_trigger(s: Shared, job: &str, dir: Option<String>, stop: bool, drain: bool) -> Response {
    if let Err(r) = this_job(&s, job) {
        return r.into_response();
    }
    let dir = match savepoint_dir(&s.roots, dir.as_deref()) {
        Ok(d) => d,
        Err(r) => return r.into_response(),
    };
    if let Err(e) = check_folder(&s.job, &dir) {
        return refuse(StatusCode::CONFLICT, e.to_string());
    }
    let Some(id) = s.triggers.lock().unwrap_or_else(|e| e.into_inner()).start() else {
        return refuse(
            StatusCode::TOO_MANY_REQUESTS,
            format!("{TRIGGERS_IN_PROGRESS} savepoints or stops are in progress already: poll them, then ask again"),
        );
    };
    let (triggers, trigger) = (std::sync::Arc::clone(&s.triggers), id.clone());
    std::thread::spawn(move || {
        let outcome = if stop { stop_now(&s, dir, drain) } else { savepoint_now(&s, &dir).map_err(|e| e.to_string()) };
        triggers.lock().unwrap_or_else(|e| e.into_inner()).finish(&trigger, outcome);
    });
    (StatusCode::ACCEPTED, axum::Json(serde_json::json!({ "request-id": id }))).into_response()
}

/// `GET /jobs/:id/savepoints/:trigger`: the request's state as Flink answers it.
async fn trigger_status(
    State(s): State<Shared>,
    axum::extract::Path((job, trigger)): axum::extract::Path<(String, String)>,
) -> Response {
    if let Err(r) = this_job(&s, &job) {
        return r.into_response();
    }
    let state = s.triggers.lock().unwrap_or_else(|e| e.into_inner()).read(&trigger);
    match state {
        None => refuse(StatusCode::NOT_FOUND, format!("no savepoint or stop request '{trigger}' (or it is too old)")),
        Some(TriggerState::InProgress) => json(serde_json::json!({ "status": { "id": "IN_PROGRESS" } })),
        Some(TriggerState::Completed(location)) => json(serde_json::json!({
            "status": { "id": "COMPLETED" }, "operation": { "location": location }
        })),
        Some(TriggerState::Failed(why)) => json(serde_json::json!({
            "status": { "id": "COMPLETED" }, "operation": { "failure-cause": { "message": why } }
        })),
    }
}

/// A savepoint into `dir` with the job going on: its path (kept as the latest savepoint).
fn savepoint_now(s: &Shared, dir: &std::path::Path) -> weir::Result<String> {
    check_folder(&s.job, dir)?;
    let dir = crate::stored::SavepointDir::open(dir)?;
    let path = s.job.trigger_savepoint(dir.folder())?;
    let kept = dir.keep(&path)?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    *s.last_savepoint.lock().unwrap_or_else(|e| e.into_inner()) = Some((kept.clone(), now));
    Ok(kept)
}

/// A stop with a savepoint into `dir` (drained first if `drain`), carried out by the job's
/// supervisor: its path. A job without checkpoints is refused here, before the supervisor
/// stops anything: it could make no savepoint.
fn stop_now(s: &Shared, dir: PathBuf, drain: bool) -> Result<String, String> {
    if s.job.checkpoint_config().is_none() {
        return Err("a stop with a savepoint needs checkpointing, and this job takes none: it goes on (cancel it \
                    to end it)"
            .into());
    }
    let Some(stops) = &s.stops else {
        return Err("this endpoint carries out no stops with a savepoint (it was mounted without \
                    ControlOptions::stop_requests): take a savepoint, then cancel"
            .into());
    };
    let (reply, answer) = std::sync::mpsc::channel();
    stops.send(StopRequest { dir, drain, reply }).map_err(|_| "the job is not supervised any more (it is ending)")?;
    // The supervisor looks every 100 ms; the savepoint takes its own timeout.
    match answer.recv_timeout(Duration::from_secs(3600)) {
        Ok(outcome) => outcome.map_err(|e| e.to_string()),
        Err(_) => Err("the job ended before it could stop with a savepoint".into()),
    }
}

/// The configuration keys a running job takes, in Flink's vocabulary (and the command's
/// flags'), with their values in `c`, and its state memory budget (read-only).
fn config_values(c: &CheckpointConfig, state_memory: Option<u64>) -> serde_json::Value {
    let ms = |d: Duration| d.as_millis() as u64;
    serde_json::json!({
        "interval-ms": ms(c.interval),
        "interval-during-backlog-ms": c.interval_during_backlog.map(ms),
        "checkpoint-timeout-ms": ms(c.checkpoint_timeout),
        "min-pause-ms": ms(c.min_pause),
        "max-concurrent": c.max_concurrent,
        "tolerable-failed-checkpoints": c.tolerable_failed_checkpoints,
        "retained": c.retained,
        "checkpoint": c.mode.kind().name(),
        "unaligned": c.mode.may_overtake(),
        "aligned-checkpoint-timeout-ms": c.mode.alignment_timeout().map(ms),
        "inflight-budget-bytes": c.mode.inflight_budget(),
        "restart-strategy": restart_strategy(&c.restart),
        // Fixed for the job's life: shown, refused as changes.
        "mode": if c.mode.exactly_once() { "exactly-once" } else { "at-least-once" },
        "incremental": c.incremental,
        "local-recovery": c.local_recovery,
        "changelog": c.changelog.is_some(),
        "materialize-every": c.changelog,
        "state-memory": state_memory,
    })
}

/// A restart strategy in the words of its flags.
fn restart_strategy(r: &weir::checkpoint::RestartStrategy) -> String {
    use weir::checkpoint::RestartStrategy::*;
    let ms = |d: &Duration| d.as_millis();
    match r {
        None => "none".into(),
        FixedDelay { attempts, delay } => format!("fixed-delay: {attempts} attempts, {} ms apart", ms(delay)),
        ExponentialBackoff { attempts, initial, max, multiplier } => format!(
            "exponential-delay: {attempts} attempts, from {} ms times {multiplier} up to {} ms",
            ms(initial),
            ms(max)
        ),
        FailureRate { max_failures, interval, delay } => {
            format!("failure-rate: at most {max_failures} failures in {} ms, {} ms apart", ms(interval), ms(delay))
        }
    }
}

/// `c` with `settings` (KEY=VALUE, applied together), or what is wrong with them: the keys
/// are the checkpoint flags' (`crate::settings`), those a running job can change;
/// `none` or `off` clears an optional one.
pub fn apply_settings(mut c: CheckpointConfig, settings: &[(String, String)]) -> Result<CheckpointConfig, String> {
    let mut given = Vec::new();
    for (key, value) in settings {
        if !matches!(value.as_str(), "none" | "off") {
            given.push((key.clone(), value.clone()));
            continue;
        }
        match key.as_str() {
            "interval-during-backlog-ms" => c.interval_during_backlog = None,
            // Without its timeout or budget, the mode is plainly unaligned.
            "aligned-checkpoint-timeout-ms" | "alignment-timeout-ms" if c.mode.alignment_timeout().is_some() => {
                c.mode = weir::checkpoint::CheckpointMode::Unaligned
            }
            "inflight-budget-bytes" if c.mode.inflight_budget().is_some() => {
                c.mode = weir::checkpoint::CheckpointMode::Unaligned
            }
            "aligned-checkpoint-timeout-ms" | "alignment-timeout-ms" | "inflight-budget-bytes" => {}
            _ => return Err(format!("{key} cannot be {value}: give a value")),
        }
    }
    CheckpointSettings::parse_settings(&given)?.change_live(c).map_err(|e| e.to_string())
}

async fn config(State(s): State<Shared>) -> Response {
    match s.job.checkpoint_config() {
        Some(c) => json(config_values(&c, s.job.state_memory().map(|m| m.limit_bytes))),
        None => refuse(StatusCode::CONFLICT, "the job takes no checkpoints"),
    }
}

async fn change_config(State(s): State<Shared>, Query(q): Query<Vec<(String, String)>>) -> Response {
    if q.is_empty() {
        return refuse(StatusCode::BAD_REQUEST, "nothing to change: give KEY=VALUE (GET /config lists the keys)");
    }
    let Some(current) = s.job.checkpoint_config() else {
        return refuse(StatusCode::CONFLICT, "the job takes no checkpoints: there is no configuration to change");
    };
    // Checked whole before anything applies: all or nothing.
    let new = match apply_settings(current, &q) {
        Ok(c) => c,
        Err(why) => return refuse(StatusCode::BAD_REQUEST, why),
    };
    match s.job.update_checkpoints(|_| new) {
        Ok(()) => {
            let state_memory = s.job.state_memory().map(|m| m.limit_bytes);
            json(config_values(&s.job.checkpoint_config().expect("it has one"), state_memory))
        }
        Err(e) => refuse(StatusCode::BAD_REQUEST, e.to_string()),
    }
}

/// OpenMetrics for a scraper that asks for it (Prometheus does), the 0.0.4 text format for
/// anyone else.
async fn metrics(State(s): State<Shared>, headers: axum::http::HeaderMap) -> Response {
    let text = crate::metrics::render(&s.job);
    let accept = headers.get(header::ACCEPT).and_then(|a| a.to_str().ok()).unwrap_or("");
    if accept.contains("application/openmetrics-text") {
        ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response()
    } else {
        let text = crate::metrics::to_text_format(&text);
        ([(header::CONTENT_TYPE, crate::metrics::TEXT_CONTENT_TYPE)], text).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A folder inside a root by its text and outside it through a link is outside; a link
    /// to nothing is refused (made, the folder would be its target); a `..` is refused
    /// before anything is resolved.
    #[test]
    fn savepoint_roots_are_checked_where_the_file_system_leads() {
        let dir = tempfile::tempdir().unwrap();
        let (root, elsewhere) = (dir.path().join("root"), dir.path().join("elsewhere"));
        std::fs::create_dir_all(root.join("plain")).unwrap();
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, root.join("link")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("none"), root.join("dangling")).unwrap();
        let roots = [root.display().to_string()];
        let check = |d: &std::path::Path| within_roots(&roots, &d.display().to_string()).map_err(|r| (r.0, r.1));
        assert!(check(&root.join("plain/new/deeper")).is_ok());
        assert!(check(&root.join("not-yet")).is_ok());
        for outside in [root.join("link"), root.join("link/deep"), root.join("dangling/x"), elsewhere.clone()] {
            let (status, why) = check(&outside).unwrap_err();
            assert!(status == StatusCode::FORBIDDEN && why.contains("outside"), "{}: {why}", outside.display());
        }
        let (_, why) = check(&root.join("..").join("elsewhere")).unwrap_err();
        assert!(why.contains("'..'"), "{why}");
        assert!(within_roots(&["s3://b/p".into()], "s3://b/p/sp").is_ok());
        assert!(within_roots(&["s3://b/p".into()], "s3://b/pp").is_err());
        assert!(within_roots(&[], "/anywhere").is_ok(), "no roots: anywhere");
    }

    /// A trigger's outcome is awaited until it was polled; one in progress is awaited too.
    #[test]
    fn triggers_are_awaited_until_their_outcome_is_read() {
        let mut t = Triggers::default();
        assert!(!t.awaited());
        let id = t.start().unwrap();
        assert!(t.awaited(), "in progress");
        assert!(matches!(t.read(&id), Some(TriggerState::InProgress)));
        t.finish(&id, Ok("/sp/savepoint-3".into()));
        assert!(t.awaited(), "completed and not yet read");
        assert!(matches!(t.read(&id), Some(TriggerState::Completed(l)) if l == "/sp/savepoint-3"));
        assert!(!t.awaited(), "read");
        assert!(t.read("nobody").is_none());
        for _ in 0..TRIGGERS_IN_PROGRESS {
            t.start().unwrap();
        }
        assert!(t.start().is_none(), "at most {TRIGGERS_IN_PROGRESS} in progress");
    }
}
