//! Compiles the one-line C shim that hands Rust the value of `MPI_IN_PLACE`, a macro whose value
//! differs between MPI libraries and which rsmpi does not export. Uses the same MPI that rsmpi
//! builds against (`mpicc` on PATH, `MPICC`, or pkg-config).

fn main() {
    println!("cargo:rerun-if-changed=src/transport/mpi_shim.c");
    for variable in ["MPICC", "MPI_PKG_CONFIG", "CRAY_MPICH_DIR"] {
        println!("cargo:rerun-if-env-changed={variable}");
    }
    let lib = match build_probe_mpi::probe() {
        Ok(lib) => lib,
        Err(errors) => {
            for error in errors {
                println!("cargo:warning=MPI probe: {error}");
            }
            panic!(
                "ringlet needs an MPI library with its headers (mpicc on PATH). On Debian/Ubuntu: \
                 apt-get install libopenmpi-dev openmpi-bin libclang-dev"
            );
        }
    };
    let mut build = cc::Build::new();
    build.file("src/transport/mpi_shim.c");
    match lib.mpicc {
        Some(mpicc) => {
            build.compiler(mpicc);
        }
        None => {
            for dir in &lib.include_paths {
                build.include(dir);
            }
        }
    }
    build.compile("ringlet_mpi_shim");
}
