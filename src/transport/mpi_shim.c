/* What rsmpi does not export: MPI_IN_PLACE, a macro whose value depends on the MPI library, and
 * which MPI this file was compiled against (so that ringlet can refuse to run on another). */
#include <mpi.h>

void *ringlet_mpi_in_place(void) { return MPI_IN_PLACE; }

#define RINGLET_STR2(x) #x
#define RINGLET_STR(x) RINGLET_STR2(x)

const char *ringlet_mpi_built_with(void) {
#if defined(OPEN_MPI)
    return "Open MPI " RINGLET_STR(OMPI_MAJOR_VERSION) "." RINGLET_STR(OMPI_MINOR_VERSION) "." RINGLET_STR(OMPI_RELEASE_VERSION);
#elif defined(MPICH_VERSION)
    return "MPICH " MPICH_VERSION;
#else
    return "MPI " RINGLET_STR(MPI_VERSION) "." RINGLET_STR(MPI_SUBVERSION);
#endif
}

/* ULFM's MPIX_Comm_revoke (MPI 4's fault tolerance proposal, built into Open MPI 5), bound weakly:
 * this file may be compiled against an MPI without it (Open MPI 4.1's headers), and the library
 * found at run time decides. Declared here because its header (mpi-ext.h) may lack it. */
extern int MPIX_Comm_revoke(MPI_Comm comm) __attribute__((weak));

/* Revoke `comm`: every rank's pending and later operations on it fail, instead of waiting for a
 * rank that has died. -1 if the library has no ULFM. */
int ringlet_mpi_revoke(MPI_Comm comm) {
    if (MPIX_Comm_revoke == 0) {
        return -1;
    }
    return MPIX_Comm_revoke(comm);
}
