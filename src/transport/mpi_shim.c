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
