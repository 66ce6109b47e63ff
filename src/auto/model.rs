//! The alpha-beta-gamma (Hockney) model: its parameters, their built-in values, and the
//! predicted time of a registered algorithm.
//!
//! Each algorithm declares its cost next to its code ([`Algorithm::cost_on`]: messages, bytes
//! sent and bytes combined on its busiest rank inside a node, and messages and bytes over the
//! busiest node's link). [`Parameters`] turns that into seconds: alpha per message and beta per
//! byte inside a node, the same across nodes, gamma per byte combined (per dtype), times the
//! measured/model correction that calibration found for allreduce algorithms.

use crate::dtype::DType;
use crate::error::{CoreError, Result};
use crate::schedules::{Algorithm, Tiered, Tuning};
use crate::transport::{Nodes, DEFAULT_MAX_MESSAGE_BYTES};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// Seconds per byte combined for a dtype calibration has not measured.
pub const DEFAULT_GAMMA: f64 = 1.0 / 30e9;

/// The model's parameters, in seconds. Every rank must hold the same ones (rank 0's
/// calibration, broadcast), so that every rank decides alike. Serialized as the calibration
/// cache's JSON; fields missing there take the built-in values.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Parameters {
    /// Per message inside a node.
    pub alpha: f64,
    /// Per byte sent inside a node.
    pub beta: f64,
    /// Per message over a node's link.
    pub alpha_across: f64,
    /// Per byte over a node's link.
    pub beta_across: f64,
    /// Per byte combined, by dtype name; dtypes not named take [`DEFAULT_GAMMA`].
    pub gamma: BTreeMap<String, f64>,
    /// Between nodes: the longest message sent whole (longer ones go in pieces).
    pub across_message_bytes: usize,
    /// How much longer two ranks on different nodes take to exchange both ways at once than
    /// one way (1: the connections are full duplex, 2: one direction at a time).
    pub exchange_slowdown: f64,
    /// Allreduce algorithm -> (bytes, measured / model), sorted by bytes: calibration's timings
    /// of float32 sums.
    pub corrections: BTreeMap<String, Vec<(u64, f64)>>,
}

impl Default for Parameters {
    /// The built-in values: shared memory through an MPI library inside a node (1.5 us, 6 GB/s),
    /// and 10 Gbit/s Ethernet with TCP's latency between nodes.
    fn default() -> Self {
        Parameters {
            alpha: 1.5e-6,
            beta: 1.0 / 6e9,
            alpha_across: 30e-6,
            beta_across: 8.0 / 10e9,
            gamma: BTreeMap::new(),
            across_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            exchange_slowdown: 1.0,
            corrections: BTreeMap::new(),
        }
    }
}

/// One algorithm's predicted time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Prediction {
    /// The model's seconds.
    pub model: f64,
    /// measured / model at this size (1 without measurements).
    pub correction: f64,
    /// `model * correction`.
    pub seconds: f64,
}

impl Parameters {
    /// Parse and check the JSON of a calibration; other keys in it are ignored.
    pub fn from_json(text: &str) -> Result<Parameters> {
        let invalid = |e: String| {
            CoreError::InvalidArgument(format!("not a calibration of the cost model: {e}"))
        };
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| invalid(e.to_string()))?;
        if !value.is_object() {
            return Err(invalid(format!("expected a JSON object, got {value}")));
        }
        let mut parameters: Parameters =
            serde_json::from_value(value).map_err(|e| invalid(e.to_string()))?;
        for points in parameters.corrections.values_mut() {
            points.sort_by_key(|(bytes, _)| *bytes);
        }
        parameters.check()?;
        Ok(parameters)
    }

    pub fn to_json(&self) -> String {
        // Plain numbers, strings and maps: serializing cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Every number positive and finite, the dtypes known, the limit one MPI can send.
    pub fn check(&self) -> Result<()> {
        let invalid = |what: String| Err(CoreError::InvalidArgument(what));
        let numbers = [
            ("alpha", self.alpha),
            ("beta", self.beta),
            ("alpha_across", self.alpha_across),
            ("beta_across", self.beta_across),
            ("exchange_slowdown", self.exchange_slowdown),
        ];
        for (name, value) in numbers {
            if !(value.is_finite() && value > 0.0) {
                return invalid(format!(
                    "the cost model's {name} must be a positive number, got {value}"
                ));
            }
        }
        for (dtype, value) in &self.gamma {
            if DType::from_name(dtype).is_err() {
                return invalid(format!(
                    "the cost model's gamma names {dtype:?}, which is not a dtype ringlet \
                     reduces"
                ));
            }
            if !(value.is_finite() && *value > 0.0) {
                return invalid(format!(
                    "the cost model's gamma for {dtype} must be a positive number, got {value}"
                ));
            }
        }
        if !(1..=DEFAULT_MAX_MESSAGE_BYTES).contains(&self.across_message_bytes) {
            return invalid(format!(
                "across_message_bytes must be 1 to {DEFAULT_MAX_MESSAGE_BYTES}, got {}",
                self.across_message_bytes
            ));
        }
        let ratios = self.corrections.values().flatten().map(|(_, r)| *r);
        if !ratios.into_iter().all(|r| r.is_finite() && r > 0.0) {
            return invalid("the cost model's corrections must be positive numbers".into());
        }
        Ok(())
    }

    pub fn gamma_of(&self, dtype: DType) -> f64 {
        self.gamma
            .get(dtype.name())
            .copied()
            .unwrap_or(DEFAULT_GAMMA)
    }

    /// The model's seconds for `cost`, combining `dtype` (if anything is combined).
    pub fn seconds(&self, cost: &Tiered, dtype: Option<DType>) -> f64 {
        let gamma = dtype.map_or(DEFAULT_GAMMA, |d| self.gamma_of(d));
        self.alpha * cost.within.messages
            + self.beta * cost.within.bytes
            + gamma * (cost.within.reduced + cost.across.reduced)
            + self.alpha_across * cost.across.messages
            + self.beta_across * cost.across.bytes
    }

    /// measured / model for allreduce `algorithm` at `bytes`, interpolated in log-size between
    /// the calibrated sizes and held beyond them (1 without measurements).
    pub fn correction(&self, algorithm: &str, bytes: usize) -> f64 {
        let Some(points) = self.corrections.get(algorithm).filter(|p| !p.is_empty()) else {
            return 1.0;
        };
        let bytes = bytes.max(1) as f64;
        let above = points.partition_point(|(size, _)| (*size as f64) < bytes);
        match (
            above.checked_sub(1).and_then(|i| points.get(i)),
            points.get(above),
        ) {
            (Some(&(s0, r0)), Some(&(s1, r1))) if s1 > s0 => {
                let t = (bytes.ln() - (s0 as f64).ln()) / ((s1 as f64).ln() - (s0 as f64).ln());
                ((1.0 - t) * r0.ln() + t * r1.ln()).exp()
            }
            (_, Some(&(_, ratio))) | (Some(&(_, ratio)), None) => ratio,
            (None, None) => 1.0,
        }
    }

    /// `algorithm`'s predicted time for `bytes` on ranks placed on `nodes`; `corrected`: with
    /// calibration's correction (which it measured for allreduce algorithms only).
    pub fn predict<T: Algorithm + ?Sized>(
        &self,
        algorithm: &T,
        nodes: &Nodes,
        bytes: usize,
        tuning: &Tuning,
        dtype: Option<DType>,
        corrected: bool,
    ) -> Prediction {
        let model = if nodes.ranks() <= 1 {
            0.0
        } else {
            self.seconds(&algorithm.cost_on(nodes, bytes, tuning), dtype)
        };
        let correction = if corrected {
            self.correction(algorithm.name(), bytes)
        } else {
            1.0
        };
        Prediction {
            model,
            correction,
            seconds: model * correction,
        }
    }

    /// Bytes per array below which a fused run of arrays is packed into one buffer instead of
    /// being reduced where the arrays live. In place, each array a block crosses costs about a
    /// message (alpha); a ring of `ranks` adds about 2(N-1)/N of them per array. Packing costs
    /// a copy in and out (about gamma per byte each, the speed of touching memory), so it pays
    /// below (N-1)/N * alpha / gamma bytes per array.
    pub fn pack_below(&self, dtype: DType, ranks: usize) -> usize {
        if ranks <= 1 {
            return 0;
        }
        ((ranks - 1) as f64 / ranks as f64 * self.alpha / self.gamma_of(dtype)) as usize
    }
}

static INSTALLED: RwLock<Option<Arc<Parameters>>> = RwLock::new(None);
/// Bumped by every install and clear: tables built from older parameters are rebuilt.
static GENERATION: AtomicU64 = AtomicU64::new(0);
/// Whether `INSTALLED` holds parameters: every small call asks, and a flag costs no lock.
static IS_INSTALLED: AtomicBool = AtomicBool::new(false);

/// Install the parameters every `auto` decision uses (every rank the same ones).
pub fn install(parameters: Parameters) -> Result<()> {
    parameters.check()?;
    *INSTALLED.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(parameters));
    IS_INSTALLED.store(true, Ordering::Release);
    GENERATION.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Forget the installed parameters (a new communicator, or settings the calibration did not
/// see): `auto` waits for the next install.
pub fn clear() {
    *INSTALLED.write().unwrap_or_else(|e| e.into_inner()) = None;
    IS_INSTALLED.store(false, Ordering::Release);
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// Whether parameters are installed (as `installed().is_some()`, without taking the lock).
pub fn is_installed() -> bool {
    IS_INSTALLED.load(Ordering::Acquire)
}

/// The installed parameters, if any.
pub fn installed() -> Option<Arc<Parameters>> {
    INSTALLED.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The installed parameters, else the built-in ones.
pub fn current() -> Arc<Parameters> {
    installed().unwrap_or_default()
}

/// Which install the current parameters came from.
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_round_trips_and_missing_fields_take_the_built_in_values() {
        let mut parameters = Parameters::default();
        parameters.gamma.insert("float32".into(), 2e-11);
        parameters
            .corrections
            .insert("ring".into(), vec![(8, 2.0), (4096, 1.5)]);
        let back = Parameters::from_json(&parameters.to_json()).expect("valid");
        assert_eq!(back, parameters);
        let partial = Parameters::from_json(r#"{"alpha": 3e-6, "key": {"size": 2}}"#)
            .expect("other keys are ignored");
        assert_eq!(partial.alpha, 3e-6);
        assert_eq!(partial.beta, Parameters::default().beta);
    }

    #[test]
    fn invalid_parameters_are_refused_with_their_name() {
        for (text, named) in [
            (r#"{"alpha": 0}"#, "alpha"),
            (r#"{"beta_across": -1}"#, "beta_across"),
            (r#"{"gamma": {"float32": 0}}"#, "gamma"),
            (r#"{"gamma": {"complex64": 1e-9}}"#, "complex64"),
            (r#"{"across_message_bytes": 0}"#, "across_message_bytes"),
            (r#"{"corrections": {"ring": [[8, 0.0]]}}"#, "corrections"),
            (r#"{"alpha": "fast"}"#, "calibration"),
            ("[1, 2]", "calibration"),
        ] {
            let error = Parameters::from_json(text).expect_err(text).to_string();
            assert!(error.contains(named), "{text}: {error}");
        }
    }

    #[test]
    fn corrections_interpolate_in_log_size_and_hold_beyond_the_ends() {
        let mut parameters = Parameters::default();
        parameters
            .corrections
            .insert("ring".into(), vec![(1024, 4.0), (8, 1.0)]);
        let parameters = Parameters::from_json(&parameters.to_json()).expect("valid");
        assert_eq!(parameters.correction("ring", 1), 1.0);
        assert_eq!(parameters.correction("ring", 8), 1.0);
        assert_eq!(parameters.correction("ring", 1 << 20), 4.0);
        // Halfway in log between 8 and 1024 (at 90.5 bytes): the geometric mean, 2.
        let middle = parameters.correction("ring", 91);
        assert!((middle - 2.0).abs() < 0.01, "{middle}");
        assert_eq!(parameters.correction("halving_doubling", 91), 1.0);
    }

    #[test]
    fn packing_pays_below_alpha_over_gamma() {
        let mut parameters = Parameters {
            alpha: 1e-6,
            ..Parameters::default()
        };
        parameters.gamma.insert("float32".into(), 1e-10);
        assert_eq!(parameters.pack_below(DType::F32, 1), 0);
        assert_eq!(parameters.pack_below(DType::F32, 2), 5000);
        assert_eq!(parameters.pack_below(DType::F64, 4), 22500);
    }
}
