//! What this process's allreduces did, per algorithm: calls, bytes, seconds. For the training
//! demo's communication summary and for tests that check which algorithm `auto` ran.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Usage {
    pub calls: u64,
    pub bytes: u64,
    pub seconds: f64,
}

static USAGE: Mutex<Vec<(&'static str, Usage)>> = Mutex::new(Vec::new());
static ENABLED: AtomicBool = AtomicBool::new(true);

/// Pause counting (calibration's traffic is not the user's).
pub fn set_enabled(enabled: bool) {
    ENABLED.store(enabled, Ordering::Relaxed);
}

pub fn record(algorithm: &'static str, bytes: usize, elapsed: Duration) {
    if !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    let mut usage = USAGE.lock().unwrap_or_else(|e| e.into_inner());
    let index = match usage.iter().position(|(name, _)| *name == algorithm) {
        Some(index) => index,
        None => {
            usage.push((algorithm, Usage::default()));
            usage.len() - 1
        }
    };
    let entry = &mut usage[index].1;
    entry.calls += 1;
    entry.bytes += bytes as u64;
    entry.seconds += elapsed.as_secs_f64();
}

pub fn snapshot() -> Vec<(&'static str, Usage)> {
    USAGE.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

pub fn reset() {
    USAGE.lock().unwrap_or_else(|e| e.into_inner()).clear();
}
