//! The MPI transport's [`LibraryCollectives`]: MPI_Allreduce and MPI_Reduce in place on its
//! communicator.

use super::environment::{library_version, Family};
use super::library::{LibraryCollectives, LibraryElement, LibraryOp};
use super::mpi::MpiTransport;
use super::mpi_call::{check_on, in_place};
use super::{message_pieces, Transport};
use crate::error::{CoreError, Result};
use mpi::ffi;
use std::ffi::c_int;
use std::ops::Range;
use std::sync::OnceLock;

fn datatype(element: LibraryElement) -> ffi::MPI_Datatype {
    // SAFETY: reading MPI's predefined handles, which are constants after initialization.
    unsafe {
        match element {
            LibraryElement::F32 => ffi::RSMPI_FLOAT,
            LibraryElement::F64 => ffi::RSMPI_DOUBLE,
            LibraryElement::I32 => ffi::RSMPI_INT32_T,
            LibraryElement::I64 => ffi::RSMPI_INT64_T,
        }
    }
}

fn operation(op: LibraryOp) -> ffi::MPI_Op {
    // SAFETY: as in `datatype`.
    unsafe {
        match op {
            LibraryOp::Sum => ffi::RSMPI_SUM,
            LibraryOp::Prod => ffi::RSMPI_PROD,
            LibraryOp::Min => ffi::RSMPI_MIN,
            LibraryOp::Max => ffi::RSMPI_MAX,
        }
    }
}

/// Whether MPI_Reduce with MPI_IN_PLACE at a root other than 0 may crash: MPICH 4.0.2 to 4.1.1
/// read the root's input from the MPI_IN_PLACE address when the ranks share a node
/// (pmodels/mpich#6540, fixed in 4.1.2; seen here with Debian's 4.0.2). Derivatives do not say
/// which MPICH they carry, so every library of the family gets the root's input from a copy.
fn in_place_reduce_off_zero_crashes() -> bool {
    static CRASHES: OnceLock<bool> = OnceLock::new();
    *CRASHES.get_or_init(|| {
        library_version().map_or(true, |text| Family::of(&text) == Some(Family::Mpich))
    })
}

impl MpiTransport {
    /// The non-empty messages, as (byte range, element count), that `len` bytes of `element`
    /// go in: MPI counts are C ints. An empty range is skipped because an empty slice's
    /// dangling pointer can equal MPI_IN_PLACE (every rank skips alike: the lengths agree).
    fn library_messages(
        &self,
        len: usize,
        element: LibraryElement,
    ) -> Result<impl Iterator<Item = (Range<usize>, c_int)>> {
        let size = element.size();
        if !len.is_multiple_of(size) {
            return Err(CoreError::InvalidArgument(format!(
                "internal: {len} bytes are not whole {size}-byte elements"
            )));
        }
        let pieces = message_pieces(len, self.message_limits().any, size);
        Ok(pieces.filter(|piece| !piece.is_empty()).map(move |piece| {
            let count = (piece.len() / size) as c_int;
            (piece, count)
        }))
    }
}

impl LibraryCollectives for MpiTransport {
    fn allreduce(&self, buf: &mut [u8], element: LibraryElement, op: LibraryOp) -> Result<()> {
        let comm = self.raw()?;
        let (datatype, op) = (datatype(element), operation(op));
        for (piece, count) in self.library_messages(buf.len(), element)? {
            // SAFETY: in-place allreduce on `count` elements inside `buf`, which is live and
            // exclusively borrowed for the call.
            let code = unsafe {
                ffi::MPI_Allreduce(
                    in_place(),
                    buf[piece].as_mut_ptr().cast(),
                    count,
                    datatype,
                    op,
                    comm,
                )
            };
            check_on(comm, code, "MPI_Allreduce")?;
        }
        Ok(())
    }

    fn allreduce_from(
        &self,
        input: &[u8],
        output: &mut [u8],
        element: LibraryElement,
        op: LibraryOp,
    ) -> Result<()> {
        if input.len() != output.len() {
            return Err(CoreError::InvalidArgument(format!(
                "internal: a {}-byte input for a {}-byte result",
                input.len(),
                output.len()
            )));
        }
        let comm = self.raw()?;
        let (datatype, op) = (datatype(element), operation(op));
        for (piece, count) in self.library_messages(output.len(), element)? {
            // SAFETY: `count` elements at the same offset of `input` (live, only read) and of
            // `output` (live, exclusively borrowed for the call); they do not overlap.
            let code = unsafe {
                ffi::MPI_Allreduce(
                    input[piece.clone()].as_ptr().cast(),
                    output[piece].as_mut_ptr().cast(),
                    count,
                    datatype,
                    op,
                    comm,
                )
            };
            check_on(comm, code, "MPI_Allreduce")?;
        }
        Ok(())
    }

    fn reduce(
        &self,
        buf: &mut [u8],
        root: usize,
        element: LibraryElement,
        op: LibraryOp,
    ) -> Result<()> {
        let comm = self.raw()?;
        let (datatype, op) = (datatype(element), operation(op));
        let at_root = self.rank() == root;
        let copy_at_root = at_root && root != 0 && in_place_reduce_off_zero_crashes();
        let root = root as c_int;
        for (piece, count) in self.library_messages(buf.len(), element)? {
            let own = copy_at_root.then(|| buf[piece.clone()].to_vec());
            let data = buf[piece].as_mut_ptr();
            // SAFETY: `count` elements of `buf`, live and exclusively borrowed for the call; the
            // root reduces in place (or from `own`, a copy of the same elements, alive until
            // the call returns), the others only send theirs (the receive buffer is ignored
            // off the root).
            let code = unsafe {
                if let Some(own) = &own {
                    ffi::MPI_Reduce(
                        own.as_ptr().cast(),
                        data.cast(),
                        count,
                        datatype,
                        op,
                        root,
                        comm,
                    )
                } else if at_root {
                    ffi::MPI_Reduce(in_place(), data.cast(), count, datatype, op, root, comm)
                } else {
                    let nowhere = std::ptr::null_mut();
                    ffi::MPI_Reduce(data.cast(), nowhere, count, datatype, op, root, comm)
                }
            };
            check_on(comm, code, "MPI_Reduce")?;
        }
        Ok(())
    }
}
