//! Watching a running job: the progress line, the job's notes above it, Ctrl-C and SIGTERM
//! (the first stops the job with a savepoint or gracefully, the second cancels it), and the
//! report when it ends.
//!
//! May touch: `control` (the stops it is asked for), `stored` (where a savepoint goes); the job's
//! handle.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use weir::metrics::group_digits;
use weir::{Job, JobHandle, JobReport};

use crate::control::{ControlEndpoint, StopRefused};

/// Ctrl-C presses (and SIGTERMs) so far: the first stops the job gracefully, the second
/// cancels it. Counted from the start of the process ([`install_stop_handler`]).
pub static STOP_REQUESTS: AtomicUsize = AtomicUsize::new(0);

/// Whether a running job is watched ([`supervise`]); until then, a job is starting.
pub static SUPERVISED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether [`install_stop_handler`] installed the process's handler.
static HANDLER_INSTALLED: std::sync::Mutex<bool> = std::sync::Mutex::new(false);

/// Counts Ctrl-C presses and SIGTERMs from now on. While the job is still starting
/// (restoring its state) the first says the job stops once it runs, the second quits at once,
/// which is as safe as a crash: nothing of the checkpoint directory is lost.
///
/// A process has one handler: where the program installed its own, this one is not
/// installed, and the error says so (the signals stay the program's). Calling it again once
/// installed does nothing.
pub fn install_stop_handler() -> weir::Result<()> {
    let mut installed = HANDLER_INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
    if *installed {
        return Ok(());
    }
    ctrlc::set_handler(move || {
        let n = STOP_REQUESTS.fetch_add(1, Ordering::SeqCst) + 1;
        if SUPERVISED.load(Ordering::SeqCst) {
            return;
        }
        if n == 1 {
            eprintln!(
                "stop requested (Ctrl-C or SIGTERM) while the job is starting: it stops as soon as it runs; \
                 press Ctrl-C again to quit now"
            );
        } else {
            eprintln!("quit while the job was starting: its checkpoints are as they were; run it again to resume");
            std::process::exit(130);
        }
    })
    .map_err(|e| {
        weir::Error::config(format!(
            "cannot stop the job on Ctrl-C and SIGTERM: {} (the program's own, which stays); stop the job \
             through its handle or the control endpoint instead, without handle_signals",
            match e {
                ctrlc::Error::MultipleHandlers => "a handler is already installed".to_string(),
                e => e.to_string(),
            }
        ))
    })?;
    *installed = true;
    Ok(())
}

/// Starts `job` (saying what it restores) and serves the control endpoint `binding` (bound
/// before, so that a bad address stopped nothing) on it, saying where on standard error.
pub fn start_with_control(
    job: Job,
    config: weir::RunConfig,
    binding: Option<crate::control::ControlBinding>,
) -> weir::Result<(JobHandle, Option<ControlEndpoint>)> {
    let handle = announce_restores(job).start(config)?;
    let Some(binding) = binding else { return Ok((handle, None)) };
    let endpoint = binding.serve(handle.controller())?;
    eprintln!("control endpoint: http://{} (weir control {} …)", endpoint.addr(), endpoint.addr());
    Ok((handle, Some(endpoint)))
}

/// Asks `job` to say what it restores, on standard error, as it starts.
pub fn announce_restores(job: Job) -> Job {
    job.on_restore(|line| eprintln!("{line}"))
}

/// Prints the job's notes not shown yet (restores, skipped checkpoints, failovers) on
/// standard error, above the progress line when there is one.
pub fn show_notes(handle: &JobHandle, bar: &indicatif::ProgressBar, shown: &mut usize) {
    let notes = handle.notes();
    for note in &notes[(*shown).min(notes.len())..] {
        if bar.is_hidden() {
            eprintln!("{note}");
        } else {
            bar.println(note);
        }
    }
    *shown = notes.len();
}

/// Watches a running job: progress line, Ctrl-C, and an optional time limit.
/// Returns `None` when Ctrl-C stopped the job with a savepoint (after saying where).
pub fn supervise(
    handle: JobHandle,
    limit: Option<Duration>,
    progress: bool,
    savepoint_dir: Option<&crate::stored::SavepointDir>,
    control: Option<&ControlEndpoint>,
) -> weir::Result<Option<JobReport>> {
    match supervise_with(handle, limit, progress, savepoint_dir, control, &mut |_| Ok(false))? {
        Supervised::Finished(report) => Ok(Some(*report)),
        Supervised::Savepoint | Supervised::HandedOver => Ok(None),
    }
}

/// Says how a stop with a savepoint into `dir` ended (and where the savepoint is kept).
fn stopped_with_savepoint(
    dir: &crate::stored::SavepointDir,
    outcome: weir::Result<weir::Stopped>,
) -> weir::Result<(Supervised, String)> {
    match outcome? {
        weir::Stopped::Savepoint(path) => {
            let kept = dir.keep(&path)?;
            println!("stopped with savepoint {kept}");
            println!("the output it covers is committed");
            println!("resume with --restore {kept}");
            Ok((Supervised::Savepoint, kept))
        }
        weir::Stopped::Finished(report) => {
            println!(
                "the job was already reaching the end of its input, so it finished instead of taking a savepoint \
                 (no savepoint: nothing is left to resume)"
            );
            Ok((Supervised::Finished(Box::new(report)), String::new()))
        }
        weir::Stopped::Drained { savepoint, report } => {
            let kept = dir.keep(&savepoint)?;
            println!(
                "drained: every window fired and the output is committed; its final checkpoint is savepoint {kept}"
            );
            Ok((Supervised::Finished(Box::new(report)), kept))
        }
    }
}

/// How a supervised job ended.
#[derive(Debug)]
pub enum Supervised {
    /// It ran to its end (or failed: then `supervise_with` returns the error).
    Finished(Box<JobReport>),
    /// Ctrl-C (or the control endpoint) stopped it with a savepoint.
    Savepoint,
    /// `hand_over` asked it to stop: stopped with a savepoint, its output committed, and the
    /// savepoint's checkpoint the latest in its checkpoint directory.
    HandedOver,
}

/// The folder a stop the control endpoint asked for takes its savepoint into; `None`, the
/// request answered, where the job goes on (already stopping, or the folder cannot be made).
fn savepoint_folder_asked(
    request: &crate::control::StopRequest,
    stopped: bool,
    bar: &indicatif::ProgressBar,
) -> Option<crate::stored::SavepointDir> {
    if stopped {
        let _ = request.reply.send(Err(StopRefused::AlreadyStopping));
        return None;
    }
    let how = if request.drain { "draining, then stopping" } else { "stopping" };
    bar.println(format!("{how} with a savepoint into {} (asked by the control endpoint)…", request.dir.display()));
    match crate::stored::SavepointDir::open(&request.dir) {
        Ok(d) => Some(d),
        Err(e) => {
            // A folder that cannot be made: the job goes on.
            let _ = request.reply.send(Err(StopRefused::Failed(e.to_string())));
            None
        }
    }
}

/// Answers a stop the control endpoint asked for with how it `ended`.
fn answer_stop(
    request: crate::control::StopRequest,
    ended: weir::Result<(Supervised, String)>,
) -> weir::Result<Supervised> {
    let _ = request.reply.send(match &ended {
        // A savepoint, or a drain's (the job finished, and its last checkpoint was kept).
        Ok((_, kept)) if !kept.is_empty() => Ok(kept.clone()),
        Ok(_) => Err(StopRefused::Finished),
        Err(e) => Err(StopRefused::Failed(e.to_string())),
    });
    ended.map(|(s, _)| s)
}

/// [`supervise`], asking `hand_over` after every look at the job whether to stop it with a
/// savepoint now (a consumer group changing under it, or a member asked to leave: it sees
/// Ctrl-C first, in [`STOP_REQUESTS`]), and carrying out the stops `control` is asked for.
///
/// Once the job ended, the endpoint keeps serving as [`ControlEndpoint::linger`] says.
pub fn supervise_with(
    handle: JobHandle,
    limit: Option<Duration>,
    progress: bool,
    savepoint_dir: Option<&crate::stored::SavepointDir>,
    control: Option<&ControlEndpoint>,
    hand_over: &mut dyn FnMut(&JobHandle) -> weir::Result<bool>,
) -> weir::Result<Supervised> {
    let ended = watch(handle, limit, progress, savepoint_dir, control, hand_over);
    if let Some(control) = control {
        control.linger();
    }
    ended
}

/// Stops the job with a savepoint for a successor to take over from (whose checkpoint is in
/// the checkpoint directory: the savepoint's own copy goes).
fn hand_over_with_savepoint(handle: JobHandle, bar: &indicatif::ProgressBar) -> weir::Result<Supervised> {
    bar.println("handing over: stopping with a savepoint…");
    let scratch = crate::scratch_dir("handover");
    let stopped = handle.stop_with_savepoint(&scratch);
    bar.finish_and_clear();
    // The savepoint's copy is not needed: its checkpoint is in the checkpoint directory.
    let _ = std::fs::remove_dir_all(&scratch);
    match stopped? {
        weir::Stopped::Savepoint(_) => Ok(Supervised::HandedOver),
        weir::Stopped::Finished(report) | weir::Stopped::Drained { report, .. } => {
            Ok(Supervised::Finished(Box::new(report)))
        }
    }
}

/// The progress line, at most twice a second: time, records, rate and state memory.
fn show_progress(
    handle: &JobHandle,
    bar: &indicatif::ProgressBar,
    limit: Option<Duration>,
    last: &mut (u64, Duration),
) {
    let elapsed = handle.elapsed();
    let records = handle.metrics().source_records();
    let dt = (elapsed - last.1).as_secs_f64();
    if dt >= 0.5 {
        let rate = (records - last.0) as f64 / dt;
        let until = limit.map(|l| format!(" / {:.0} s", l.as_secs_f64())).unwrap_or_default();
        bar.set_message(format!(
            "{:.1} s{until} | {} records | {} records/s | state {:.1} MB",
            elapsed.as_secs_f64(),
            group_digits(records),
            group_digits(rate as u64),
            weir::state::state_memory_bytes() as f64 / 1e6
        ));
        bar.tick();
        *last = (records, elapsed);
    }
}

/// [`supervise_with`] until the job ended.
fn watch(
    mut handle: JobHandle,
    limit: Option<Duration>,
    progress: bool,
    savepoint_dir: Option<&crate::stored::SavepointDir>,
    control: Option<&ControlEndpoint>,
    hand_over: &mut dyn FnMut(&JobHandle) -> weir::Result<bool>,
) -> weir::Result<Supervised> {
    SUPERVISED.store(true, Ordering::SeqCst);
    let presses = &STOP_REQUESTS;
    let bar = if progress { indicatif::ProgressBar::new_spinner() } else { indicatif::ProgressBar::hidden() };
    let mut stopped = false;
    let mut cancelled = false;
    let mut last = (0u64, handle.elapsed());
    let mut notes_shown = 0;
    let result = loop {
        if let Some(result) = handle.try_finish() {
            break result;
        }
        show_notes(&handle, &bar, &mut notes_shown);
        std::thread::sleep(Duration::from_millis(100));
        if !stopped && hand_over(&handle)? {
            return hand_over_with_savepoint(handle, &bar);
        }
        if let Some(request) = control.and_then(ControlEndpoint::stop_request) {
            if let Some(dir) = savepoint_folder_asked(&request, stopped, &bar) {
                let outcome = match request.drain {
                    true => handle.stop_with_drain(dir.folder()),
                    false => handle.stop_with_savepoint(dir.folder()),
                };
                bar.finish_and_clear();
                return answer_stop(request, stopped_with_savepoint(&dir, outcome));
            }
        }
        let n = presses.load(Ordering::SeqCst);
        if n >= 1 && !stopped {
            if let Some(dir) = savepoint_dir {
                bar.println("stopping with a savepoint…");
                let outcome = handle.stop_with_savepoint(dir.folder());
                bar.finish_and_clear();
                return stopped_with_savepoint(dir, outcome).map(|(s, _)| s);
            }
            bar.println("Ctrl-C: stopping (press again to cancel)");
            handle.stop();
            stopped = true;
        }
        if n >= 2 && !cancelled {
            handle.cancel();
            cancelled = true;
        }
        let elapsed = handle.elapsed();
        if limit.is_some_and(|l| elapsed >= l) && !stopped {
            handle.stop();
            stopped = true;
        }
        show_progress(&handle, &bar, limit, &mut last);
    };
    bar.finish_and_clear();
    for note in &handle.notes()[notes_shown..] {
        eprintln!("{note}");
    }
    for failure in handle.checkpoint_failures() {
        eprintln!("{failure}");
    }
    result.map(|r| Supervised::Finished(Box::new(r)))
}
