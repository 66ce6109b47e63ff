//! What the Python layer asks of `auto`: install calibration's parameters, explain a choice
//! with every candidate's modelled and simulated time, and the decisions calibration needs.
//! Every decision is [`crate::auto`]'s; this file only finds the communicator.

use super::process::{self, SetId};
use super::registered::{first_or_named, registry};
use crate::auto::choice::{candidates, cheapest, priced};
use crate::auto::model::Prediction;
use crate::auto::{self, pieces, Parameters, Pricing, FALLBACK};
use crate::dtype::{DType, ReduceOp};
use crate::error::Result;
use crate::simulate::network::{Link, Network};
use crate::transport::Nodes;
use crate::worker;
use std::sync::Arc;

/// Install calibration's parameters (JSON, as cached) for every `auto` decision, after any
/// queued work (which decides with what it was queued under). Every rank must install the same
/// ones.
pub fn install_parameters(json: &str) -> Result<()> {
    let parameters = Parameters::from_json(json)?;
    worker::run_in_order(|| auto::install(parameters))
}

/// Forget the installed parameters: the next `auto` call on ringlet's communicator installs
/// them again (every rank must forget alike).
pub fn uninstall_parameters() -> Result<()> {
    worker::run_in_order(|| {
        auto::clear();
        Ok(())
    })
}

/// The installed parameters as JSON, if any.
pub fn installed_parameters() -> Option<String> {
    auto::installed().map(|p| p.to_json())
}

/// The built-in parameters as JSON.
pub fn default_parameters() -> String {
    Parameters::default().to_json()
}

/// `json` checked and completed with the built-in values for what it leaves out.
pub fn check_parameters(json: &str) -> Result<String> {
    Ok(Parameters::from_json(json)?.to_json())
}

/// The message limits calibration times between nodes, the one to keep unless another wins
/// first.
pub fn message_limit_options() -> Vec<usize> {
    pieces::OPTIONS.to_vec()
}

/// The limit to keep of those timed: `(limit, seconds)`, the first being the one to keep unless
/// another wins.
pub fn choose_message_limit(timed: &[(usize, f64)]) -> Option<usize> {
    pieces::choose_limit(timed)
}

/// One candidate of an explained choice.
pub struct Candidate {
    pub name: &'static str,
    pub prediction: Prediction,
    /// The simulator's time on the same placement with the same parameters; `None` where it
    /// cannot run the algorithm (it needs MPI or shared memory) or was not asked to.
    pub simulated: Option<f64>,
}

/// What an explained choice rests on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Basis {
    /// One rank: every algorithm is a no-op.
    OneRank,
    /// The communicator's decision table, as refined on real calls; `overridden`: the
    /// environment set it.
    Table { overridden: bool },
    /// The model's cheapest with the parameters given (or installed, or built in).
    Model,
}

pub struct Explanation {
    pub choice: &'static str,
    pub basis: Basis,
    pub candidates: Vec<Candidate>,
}

/// What to explain: a `collective` of `nbytes` of `dtype` (combined with `op`, if it combines).
pub struct Question<'a> {
    pub collective: &'a str,
    pub nbytes: usize,
    pub dtype: DType,
    pub op: ReduceOp,
    /// Parameters (JSON) to price with instead of the installed ones.
    pub parameters: Option<&'a str>,
    /// A placement to price on instead of the communicator's (one node label per rank): a
    /// what-if, answered by the model alone.
    pub nodes: Option<&'a [usize]>,
    /// The simulator runs each candidate when there are at most this many ranks.
    pub simulate_up_to: usize,
}

/// Each candidate's predicted time for the call of `question` on process set `set`, and what
/// `auto` runs: for an allreduce on the communicator with the installed parameters, the
/// decision table's choice (as refined on real calls); otherwise the model's cheapest (for the
/// other collectives without calibration's corrections, which were measured for allreduce).
/// Local.
pub fn explain(set: SetId, question: Question<'_>) -> Result<Explanation> {
    let Question {
        collective,
        nbytes,
        dtype,
        op,
        parameters,
        nodes,
        simulate_up_to,
    } = question;
    let allreduce = collective == "allreduce";
    let all = registry(collective)?;
    let combines = matches!(collective, "allreduce" | "reduce" | "reduce_scatter");
    let reducing = combines.then_some((dtype, op));
    let given = parameters.map(Parameters::from_json).transpose()?;
    let what_if = nodes.filter(|n| !n.is_empty()).map(Nodes::from_labels);
    process::with_communicator(set, |comm| {
        let transport = comm.transport();
        let tuning = comm.settings().tuning;
        let placement = what_if.as_ref().unwrap_or(transport.nodes());
        let installed = auto::installed();
        let from_table = allreduce && given.is_none() && what_if.is_none() && installed.is_some();
        let parameters: Arc<Parameters> = match given {
            Some(given) => Arc::new(given),
            None => installed.unwrap_or_default(),
        };
        let pricing = Pricing {
            parameters: &parameters,
            tuning: &tuning,
            corrected: allreduce,
        };
        let options = candidates(&all, transport, reducing);
        let prices = priced(&options, placement, pricing, nbytes, reducing.map(|r| r.0));
        let ranks = placement.ranks();
        let (choice, basis) = if allreduce && ranks <= 1 {
            (FALLBACK, Basis::OneRank)
        } else if from_table {
            let mut refiner = comm.refiner();
            let winner = refiner.winner(dtype, op, nbytes, transport, &tuning)?;
            let overridden = refiner.overridden();
            (winner.name(), Basis::Table { overridden })
        } else if collective == "alltoall" {
            // Sizes differ between ranks, so auto runs the first registered, unpriced.
            (first_or_named(&all, "auto")?.name(), Basis::Model)
        } else {
            let best = cheapest(&prices).map_or(FALLBACK, |a| a.name());
            (best, Basis::Model)
        };
        let simulate = ranks > 1 && ranks <= simulate_up_to;
        let network = network_of(&parameters, dtype);
        let simulated = |name: &str| {
            let outcome = crate::simulate::simulate_placed(
                collective,
                name,
                placement.labels(),
                nbytes,
                true,
                &network,
            );
            outcome.ok().map(|o| o.seconds)
        };
        let candidates = prices
            .iter()
            .map(|&(algorithm, prediction)| Candidate {
                name: algorithm.name(),
                prediction,
                simulated: simulate.then(|| simulated(algorithm.name())).flatten(),
            })
            .collect();
        Ok(Explanation {
            choice,
            basis,
            candidates,
        })
    })
}

/// The simulator's network with `parameters` (JSON) for `dtype`.
pub fn network(parameters: &str, dtype: DType) -> Result<Network> {
    Ok(network_of(&Parameters::from_json(parameters)?, dtype))
}

/// The simulator's network with the model's parameters.
fn network_of(parameters: &Parameters, dtype: DType) -> Network {
    Network {
        intra: Link {
            bandwidth: 1.0 / parameters.beta,
            latency: parameters.alpha,
        },
        inter: Link {
            bandwidth: 1.0 / parameters.beta_across,
            latency: parameters.alpha_across,
        },
        gamma: parameters.gamma_of(dtype),
        overhead: 0.0,
        memory: f64::INFINITY,
        groups: 1,
        global: Link {
            bandwidth: f64::INFINITY,
            latency: 0.0,
        },
        half_duplex: parameters.exchange_slowdown > pieces::HALF_DUPLEX_ABOVE,
    }
}
