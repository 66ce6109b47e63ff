//! Process-wide MPI state behind the Python API: who initialized MPI, ringlet's communicator,
//! and finalization. MPI is finalized only if ringlet initialized it, and only after ringlet's
//! communicator is freed (freeing after MPI_Finalize aborts the process).

use crate::consistency::{self, Call, Kind};
use crate::error::{CoreError, Result};
use crate::transport::mpi::{check, MpiTransport, StallPolicy};
use mpi::environment::Universe;
use mpi::ffi;
use mpi::Threading;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

struct State {
    /// Present when ringlet called MPI_Init_thread; dropping it calls MPI_Finalize.
    universe: Option<Universe>,
    /// ringlet's duplicate communicator; `None` before `init` and after `shutdown`.
    transport: Option<MpiTransport>,
    threading: Threading,
}

// SAFETY: `Universe` holds no thread-bound state (an optional attached buffer); it is only
// touched under the mutex, and dropping it (MPI_Finalize) happens in `finalize` under the mutex.
unsafe impl Send for State {}

static STATE: Mutex<State> = Mutex::new(State {
    universe: None,
    transport: None,
    threading: Threading::Single,
});

fn state() -> MutexGuard<'static, State> {
    // A panic while holding the lock is caught at the binding edge; the state stays consistent
    // because every mutation is a single assignment.
    STATE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[derive(Debug, Clone)]
pub struct InitInfo {
    /// ringlet called MPI_Init_thread (and will call MPI_Finalize at exit).
    pub owns_mpi: bool,
    /// The thread level MPI granted: "single", "funneled", "serialized" or "multiple".
    pub thread_level: &'static str,
}

fn level_name(threading: Threading) -> &'static str {
    match threading {
        Threading::Single => "single",
        Threading::Funneled => "funneled",
        Threading::Serialized => "serialized",
        Threading::Multiple => "multiple",
    }
}

/// Where ringlet's communicator comes from.
pub enum Parent {
    World,
    /// A Fortran handle (`MPI_Comm_c2f`), which is how mpi4py hands out communicators portably
    /// across MPI libraries (`Comm.py2f()`).
    Fortran(i64),
}

/// Initialize MPI if nobody has (asking for MPI_THREAD_MULTIPLE) and set up ringlet's
/// communicator as a duplicate of `parent`. With `Parent::World` and a communicator already set
/// up, this does nothing; with a user's communicator it replaces the current one.
pub fn init(parent: Parent) -> Result<InitInfo> {
    let mut state = state();
    if mpi::is_finalized() {
        return Err(CoreError::Communication(
            "MPI has already been finalized in this process; it cannot be started again".into(),
        ));
    }
    if state.universe.is_none() {
        match mpi::initialize_with_threading(Threading::Multiple) {
            Some((universe, granted)) => {
                state.universe = Some(universe);
                state.threading = granted;
            }
            None => state.threading = mpi::environment::threading_support(),
        }
    }
    let replace = matches!(parent, Parent::Fortran(_)) || state.transport.is_none();
    if replace {
        // SAFETY: reading the predefined COMM_WORLD handle, or converting a Fortran handle; the
        // Python layer passes only `py2f()` of a live mpi4py communicator.
        let handle = unsafe {
            match parent {
                Parent::World => ffi::RSMPI_COMM_WORLD,
                Parent::Fortran(fortran) => {
                    let fint = ffi::RSMPI_Fint::try_from(fortran).map_err(|_| {
                        CoreError::InvalidArgument(format!("{fortran} is not a Fortran handle"))
                    })?;
                    ffi::RSMPI_Comm_f2c(fint)
                }
            }
        };
        if handle == unsafe_comm_null() {
            return Err(CoreError::InvalidArgument(
                "the communicator is MPI_COMM_NULL".into(),
            ));
        }
        let stall = stall_policy()?;
        CHECK.store(env_flag("RINGLET_CHECK", true)?, Ordering::Relaxed);
        // SAFETY: MPI is initialized (above) and `handle` is a live communicator (see above).
        let mut transport = unsafe { MpiTransport::duplicate(handle)? };
        transport.stall = stall;
        state.transport = Some(transport);
        crate::auto::clear(); // its choices were for the previous communicator
    }
    Ok(InitInfo {
        owns_mpi: state.universe.is_some(),
        thread_level: level_name(state.threading),
    })
}

fn unsafe_comm_null() -> ffi::MPI_Comm {
    // SAFETY: reading a predefined handle constant.
    unsafe { ffi::RSMPI_COMM_NULL }
}

pub fn is_initialized() -> bool {
    state().transport.is_some()
}

/// Run `f` with ringlet's communicator; calls from several threads are serialized here.
pub fn with_transport<R>(f: impl FnOnce(&MpiTransport) -> Result<R>) -> Result<R> {
    let state = state();
    let transport = state.transport.as_ref().ok_or_else(|| {
        CoreError::Communication("ringlet is not initialized: call ringlet.init() first".into())
    })?;
    f(transport)
}

/// Whether every collective is checked for agreement first (`RINGLET_CHECK`, default on).
static CHECK: AtomicBool = AtomicBool::new(true);

fn env_seconds(name: &str, default: Option<f64>) -> Result<Option<Duration>> {
    let value = match std::env::var(name) {
        Ok(text) => text.trim().parse::<f64>().map_err(|_| {
            CoreError::InvalidArgument(format!("{name}={text:?} is not a number of seconds"))
        })?,
        Err(_) => match default {
            Some(seconds) => seconds,
            None => return Ok(None),
        },
    };
    // 0 (or less) turns it off.
    Ok((value > 0.0).then(|| Duration::from_secs_f64(value)))
}

fn env_flag(name: &str, default: bool) -> Result<bool> {
    match std::env::var(name).as_deref() {
        Err(_) => Ok(default),
        Ok("1" | "true" | "on" | "yes") => Ok(true),
        Ok("0" | "false" | "off" | "no") => Ok(false),
        Ok(other) => Err(CoreError::InvalidArgument(format!(
            "{name}={other:?}: expected 1 or 0"
        ))),
    }
}

/// `RINGLET_STALL_WARNING` (default 60 s) and `RINGLET_TIMEOUT` (default off), in seconds.
fn stall_policy() -> Result<StallPolicy> {
    Ok(StallPolicy {
        warning: env_seconds("RINGLET_STALL_WARNING", Some(60.0))?,
        timeout: env_seconds("RINGLET_TIMEOUT", None)?,
    })
}

static NEXT_CALLER: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static CALLER: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Name this thread for the consistency check (the Python layer passes a hash of the Python
/// thread's name, which is the same on every rank when threads are created in the same order).
pub fn set_caller_thread(key: u64) {
    CALLER.with(|caller| caller.set(Some(key)));
}

/// This thread's key: what the Python layer set, else its number among the threads that made
/// collective calls, in order of first use.
pub fn caller_thread() -> u64 {
    CALLER.with(|caller| {
        caller.get().unwrap_or_else(|| {
            let id = NEXT_CALLER.fetch_add(1, Ordering::Relaxed);
            caller.set(Some(id));
            id
        })
    })
}

/// Number `call`, and unless `RINGLET_CHECK=0`, make sure every rank is making the same call.
pub fn agree(transport: &MpiTransport, call: Call) -> Result<()> {
    let seq = transport.begin(call);
    if CHECK.load(Ordering::Relaxed) {
        consistency::agree(transport, seq, &call)?;
    }
    Ok(())
}

/// One allreduce on ringlet's communicator, checked, counted in [`crate::stats`].
pub fn allreduce(
    schedule: &'static dyn crate::schedules::Schedule,
    buf: &mut [u8],
    dtype: crate::dtype::DType,
    op: crate::dtype::ReduceOp,
    thread: u64,
) -> Result<()> {
    crate::worker::run_in_order(|| {
        with_transport(|transport| {
            let call = Call {
                kind: Kind::Allreduce,
                dtype: Some(dtype),
                op: Some(op),
                count: (buf.len() / dtype.size()) as u64,
                algorithm: schedule.name(),
                root: 0,
                thread,
            };
            agree(transport, call)?;
            let started = std::time::Instant::now();
            crate::schedules::allreduce(transport, schedule, buf, dtype, op)?;
            crate::stats::record(schedule.name(), buf.len(), started.elapsed());
            Ok(())
        })
    })
}

/// Free ringlet's communicator. MPI itself stays up (it cannot be restarted), so `init` may
/// be called again.
pub fn shutdown() {
    state().transport = None;
    crate::auto::clear();
}

/// At interpreter exit: free the communicator, then finalize MPI if ringlet started it.
/// Returns whether MPI_Finalize was called.
pub fn finalize() -> bool {
    let mut state = state();
    state.transport = None;
    match state.universe.take() {
        Some(universe) if !mpi::is_finalized() => {
            drop(universe);
            true
        }
        Some(universe) => {
            // Someone else finalized already; dropping would finalize twice.
            std::mem::forget(universe);
            false
        }
        None => false,
    }
}

/// The MPI library's own description of itself, e.g. "Open MPI v4.1.4, ...".
pub fn library_version() -> Result<String> {
    let mut text = vec![0u8; ffi::MPI_MAX_LIBRARY_VERSION_STRING as usize + 1];
    let mut len = 0;
    // SAFETY: `text` has room for MPI_MAX_LIBRARY_VERSION_STRING bytes; callable before init.
    let code = unsafe { ffi::MPI_Get_library_version(text.as_mut_ptr().cast(), &mut len) };
    check(code, "MPI_Get_library_version")?;
    text.truncate(len.max(0) as usize);
    Ok(String::from_utf8_lossy(&text).trim_end().to_string())
}
