//! A simulator built from the schedules' own code: every registered algorithm of a collective
//! runs for N virtual ranks in one process over a [`trace::Recorder`] (no data moves; the
//! kernels only count), and [`network::run`] times the recorded messages on a model of hosts,
//! links and contention. A schedule added to a registry is simulated with no other edit.

pub mod network;
pub mod trace;

use crate::dtype::{DType, ReduceOp};
use crate::error::{CoreError, Result};
use crate::kernels;
use crate::schedules::{
    self, Algorithm, Factors, Parts, Reduction, Tuning, ALLGATHER, ALLREDUCE, BROADCAST, REDUCE,
    REDUCE_SCATTER,
};
use crate::transport::Nodes;
use network::{Network, Outcome};
use std::ops::Range;
use trace::{Program, Recorder};

/// The collectives the simulator runs (vectors of float32, sum, root 0).
pub const COLLECTIVES: [&str; 5] = [
    "allreduce",
    "reduce",
    "broadcast",
    "allgather",
    "reduce_scatter",
];

/// The registered algorithms of `collective`.
pub fn algorithms(collective: &str) -> Result<Vec<&'static str>> {
    let names = |registry: &[&dyn Algorithm]| registry.iter().map(|a| a.name()).collect();
    Ok(match collective {
        "allreduce" => names(&ALLREDUCE.iter().map(|&a| a as _).collect::<Vec<_>>()),
        "reduce" => names(&REDUCE.iter().map(|&a| a as _).collect::<Vec<_>>()),
        "broadcast" => names(&BROADCAST.iter().map(|&a| a as _).collect::<Vec<_>>()),
        "allgather" => names(&ALLGATHER.iter().map(|&a| a as _).collect::<Vec<_>>()),
        "reduce_scatter" => names(&REDUCE_SCATTER.iter().map(|&a| a as _).collect::<Vec<_>>()),
        other => {
            return Err(CoreError::InvalidArgument(format!(
                "the simulator runs {}, not {other:?}",
                crate::dtype::names(COLLECTIVES.iter().copied())
            )))
        }
    })
}

/// Each virtual rank's program for one `collective` of `bytes` (float32 elements; a
/// remainder below 4 bytes is dropped) with `algorithm` on the ranks of `nodes`.
pub fn programs(
    collective: &str,
    algorithm: &str,
    nodes: &Nodes,
    bytes: usize,
    tuning: &Tuning,
) -> Result<Vec<Program>> {
    algorithms(collective)?; // names the accepted collectives
    let n = nodes.ranks();
    let dtype = DType::F32;
    let elem = dtype.size();
    let len = bytes / elem * elem;
    let blocks: Vec<Range<usize>> = (0..n)
        .map(|r| {
            let (count, base) = (len / elem, (len / elem) / n.max(1));
            let extra = count % n.max(1);
            let start = r * base + r.min(extra);
            start * elem..(start + base + usize::from(r < extra)) * elem
        })
        .collect();
    // One buffer for every virtual rank in turn: the schedules read and write it, but nothing
    // they decide depends on its values.
    let mut words = vec![0u64; len.div_ceil(8)];
    let reduction = Reduction {
        ranks: n,
        ..Reduction::plain(dtype, ReduceOp::Sum)
    };
    let mut programs = Vec::with_capacity(n);
    for rank in 0..n {
        let recorder = Recorder::new(rank, nodes.clone());
        let buf: &mut [u8] = &mut bytemuck::cast_slice_mut(&mut words)[..len];
        let (ran, _) = kernels::counting(|| -> Result<()> {
            match collective {
                "allreduce" => {
                    let schedule = schedules::by_name(ALLREDUCE, algorithm)?;
                    refuse_unavailable(schedule, &recorder)?;
                    let mut parts = Parts::one(buf);
                    schedules::allreduce(
                        &recorder,
                        schedule,
                        &mut parts,
                        dtype,
                        ReduceOp::Sum,
                        Factors::NONE,
                        tuning,
                    )
                }
                "reduce" => {
                    let schedule = schedules::by_name(REDUCE, algorithm)?;
                    refuse_unavailable(schedule, &recorder)?;
                    schedule.run(&recorder, buf, 0, &reduction)
                }
                "broadcast" => {
                    let schedule = schedules::by_name(BROADCAST, algorithm)?;
                    refuse_unavailable(schedule, &recorder)?;
                    schedule.run(&recorder, buf, 0)
                }
                "allgather" => {
                    let schedule = schedules::by_name(ALLGATHER, algorithm)?;
                    refuse_unavailable(schedule, &recorder)?;
                    schedule.run(&recorder, buf, &blocks)
                }
                _ => {
                    let schedule = schedules::by_name(REDUCE_SCATTER, algorithm)?;
                    refuse_unavailable(schedule, &recorder)?;
                    schedule.run(&recorder, buf, &blocks, &reduction)
                }
            }
        });
        ran.map_err(|e| {
            CoreError::InvalidArgument(format!(
                "{collective} {algorithm:?} cannot be simulated: {e}"
            ))
        })?;
        programs.push(recorder.finish());
    }
    Ok(programs)
}

fn refuse_unavailable<T: Algorithm + ?Sized>(schedule: &T, recorder: &Recorder) -> Result<()> {
    match schedule.unavailable(recorder) {
        Some(reason) => Err(CoreError::InvalidArgument(reason)),
        None => Ok(()),
    }
}

/// Record and time one collective (see [`programs`] and [`network::run`]).
pub fn simulate(
    collective: &str,
    algorithm: &str,
    nodes: &Nodes,
    bytes: usize,
    tuning: &Tuning,
    network: &Network,
) -> Result<Outcome> {
    if nodes.ranks() == 0 {
        return Err(CoreError::InvalidArgument(
            "the simulator needs at least one rank".into(),
        ));
    }
    let programs = programs(collective, algorithm, nodes, bytes, tuning)?;
    network::run(&programs, nodes, network)
}

/// [`simulate`] on ranks placed by `labels` (rank r on the node labelled `labels[r]`), with
/// rings in node-major order or not.
pub fn simulate_placed(
    collective: &str,
    algorithm: &str,
    labels: &[usize],
    bytes: usize,
    node_major: bool,
    network: &Network,
) -> Result<Outcome> {
    let tuning = Tuning {
        node_major,
        ..Tuning::default()
    };
    simulate(
        collective,
        algorithm,
        &Nodes::from_labels(labels),
        bytes,
        &tuning,
        network,
    )
}
