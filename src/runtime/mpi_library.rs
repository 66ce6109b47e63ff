//! Which MPI ringlet runs on, and the checks that refuse a process that would misbehave: a
//! build that mixes two MPI libraries (one ABI's constants on another's functions segfault),
//! and a launcher of another MPI than the library's (every rank would run as a job of one).

use crate::error::{CoreError, Result};
use crate::transport::environment;
pub use crate::transport::environment::{built_with, library_version, Family};

const REBUILD: &str = "With ringlet's wheel, point it at the launcher's MPI \
                       (RINGLET_LIBMPI=/path/to/that/libmpi.so.N; `python -m ringlet.info` says \
                       what it loaded and why). Built from source, rebuild it against that MPI: \
                       `MPICC=/path/to/that/mpicc pip install --force-reinstall --no-cache-dir .` \
                       (or `make` in a checkout), and mpi4py the same way (`MPICC=... pip install \
                       --no-binary mpi4py --no-cache-dir --force-reinstall mpi4py`)";

/// Refuse to run on another MPI than the one ringlet was built with, or under a launcher that
/// started more processes than MPI can see. Called once MPI is initialized.
pub fn check_runtime() -> Result<()> {
    let built = built_with();
    let running = library_version()?;
    let first_line = running.lines().next().unwrap_or_default().to_string();
    if let (Some(compiled), Some(loaded)) = (Family::of(&built), Family::of(&running)) {
        if compiled != loaded {
            return Err(CoreError::Communication(format!(
                "ringlet was built against {built} but runs on {} ({first_line}): the build mixes \
                 two MPI libraries, or this process loads another MPI than ringlet's. {REBUILD}",
                loaded.name()
            )));
        }
    }
    let world = environment::world_size()?;
    check_launcher(world, &first_line, |name| std::env::var(name).ok())
}

/// A launcher says how many processes it started; MPI must see as many.
pub fn check_launcher(
    world_size: usize,
    library: &str,
    env: impl Fn(&str) -> Option<String>,
) -> Result<()> {
    const LAUNCHERS: [(&str, &str); 2] = [
        ("OMPI_COMM_WORLD_SIZE", "Open MPI's mpirun"),
        (
            "PMI_SIZE",
            "a PMI launcher (MPICH's mpiexec/Hydra, or srun)",
        ),
    ];
    for (variable, launcher) in LAUNCHERS {
        let Some(started) = env(variable).and_then(|v| v.trim().parse::<usize>().ok()) else {
            continue;
        };
        if started > 1 && world_size == 1 {
            return Err(CoreError::Communication(format!(
                "this process is one of {started} started by {launcher} ({variable}={started}), \
                 but MPI sees a job of 1: ringlet's MPI ({library}) is not the launcher's. Launch \
                 with the mpirun of ringlet's MPI, or: {REBUILD}"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_told_apart_by_their_descriptions() {
        assert_eq!(Family::of("Open MPI 4.1.4"), Some(Family::OpenMpi));
        assert_eq!(
            Family::of("Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4"),
            Some(Family::OpenMpi)
        );
        assert_eq!(Family::of("MPICH 4.0.2"), Some(Family::Mpich));
        assert_eq!(
            Family::of("MPICH Version:\t4.0.2\nMPICH Release date: ..."),
            Some(Family::Mpich)
        );
        assert_eq!(
            Family::of("Intel(R) MPI Library 2021.10 for Linux* OS"),
            Some(Family::Mpich)
        );
        assert_eq!(Family::of("MPI 3.1"), None);
    }

    #[test]
    fn a_launcher_of_more_processes_than_mpi_sees_is_refused() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        let refused = check_launcher(1, "Open MPI v4.1.4", env(&[("PMI_SIZE", "2")]));
        let message = refused
            .expect_err("PMI_SIZE=2 but a world of 1")
            .to_string();
        assert!(
            message.contains("one of 2") && message.contains("PMI_SIZE=2"),
            "{message}"
        );
        assert!(check_launcher(1, "", env(&[("OMPI_COMM_WORLD_SIZE", "4")])).is_err());
        assert!(check_launcher(2, "", env(&[("PMI_SIZE", "2")])).is_ok());
        assert!(check_launcher(1, "", env(&[("PMI_SIZE", "1")])).is_ok());
        assert!(check_launcher(1, "", env(&[])).is_ok());
    }
}
