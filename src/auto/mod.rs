//! Every decision behind `algorithm="auto"`, from one cost model.
//!
//! - [`model`]: the alpha-beta-gamma model's [`Parameters`] (built-in values, or calibration's,
//!   installed once for every communicator) and the predicted time of any registered algorithm;
//! - [`choice`]: the candidates on a communicator and the cheapest of them (every collective);
//! - [`table`]: allreduce's decision table per communicator, with a runner-up per size range;
//! - [`refine`]: the table played on real calls, and refined by trying the runner-ups;
//! - [`pieces`]: whether messages between nodes go whole or in pieces.
//!
//! Calibration (in Python) measures the parameters, caches and broadcasts them; nothing above
//! this module predicts a time or chooses an algorithm.

pub mod choice;
pub mod model;
pub mod pieces;
pub mod refine;
pub mod table;

pub use choice::{choose_cheapest, Pricing, FALLBACK};
pub use model::{clear, install, installed, Parameters};
pub use refine::{Pick, Refinement, Refiner};
