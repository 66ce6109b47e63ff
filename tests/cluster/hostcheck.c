/* Where each rank runs and whether hosts can talk: rank, processor name, the size of its
 * MPI_COMM_TYPE_SHARED node, and the bandwidth of a bounded exchange between rank 0 and the
 * last rank (on another host in every layout the tests use). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size, node_size, len;
    char name[MPI_MAX_PROCESSOR_NAME];
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Get_processor_name(name, &len);
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &node_size);
    printf("rank %d of %d on %s, node of %d\n", rank, size, name, node_size);
    fflush(stdout);
    int bytes = argc > 1 ? atoi(argv[1]) : (8 << 20);
    char *buf = calloc(bytes, 1);
    int peer = rank == 0 ? size - 1 : 0;
    for (int round = 0; round < 3 && size > 1; round++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double start = MPI_Wtime();
        if (rank == 0) MPI_Send(buf, bytes, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
        if (rank == size - 1) MPI_Recv(buf, bytes, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        if (rank == size - 1)
            printf("%d bytes from rank 0 in %.1f ms: %.1f MB/s\n", bytes,
                   (MPI_Wtime() - start) * 1e3, bytes / (MPI_Wtime() - start) / 1e6);
    }
    free(buf);
    MPI_Comm_free(&node);
    MPI_Finalize();
    return 0;
}
