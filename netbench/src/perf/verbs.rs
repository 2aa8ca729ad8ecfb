//! Verbs-only pieces of `lat`/`bw` (netbench built with `--features rdma`):
//! the verbs connection behind a transport-neutral one, one-sided WRITEs.

use dataplane::transport::{Domain, Error as TransportError, ReadOp};

#[cfg(feature = "rdma")]
use super::POST_AT_ONCE;
#[cfg(feature = "rdma")]
use dataplane::transport::{LocalRef, RemoteRef};

/// The verbs connection behind `conn` when `D` is the rdma transport: its
/// one-sided WRITE is not part of the transport-neutral
/// [`Connection`](dataplane::transport::Connection).
#[cfg(feature = "rdma")]
pub(super) fn verbs<D: Domain>(
    conn: &mut D::Conn,
) -> Option<&mut dataplane::transport::rdma::RdmaConnection> {
    use dataplane::transport::rdma::RdmaDomain;
    use std::any::TypeId;
    if TypeId::of::<D>() != TypeId::of::<RdmaDomain>() {
        return None;
    }
    // SAFETY: `D` is `RdmaDomain` (same TypeId), whose `Conn` is
    // `RdmaConnection`, so `conn` points at a live `RdmaConnection`; the
    // returned borrow is `conn`'s own mutable borrow.
    Some(unsafe {
        &mut *(conn as *mut D::Conn).cast::<dataplane::transport::rdma::RdmaConnection>()
    })
}

/// Whether `D` posts one-sided WRITEs (the rdma transport, when netbench is
/// built with its `rdma` feature).
pub(super) fn writes_one_sided<D: Domain>() -> bool {
    #[cfg(feature = "rdma")]
    {
        std::any::TypeId::of::<D>()
            == std::any::TypeId::of::<dataplane::transport::rdma::RdmaDomain>()
    }
    #[cfg(not(feature = "rdma"))]
    {
        let _ = std::any::type_name::<D>();
        false
    }
}

/// Posts `ops` as RDMA WRITEs on link `conn` (see [`verbs`]).
pub(super) fn post_writes<D: Domain>(
    conn: &mut D::Conn,
    ops: &[ReadOp],
) -> Result<usize, TransportError> {
    #[cfg(feature = "rdma")]
    if let Some(c) = verbs::<D>(conn) {
        let mut w = [dataplane::transport::rdma::WriteOp {
            wr_id: 0,
            source: LocalRef::default(),
            target: RemoteRef::default(),
        }; POST_AT_ONCE];
        let n = ops.len().min(POST_AT_ONCE);
        for (w, op) in w.iter_mut().zip(&ops[..n]) {
            w.wr_id = op.wr_id;
            w.source = op.local;
            w.target = op.remote;
        }
        return c.post_writes(&w[..n]);
    }
    let _ = (conn, ops);
    Err(TransportError::Unsupported(
        "one-sided WRITE on this transport",
    ))
}
