//! The background communication thread: queued collectives run here one at a time, in
//! submission order, so every rank issues them in the same order while Python goes on.
//!
//! A synchronous collective submitted while the queue is busy waits its turn in the same queue;
//! when the queue is idle it runs on the caller's thread (no hand-off cost). Either way calls
//! are serialized by the runtime's mutex, which MPI_THREAD_SERIALIZED or better makes legal.

use crate::error::{CoreError, Result};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

type Work = Box<dyn FnOnce() -> Result<()> + Send>;
type Queue = Mutex<Sender<(Work, Arc<Completion>)>>;

/// The outcome of a queued collective, once it is known, and when it ran.
pub struct Completion {
    outcome: Mutex<Option<Result<()>>>,
    ready: Condvar,
    submitted: Instant,
    /// When the comm thread started it and when it finished.
    ran: Mutex<(Option<Instant>, Option<Instant>)>,
}

impl Completion {
    fn new() -> Self {
        Completion {
            outcome: Mutex::new(None),
            ready: Condvar::new(),
            submitted: Instant::now(),
            ran: Mutex::new((None, None)),
        }
    }

    fn start(&self) {
        self.ran.lock().unwrap_or_else(|e| e.into_inner()).0 = Some(Instant::now());
    }

    fn finish(&self, outcome: Result<()>) {
        self.ran.lock().unwrap_or_else(|e| e.into_inner()).1 = Some(Instant::now());
        *self.outcome.lock().unwrap_or_else(|e| e.into_inner()) = Some(outcome);
        self.ready.notify_all();
    }

    /// Once it has run: how long it waited in the queue, and how long it ran.
    pub fn timing(&self) -> Option<(Duration, Duration)> {
        match *self.ran.lock().unwrap_or_else(|e| e.into_inner()) {
            (Some(started), Some(finished)) => Some((
                started.duration_since(self.submitted),
                finished.duration_since(started),
            )),
            _ => None,
        }
    }

    pub fn is_done(&self) -> bool {
        self.outcome
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// Block until the collective has run; its error, if any, every time it is asked.
    pub fn wait(&self) -> Result<()> {
        let mut outcome = self.outcome.lock().unwrap_or_else(|e| e.into_inner());
        while outcome.is_none() {
            outcome = self.ready.wait(outcome).unwrap_or_else(|e| e.into_inner());
        }
        outcome.clone().unwrap_or(Ok(()))
    }
}

static PENDING: AtomicUsize = AtomicUsize::new(0);
static QUEUE: OnceLock<Queue> = OnceLock::new();

fn queue() -> Result<&'static Queue> {
    if let Some(queue) = QUEUE.get() {
        return Ok(queue);
    }
    let (sender, receiver) = channel::<(Work, Arc<Completion>)>();
    std::thread::Builder::new()
        .name("ringlet-comm".into())
        .spawn(move || {
            for (work, completion) in receiver {
                completion.start();
                let outcome = catch_unwind(AssertUnwindSafe(work)).unwrap_or_else(|_| {
                    Err(CoreError::Communication(
                        "internal error: a queued collective panicked".into(),
                    ))
                });
                PENDING.fetch_sub(1, Ordering::SeqCst);
                completion.finish(outcome);
            }
        })
        .map_err(|e| CoreError::Communication(format!("cannot start the comm thread: {e}")))?;
    Ok(QUEUE.get_or_init(|| Mutex::new(sender)))
}

/// Queue `work`; it runs after everything queued before it.
pub fn submit(work: Work) -> Result<Arc<Completion>> {
    let completion = Arc::new(Completion::new());
    PENDING.fetch_add(1, Ordering::SeqCst);
    let sent = queue()?
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((work, completion.clone()));
    if sent.is_err() {
        PENDING.fetch_sub(1, Ordering::SeqCst);
        return Err(CoreError::Communication(
            "the comm thread has stopped".into(),
        ));
    }
    Ok(completion)
}

/// A queued job's completion, and the slot its result lands in once it has run.
pub struct Queued<T> {
    pub completion: Arc<Completion>,
    pub result: Arc<Mutex<Option<T>>>,
}

/// Queue `work`; its result goes to the handle's slot (its error, to the completion).
pub fn submit_for_result<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<Queued<T>> {
    let result = Arc::new(Mutex::new(None));
    let slot = result.clone();
    let completion = submit(Box::new(move || {
        let value = work()?;
        *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(value);
        Ok(())
    }))?;
    Ok(Queued { completion, result })
}

/// Run `work` after everything already queued: at once if the queue is idle.
pub fn run_in_order<R: Send>(work: impl FnOnce() -> Result<R> + Send) -> Result<R> {
    if PENDING.load(Ordering::SeqCst) == 0 {
        return work();
    }
    // The queue needs 'static work; hand it over and wait, so borrowed data outlives it.
    let (done_sender, done) = channel::<Result<R>>();
    let job = move || {
        let outcome = work();
        let status = outcome.as_ref().map(|_| ()).map_err(Clone::clone);
        let _ = done_sender.send(outcome);
        status
    };
    let job: Box<dyn FnOnce() -> Result<()> + Send + '_> = Box::new(job);
    // SAFETY: we block below until the comm thread has run `job` (or dropped it, which
    // disconnects the channel), so everything it borrows stays alive for as long as it exists.
    let job: Work =
        unsafe { std::mem::transmute::<Box<dyn FnOnce() -> Result<()> + Send + '_>, Work>(job) };
    submit(job)?;
    done.recv().unwrap_or_else(|_| {
        Err(CoreError::Communication(
            "the comm thread dropped a collective".into(),
        ))
    })
}
