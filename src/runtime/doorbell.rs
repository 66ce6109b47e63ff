//! A doorbell: a rank wakes the other ranks of a process set from a wait. Not a collective:
//! a ring is a notice to every other member, carrying a number whose meaning is the caller's
//! (`ringlet.hvd` rings with its negotiation's cycle number), and a wait ends at the first ring
//! that arrives, when another thread of its rank interrupts it, or at its limit.
//!
//! Why it exists: a background coordinator (`ringlet.hvd`'s negotiation) that has nothing to
//! do should send nothing and take no core, yet start at once when any rank has work. Timed
//! idle rounds cost every rank a collective per period, each waiting for the slowest rank's
//! timer; with a doorbell, an idle rank waits here (polling, with pauses that grow to the
//! caller's longest pause) until a rank that has work rings.
//!
//! A doorbell travels on a communicator of its own (a duplicate of the set's), so rings never
//! meet a collective's messages and need none of the locks a collective holds: ringing and
//! waiting go on while a collective runs on another thread, which MPI allows only at
//! MPI_THREAD_MULTIPLE ([`open`] refuses otherwise). Over any [`Transport`], so that `cargo
//! test` checks it on in-process ranks.

use super::process::{self, SetId};
use crate::error::{CoreError, Result};
use crate::transport::environment::ThreadLevel;
use crate::transport::mpi::MpiTransport;
use crate::transport::{Notice, Transport};
use crate::worker;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::thread::Thread;
use std::time::{Duration, Instant};

const FIRST_PAUSE: Duration = Duration::from_micros(20);
/// A ring's first word ("ring" in ASCII): the doorbell's communicator carries nothing else, so
/// this only guards against a stray notice.
const RING: u64 = 0x7269_6e67;

pub struct Doorbell<T = MpiTransport> {
    /// `None` once closed.
    transport: Mutex<Option<T>>,
    /// What closing does with the transport.
    dispose: fn(T),
    interrupted: AtomicBool,
    /// The thread in [`Doorbell::wait`], for [`Doorbell::interrupt`] to wake.
    waiter: Mutex<Option<Thread>>,
}

fn locked<V>(mutex: &Mutex<V>) -> MutexGuard<'_, V> {
    // Nothing here can leave the value half-changed: every change is a single assignment.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn closed() -> CoreError {
    CoreError::Communication(
        "the doorbell is closed (ringlet was shut down, or the doorbell closed)".into(),
    )
}

impl<T: Transport + Send> Doorbell<T> {
    /// A doorbell over `transport`, which it alone uses from now on, and hands to `dispose`
    /// when it closes.
    pub fn new(transport: T, dispose: fn(T)) -> Self {
        Doorbell {
            transport: Mutex::new(Some(transport)),
            dispose,
            interrupted: AtomicBool::new(false),
            waiter: Mutex::new(None),
        }
    }

    /// Wake every other member's wait, telling it `value`.
    pub fn ring(&self, value: u64) -> Result<()> {
        let guard = locked(&self.transport);
        let transport = guard.as_ref().ok_or_else(closed)?;
        let me = transport.rank();
        for peer in (0..transport.size()).filter(|&peer| peer != me) {
            transport.send_notice(peer, [RING, value])?;
        }
        Ok(())
    }

    /// Until a ring arrives (the largest value among those that have arrived since the last
    /// wait), this doorbell is interrupted, or `limit` has passed (both `None`). An interrupt
    /// that came before the wait ends it at once. Between polls it pauses, each pause twice the
    /// last up to `longest_pause`: how late a ring may be heard, and (its inverse) how many
    /// polls a second a long wait makes. One thread waits at a time: an interrupt wakes the
    /// thread that began waiting last.
    pub fn wait(&self, limit: Duration, longest_pause: Duration) -> Result<Option<u64>> {
        *locked(&self.waiter) = Some(std::thread::current());
        let outcome = self.poll_until(Instant::now() + limit, longest_pause);
        *locked(&self.waiter) = None;
        outcome
    }

    fn poll_until(&self, deadline: Instant, longest_pause: Duration) -> Result<Option<u64>> {
        let mut pause = FIRST_PAUSE.min(longest_pause);
        loop {
            let notices = locked(&self.transport)
                .as_ref()
                .ok_or_else(closed)?
                .take_notices();
            let rung = notices
                .into_iter()
                .filter_map(|(_, [kind, value]): (usize, Notice)| (kind == RING).then_some(value))
                .max();
            if rung.is_some() {
                return Ok(rung);
            }
            let now = Instant::now();
            if self.interrupted.swap(false, Ordering::AcqRel) || now >= deadline {
                return Ok(None);
            }
            // Parked, not asleep: `interrupt` unparks it at once.
            std::thread::park_timeout(pause.min(deadline - now));
            pause = (pause * 2).min(longest_pause);
        }
    }

    /// End this rank's wait now (or the next one at once, if none is under way).
    pub fn interrupt(&self) {
        self.interrupted.store(true, Ordering::Release);
        if let Some(waiter) = locked(&self.waiter).as_ref() {
            waiter.unpark();
        }
    }

    /// Close it: later rings and waits fail, and a wait under way ends with that error.
    pub fn close(&self) {
        let transport = locked(&self.transport).take();
        if let Some(transport) = transport {
            (self.dispose)(transport);
        }
        self.interrupt();
    }
}

impl<T> Drop for Doorbell<T> {
    fn drop(&mut self) {
        if let Some(transport) = locked(&self.transport).take() {
            (self.dispose)(transport);
        }
    }
}

/// Every doorbell opened in this process and not yet closed, to close at shutdown.
static OPEN: Mutex<Vec<Weak<Doorbell>>> = Mutex::new(Vec::new());

/// A doorbell over process set `set` (after any queued work). Collective over the set's
/// members. Needs MPI_THREAD_MULTIPLE.
pub fn open(set: SetId) -> Result<Arc<Doorbell>> {
    let level = process::thread_level();
    if level != ThreadLevel::Multiple {
        return Err(CoreError::Communication(format!(
            "a doorbell needs MPI_THREAD_MULTIPLE (it is used while a collective runs on \
             another thread); this MPI granted MPI_THREAD_{}",
            level.name().to_uppercase()
        )));
    }
    let transport = worker::run_in_order(|| process::duplicate(set))?;
    // Left to MPI_Finalize rather than freed, as ringlet's own communicators are (see
    // `process::shutdown`): a ring still on its way must never reach a later communicator
    // that reuses the context id.
    let doorbell = Arc::new(Doorbell::new(transport, MpiTransport::retire));
    let mut open = locked(&OPEN);
    open.retain(|weak| weak.strong_count() > 0);
    open.push(Arc::downgrade(&doorbell));
    Ok(doorbell)
}

/// Close every doorbell (ringlet shuts down).
pub fn close_all() {
    for doorbell in std::mem::take(&mut *locked(&OPEN))
        .iter()
        .filter_map(Weak::upgrade)
    {
        doorbell.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::local::LocalTransport;

    const PAUSE: Duration = Duration::from_millis(1);

    fn pair() -> (Arc<Doorbell<LocalTransport>>, Arc<Doorbell<LocalTransport>>) {
        let mut group = LocalTransport::group(2).into_iter();
        let (first, second) = (group.next(), group.next());
        match (first, second) {
            (Some(a), Some(b)) => (
                Arc::new(Doorbell::new(a, drop)),
                Arc::new(Doorbell::new(b, drop)),
            ),
            _ => panic!("a group of two has two ranks"),
        }
    }

    #[test]
    fn a_ring_ends_the_other_ranks_wait_with_the_largest_value() {
        let (zero, one) = pair();
        let waiter = std::thread::spawn(move || one.wait(Duration::from_secs(10), PAUSE));
        std::thread::sleep(Duration::from_millis(20));
        zero.ring(3).expect("ring");
        assert_eq!(waiter.join().expect("waiter").expect("wait"), Some(3));

        let (zero, one) = pair();
        zero.ring(4).expect("ring");
        zero.ring(9).expect("ring");
        zero.ring(7).expect("ring");
        assert_eq!(
            one.wait(Duration::from_secs(10), PAUSE).expect("wait"),
            Some(9)
        );
        // The rings were taken: the next wait hears none.
        assert_eq!(
            one.wait(Duration::from_millis(5), PAUSE).expect("wait"),
            None
        );
        // A rank does not hear its own ring.
        assert_eq!(
            zero.wait(Duration::from_millis(5), PAUSE).expect("wait"),
            None
        );
    }

    #[test]
    fn an_interrupt_ends_a_wait_under_way_or_the_next_one() {
        let (_zero, one) = pair();
        let waiting = one.clone();
        let started = Instant::now();
        let waiter = std::thread::spawn(move || waiting.wait(Duration::from_secs(30), PAUSE));
        std::thread::sleep(Duration::from_millis(20));
        one.interrupt();
        assert_eq!(waiter.join().expect("waiter").expect("wait"), None);
        assert!(started.elapsed() < Duration::from_secs(20));

        one.interrupt();
        let started = Instant::now();
        assert_eq!(
            one.wait(Duration::from_secs(30), PAUSE).expect("wait"),
            None
        );
        assert!(started.elapsed() < Duration::from_secs(20));
    }

    #[test]
    fn a_wait_ends_at_its_limit_and_a_closed_doorbell_refuses() {
        let (zero, one) = pair();
        let started = Instant::now();
        assert_eq!(
            one.wait(Duration::from_millis(30), PAUSE).expect("wait"),
            None
        );
        assert!(started.elapsed() >= Duration::from_millis(30));

        one.close();
        let error = one.wait(Duration::from_secs(1), PAUSE).expect_err("closed");
        assert!(error.to_string().contains("closed"), "{error}");
        assert!(one.ring(1).is_err());
        assert!(
            zero.ring(1).is_ok(),
            "the other rank's doorbell is still open"
        );
    }
}
