//! Process-wide state behind the Python API: who initialized MPI, ringlet's communicator, the
//! calling threads' keys, and finalization. MPI is finalized only if ringlet initialized it,
//! and only after ringlet's communicator is freed (freeing after MPI_Finalize aborts the
//! process).

use super::communicator::{Communicator, Options, Settings};
use super::mpi_library;
use super::stall::{stderr_sink, StallPolicy};
use crate::error::{CoreError, Result};
use crate::kernels::Level;
pub use crate::transport::environment::Parent;
use crate::transport::environment::{self, StartedMpi, ThreadLevel};
use crate::transport::mpi::MpiTransport;
use crate::transport::mpi_shm::Unavailable;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

struct State {
    /// Present when ringlet called MPI_Init_thread; dropping it calls MPI_Finalize.
    started_mpi: Option<StartedMpi>,
    /// ringlet's communicator; `None` before `init` and after `shutdown`.
    communicator: Option<Communicator<MpiTransport>>,
    threading: ThreadLevel,
    /// The process sets this rank belongs to, by id.
    sets: BTreeMap<SetId, Communicator<MpiTransport>>,
    /// The ranks of every process set added on ringlet's communicator, by id; every rank
    /// numbers them alike, members or not.
    set_ranks: BTreeMap<SetId, Vec<usize>>,
    next_set: SetId,
    /// Communicators put away by `shutdown` or a new `init`, kept to take the departure
    /// notices that still arrive on them before MPI finalizes (see [`State::retire`]).
    retired: Vec<Communicator<MpiTransport>>,
}

/// Which communicator a collective runs on: [`WORLD`], ringlet's own, or a process set's.
pub type SetId = u32;

/// ringlet's communicator (MPI_COMM_WORLD's duplicate, or the one `init` was given).
pub const WORLD: SetId = 0;

// SAFETY: `StartedMpi` holds no thread-bound state (rsmpi's universe: an optional attached
// buffer), and the communicator's transport is Send (see MpiTransport); both are only touched
// under the mutex, and finalizing MPI happens in `finalize` under the mutex.
unsafe impl Send for State {}

static STATE: Mutex<State> = Mutex::new(State {
    started_mpi: None,
    communicator: None,
    threading: ThreadLevel::Single,
    sets: BTreeMap::new(),
    set_ranks: BTreeMap::new(),
    next_set: WORLD + 1,
    retired: Vec::new(),
});

/// Whether ringlet's communicator exists, readable without the state's lock: a collective
/// holds that lock while it runs, and a thread that only asks (as every Python call does
/// first) must not wait for a collective that may itself wait for this thread's next step.
/// Written only by [`State::publish`].
static INITIALIZED: AtomicBool = AtomicBool::new(false);

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

/// Initialize MPI if nobody has (asking for MPI_THREAD_MULTIPLE) and set up ringlet's
/// communicator as a duplicate of `parent`. With `Parent::World` and a communicator already set
/// up, this does nothing; with a user's communicator it replaces the current one.
pub fn init(parent: Parent) -> Result<InitInfo> {
    let mut state = state();
    if environment::is_finalized() {
        return Err(CoreError::Communication(
            "MPI has already been finalized in this process; it cannot be started again".into(),
        ));
    }
    let mut options = options_from_env()?;
    if state.started_mpi.is_none() {
        let (started_mpi, threading) = environment::initialize();
        state.started_mpi = started_mpi;
        state.threading = threading;
    }
    mpi_library::check_runtime()?;
    options.host = environment::processor_name();
    let replace = matches!(parent, Parent::Fortran(_)) || state.communicator.is_none();
    if replace {
        let handle = parent.handle()?;
        // Retire the old duplicate first, and the process sets made from it, telling their
        // other ranks (which replace theirs too).
        state.depart();
        state.retire();
        let mut transport = handle.duplicate()?;
        transport.attach_shared_memory(env_flag("RINGLET_SHM", true)?)?;
        state.communicator = Some(Communicator::new(transport, options)?);
        crate::auto::clear(); // its choices were for the previous communicator
    }
    state.publish();
    Ok(InitInfo {
        owns_mpi: state.started_mpi.is_some(),
        thread_level: state.threading.name(),
    })
}

/// The communicator's set-up from the environment, checked before MPI starts.
fn options_from_env() -> Result<Options> {
    Level::ceiling_from_env()?;
    Ok(Options {
        check: env_flag("RINGLET_CHECK", true)?,
        stall: StallPolicy {
            warning: env_seconds("RINGLET_STALL_WARNING", Some(60.0))?,
            timeout: env_seconds("RINGLET_TIMEOUT", None)?,
        },
        host: String::new(), // known once MPI runs
        ranks: Vec::new(),
        sink: stderr_sink(),
        explore: env_flag("RINGLET_EXPLORE", true)?,
    })
}

pub fn is_initialized() -> bool {
    INITIALIZED.load(Ordering::Acquire)
}

/// Run `f` with the communicator of process set `set`; calls from several threads are
/// serialized here.
pub fn with_communicator<R>(set: SetId, f: impl FnOnce(&Communicator) -> Result<R>) -> Result<R> {
    f(state().member_communicator(set)?)
}

/// Whether process set `set` has the node's shared memory, and if not, why not and whether that
/// deserves a warning (it failed, rather than being off or impossible).
pub fn shared_memory(set: SetId) -> Result<(bool, String, bool)> {
    let state = state();
    Ok(
        match state
            .member_communicator(set)?
            .transport()
            .shared_memory_unavailable()
        {
            None => (true, String::new(), false),
            Some(why) => (
                false,
                why.to_string(),
                matches!(why, Unavailable::Failed(_)),
            ),
        },
    )
}

/// Add a process set of `ranks` (sorted, distinct ranks of ringlet's communicator) and return
/// its id. Collective over ringlet's communicator: every rank calls it with the same ranks,
/// members or not (the caller has agreed on them), after any queued work.
pub fn add_process_set(ranks: &[usize]) -> Result<SetId> {
    let mut state = state();
    let world = state.communicator.as_ref().ok_or_else(not_initialized)?;
    let ordered = ranks.windows(2).all(|pair| pair[0] < pair[1]);
    if ranks.is_empty() || !ordered || ranks.iter().any(|&r| r >= world.size()) {
        return Err(CoreError::InvalidArgument(format!(
            "a process set needs distinct ranks in increasing order, each below {}; got {ranks:?}",
            world.size()
        )));
    }
    let settings = world.settings();
    let part = world
        .transport()
        .split(ranks.binary_search(&world.rank()).is_ok())?;
    let id = state.next_set;
    if let Some(mut transport) = part {
        transport.attach_shared_memory(env_flag("RINGLET_SHM", true)?)?;
        let mut options = options_from_env()?;
        options.host = environment::processor_name();
        options.ranks = ranks.to_vec();
        let mut communicator = Communicator::new(transport, options)?;
        communicator.set_settings(settings)?;
        state.sets.insert(id, communicator);
    }
    state.set_ranks.insert(id, ranks.to_vec());
    state.next_set += 1;
    Ok(id)
}

/// A new communicator over the ranks of process set `set` (ringlet's own for [`WORLD`]), for
/// traffic of its own (a doorbell's). Collective over the set's members.
pub fn duplicate(set: SetId) -> Result<MpiTransport> {
    state()
        .member_communicator(set)?
        .transport()
        .split(true)?
        .ok_or_else(|| CoreError::Communication("MPI_Comm_split left this rank out".into()))
}

/// The thread level MPI granted (single before `init`).
pub fn thread_level() -> ThreadLevel {
    state().threading
}

/// Free process set `set`'s communicator; false if there is no such set (the world cannot be
/// removed). Local: no message is sent.
pub fn remove_process_set(set: SetId) -> bool {
    let mut state = state();
    state.sets.remove(&set);
    state.set_ranks.remove(&set).is_some()
}

/// Every process set's id and ranks, the world's included.
pub fn process_sets() -> Result<Vec<(SetId, Vec<usize>)>> {
    let state = state();
    let world = state.communicator.as_ref().ok_or_else(not_initialized)?;
    let everyone = (WORLD, (0..world.size()).collect());
    let added = state
        .set_ranks
        .iter()
        .map(|(&id, ranks)| (id, ranks.clone()));
    Ok(std::iter::once(everyone).chain(added).collect())
}

impl State {
    /// Make [`is_initialized`] tell the truth; called after every change of the communicator.
    fn publish(&self) {
        INITIALIZED.store(self.communicator.is_some(), Ordering::Release);
    }

    /// Tell the other ranks of every communicator this rank is in that it leaves them.
    fn depart(&self) {
        for communicator in self.sets.values().chain(&self.communicator) {
            communicator.depart();
        }
    }

    /// Put away ringlet's communicator and its process sets without freeing them (they go with
    /// MPI_Finalize): a departure notice that another rank sent at the same time may still
    /// arrive on them. Freed, their context id could be reused by the next communicator, and
    /// Open MPI hands a message for a context id that has no communicator yet to the next one
    /// made with it, where it breaks the order of that communicator's messages (a hang, seen
    /// with `shutdown()` then `init()`).
    fn retire(&mut self) {
        let sets = std::mem::take(&mut self.sets).into_values();
        self.retired.extend(sets.chain(self.communicator.take()));
        self.publish();
        self.clear_sets();
    }

    /// Every communicator this rank has made and not freed, retired or not.
    fn all_communicators(&self) -> impl Iterator<Item = &Communicator<MpiTransport>> {
        self.sets
            .values()
            .chain(&self.communicator)
            .chain(&self.retired)
    }

    /// Wait, up to `grace`, until every other rank of every communicator has said that it
    /// leaves too, taking their notices: MPICH over UCX prints a warning for every message left
    /// unreceived at MPI_Finalize, into the program's output. Ranks that end together meet here
    /// at once; a rank that ends later costs at most `grace`, and MPI_Finalize waits for it
    /// anyway.
    fn hear_departures(&self, grace: Duration) {
        let start = Instant::now();
        while !self.all_communicators().all(|c| c.all_others_departed()) {
            if start.elapsed() >= grace {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The communicator of process set `set` ([`WORLD`]: ringlet's own), which this rank must
    /// belong to and which must exist.
    fn member_communicator(&self, set: SetId) -> Result<&Communicator<MpiTransport>> {
        let world = self.communicator.as_ref().ok_or_else(not_initialized)?;
        if set == WORLD {
            return Ok(world);
        }
        match (self.sets.get(&set), self.set_ranks.get(&set)) {
            (Some(communicator), _) => Ok(communicator),
            (None, Some(ranks)) => Err(CoreError::InvalidArgument(format!(
                "rank {} is not in process set {set} (ranks {ranks:?}); only its members may call \
                 its collectives",
                world.rank()
            ))),
            (None, None) => Err(CoreError::InvalidArgument(format!(
                "process set {set} does not exist (it was removed, or never added)"
            ))),
        }
    }

    fn clear_sets(&mut self) {
        self.sets.clear();
        self.set_ranks.clear();
        self.next_set = WORLD + 1;
    }
}

/// Change the settings of ringlet's communicator and of its process sets.
pub fn update_settings(change: impl FnOnce(&mut Settings)) -> Result<Settings> {
    let mut state = state();
    let State {
        communicator, sets, ..
    } = &mut *state;
    let communicator = communicator.as_mut().ok_or_else(not_initialized)?;
    let mut settings = communicator.settings();
    change(&mut settings);
    communicator.set_settings(settings)?;
    for set in sets.values_mut() {
        set.set_settings(settings)?;
    }
    // The model's parameters stay: each communicator's decision table is rebuilt with the new
    // settings at its next `auto` call (a process set could not install them again alone).
    Ok(settings)
}

fn not_initialized() -> CoreError {
    CoreError::Communication("ringlet is not initialized: call ringlet.init() first".into())
}

fn env_seconds(name: &str, default: Option<f64>) -> Result<Option<Duration>> {
    let value = match std::env::var(name) {
        Ok(text) => text
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .ok_or_else(|| {
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

static NEXT_CALLER: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static CALLER: Cell<Option<u64>> = const { Cell::new(None) };
    /// The Python layer has named this thread ([`set_caller_thread`]).
    static NAMED: Cell<bool> = const { Cell::new(false) };
}

/// Name this thread for the consistency check (the Python layer passes a hash of the Python
/// thread's name, which is the same on every rank when threads are created in the same order).
pub fn set_caller_thread(key: u64) {
    CALLER.with(|caller| caller.set(Some(key)));
    NAMED.with(|named| named.set(true));
}

/// Whether the Python layer has named this thread: the fast paths leave a thread it has not
/// named to the Python layer, which names it first (a thread-local flag here costs less than
/// the Python layer's own check on every call).
pub fn caller_named() -> bool {
    NAMED.with(Cell::get)
}

/// Run `f` as caller `key`, then give the thread its own key back (XLA runs ringlet's
/// collectives on threads that may also be Python's).
pub fn as_caller<R>(key: u64, f: impl FnOnce() -> R) -> R {
    let previous = CALLER.with(|caller| caller.replace(Some(key)));
    let result = f();
    CALLER.with(|caller| caller.set(previous));
    result
}

/// Why collective calls are refused on threads not let through ([`let_through`]), if they are:
/// set while another layer (`ringlet.hvd`'s name matching) must be the only one that issues
/// collectives, lest a call meet its collectives in a different order on different ranks.
static EXCLUSIVE: Mutex<Option<String>> = Mutex::new(None);
/// Whether `EXCLUSIVE` holds a reason: every collective call reads this, not the mutex.
static EXCLUSIVE_ON: AtomicBool = AtomicBool::new(false);

thread_local! {
    static LET_THROUGH: Cell<bool> = const { Cell::new(false) };
}

/// Refuse, from now on, every collective call made on a thread not let through, saying
/// `reason`; `None` ends it. Local: the refusal sends nothing, so ranks stay in step.
pub fn set_exclusive(reason: Option<String>) {
    let mut exclusive = EXCLUSIVE.lock().unwrap_or_else(|e| e.into_inner());
    EXCLUSIVE_ON.store(reason.is_some(), Ordering::Release);
    *exclusive = reason;
}

/// Let this thread's collective calls through while collectives are exclusive (or not); the
/// previous setting.
pub fn let_through(on: bool) -> bool {
    LET_THROUGH.with(|flag| flag.replace(on))
}

/// This thread's key for a call of collective `what` ([`caller_thread`]), unless collectives
/// are exclusive to another layer and this thread is not let through.
pub fn caller_for(what: &str) -> Result<u64> {
    if EXCLUSIVE_ON.load(Ordering::Acquire) && !LET_THROUGH.with(Cell::get) {
        if let Some(reason) = EXCLUSIVE.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            return Err(CoreError::Communication(format!(
                "{what} refused: {reason}"
            )));
        }
    }
    Ok(caller_thread())
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

/// Free ringlet's communicator. MPI itself stays up (it cannot be restarted), so `init` may
/// be called again.
pub fn shutdown() {
    let mut state = state();
    state.depart();
    state.retire();
    crate::auto::clear();
}

/// At interpreter exit: free the communicator, then finalize MPI if ringlet started it.
/// Returns whether MPI_Finalize was called.
pub fn finalize() -> bool {
    let mut state = state();
    if !environment::is_finalized() {
        state.depart();
        state.hear_departures(FINALIZE_GRACE);
    }
    for (_, set) in std::mem::take(&mut state.sets) {
        set.into_transport().release();
    }
    state.clear_sets();
    if let Some(communicator) = state.communicator.take() {
        communicator.into_transport().release();
    }
    state.publish();
    for communicator in std::mem::take(&mut state.retired) {
        communicator.into_transport().retire();
    }
    state.started_mpi.take().is_some_and(StartedMpi::finalize)
}

/// How long `finalize` waits for the other ranks to end too (see [`State::hear_departures`]).
const FINALIZE_GRACE: Duration = Duration::from_secs(2);

/// End every process of the job now (MPI_Abort on MPI_COMM_WORLD).
pub fn abort(code: i32) -> ! {
    crate::transport::mpi::abort(code)
}
