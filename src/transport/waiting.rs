//! How a thread waiting for MPI passes the time between polls.
//!
//! MPI progresses a transfer only inside its calls, so a waiting thread must poll. By default
//! it spins for a while, then yields the core between polls (which keeps it runnable: the
//! latency of small collectives stays at a few microseconds). Sleeping between polls instead
//! frees the core for other threads (a backward pass overlapping the communication) but costs
//! latency: two ranks that both sleep wake each other only every sleep, and a ping-pong of 8
//! bytes went from 1.3 us to 250 us with 50 us of spin and sleeps up to 200 us. Measured in
//! training on this project's machine (benchmarks/RESULTS.md, "Training steps"): spinning and
//! sleeping are within noise of each other when the buckets are the ones the model chooses.
//! Process-wide and local (it changes no message): [`set_wait_policy`], or
//! `RINGLET_WAIT_SPIN_US` / `RINGLET_WAIT_SLEEP_US` before the first wait.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant};

/// Spin this long before yielding (or sleeping) between polls.
pub const DEFAULT_SPIN: Duration = Duration::from_millis(1);
/// The longest sleep between two polls (0: yield the core instead of sleeping).
pub const DEFAULT_MAX_SLEEP: Duration = Duration::ZERO;
/// The first sleep; each later one doubles, up to the cap.
const FIRST_SLEEP: Duration = Duration::from_micros(5);

static SPIN_MICROS: AtomicU64 = AtomicU64::new(DEFAULT_SPIN.as_micros() as u64);
static MAX_SLEEP_MICROS: AtomicU64 = AtomicU64::new(DEFAULT_MAX_SLEEP.as_micros() as u64);
static FROM_ENVIRONMENT: Once = Once::new();

/// Spin for `spin`, then sleep between polls with the sleeps doubling up to `max_sleep` (zero:
/// yield the core between polls instead, which on Linux keeps the thread runnable).
pub fn set_wait_policy(spin: Duration, max_sleep: Duration) {
    FROM_ENVIRONMENT.call_once(|| {}); // an explicit setting wins over the environment
    SPIN_MICROS.store(spin.as_micros() as u64, Ordering::Relaxed);
    MAX_SLEEP_MICROS.store(max_sleep.as_micros() as u64, Ordering::Relaxed);
}

/// (spin, max_sleep) now in force.
pub fn wait_policy() -> (Duration, Duration) {
    FROM_ENVIRONMENT.call_once(|| {
        let micros = |name: &str| std::env::var(name).ok().and_then(|v| v.trim().parse().ok());
        if let Some(spin) = micros("RINGLET_WAIT_SPIN_US") {
            SPIN_MICROS.store(spin, Ordering::Relaxed);
        }
        if let Some(sleep) = micros("RINGLET_WAIT_SLEEP_US") {
            MAX_SLEEP_MICROS.store(sleep, Ordering::Relaxed);
        }
    });
    (
        Duration::from_micros(SPIN_MICROS.load(Ordering::Relaxed)),
        Duration::from_micros(MAX_SLEEP_MICROS.load(Ordering::Relaxed)),
    )
}

/// The pauses of one wait.
pub struct Backoff {
    started: Instant,
    spin: Duration,
    max_sleep: Duration,
    next_sleep: Duration,
}

impl Backoff {
    pub fn new() -> Self {
        let (spin, max_sleep) = wait_policy();
        Backoff {
            started: Instant::now(),
            spin,
            max_sleep,
            next_sleep: FIRST_SLEEP.min(max_sleep),
        }
    }

    /// Yield the core between polls from the start (threads that outnumber the cores).
    pub fn yielding() -> Self {
        Backoff {
            started: Instant::now(),
            spin: Duration::ZERO,
            max_sleep: Duration::ZERO,
            next_sleep: Duration::ZERO,
        }
    }

    /// Time since the wait began.
    pub fn waited(&self) -> Duration {
        self.started.elapsed()
    }

    /// Pass the time until the next poll.
    pub fn pause(&mut self) {
        if self.started.elapsed() < self.spin {
            std::hint::spin_loop();
        } else if self.max_sleep.is_zero() {
            std::thread::yield_now();
        } else {
            std::thread::sleep(self.next_sleep);
            self.next_sleep = (self.next_sleep * 2).min(self.max_sleep);
        }
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spins_then_sleeps_with_doubling_sleeps_up_to_the_cap() {
        let saved = wait_policy();
        set_wait_policy(Duration::ZERO, Duration::from_micros(40));
        let mut backoff = Backoff::new();
        let mut sleeps = Vec::new();
        for _ in 0..5 {
            sleeps.push(backoff.next_sleep);
            backoff.pause();
        }
        set_wait_policy(saved.0, saved.1);
        let micros: Vec<u64> = sleeps.iter().map(|d| d.as_micros() as u64).collect();
        assert_eq!(micros, [5, 10, 20, 40, 40]);
        assert!(backoff.waited() >= Duration::from_micros(115));
    }
}
