//! A communication library's own collectives, which a transport may offer besides moving bytes
//! ([`super::Transport::library_collectives`]): the `mpi` algorithms run MPI_Allreduce and
//! MPI_Reduce through it, so that ringlet's schedules can be weighed against them. The
//! transport knows no dtype, so what the library can combine is named here.

use crate::error::Result;

/// An element type the library combines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LibraryElement {
    F32,
    F64,
    I32,
    I64,
}

impl LibraryElement {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            LibraryElement::F32 | LibraryElement::I32 => 4,
            LibraryElement::F64 | LibraryElement::I64 => 8,
        }
    }
}

/// How the library combines elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LibraryOp {
    Sum,
    Prod,
    Min,
    Max,
}

/// The library's collectives over exactly the transport's ranks, in place on whole elements
/// (in messages of at most the transport's limit). Every rank calls them alike.
pub trait LibraryCollectives {
    /// Combine every rank's `buf` into every rank's.
    fn allreduce(&self, buf: &mut [u8], element: LibraryElement, op: LibraryOp) -> Result<()>;

    /// Combine every rank's `input` into every rank's `output` (as long, apart from it).
    fn allreduce_from(
        &self,
        input: &[u8],
        output: &mut [u8],
        element: LibraryElement,
        op: LibraryOp,
    ) -> Result<()>;

    /// Combine every rank's `buf` into `root`'s; the others' `buf` is left as it was.
    fn reduce(
        &self,
        buf: &mut [u8],
        root: usize,
        element: LibraryElement,
        op: LibraryOp,
    ) -> Result<()>;
}
