//! Device, port and GID selection.

use std::sync::Arc;

use sideway::ibverbs::address::GidType;
use sideway::ibverbs::device::{DeviceInfo as _, DeviceList};
use sideway::ibverbs::device_context::{DeviceContext, Mtu, PortState};
use sideway::ibverbs::protection_domain::ProtectionDomain;

use super::{invalid, verbs_err, RdmaConfig};
use crate::transport::Error;

/// Whether a GID is an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`): the RoCE v2
/// GID of an IPv4 interface address.
fn is_ipv4_mapped(gid: &[u8; 16]) -> bool {
    gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff
}

/// GID preference, lower is better: RoCE v2 with IPv4-mapped address (routable over
/// UDP/IPv4), then RoCE v2, then anything else (RoCE v1, InfiniBand).
fn gid_rank(gid_type: GidType, gid: &[u8; 16]) -> u8 {
    match (gid_type, is_ipv4_mapped(gid)) {
        (GidType::RoceV2, true) => 0,
        (GidType::RoceV2, false) => 1,
        _ => 2,
    }
}

/// An opened device port with its protection domain.
pub(super) struct Device {
    // Field order is drop order: the PD before the context it came from.
    pub(super) pd: Arc<ProtectionDomain>,
    pub(super) ctx: Arc<DeviceContext>,
    pub(super) name: String,
    pub(super) port: u8,
    pub(super) gid_index: u8,
    pub(super) gid: [u8; 16],
    pub(super) gid_type: GidType,
    pub(super) lid: u16,
    pub(super) mtu: Mtu,
    /// READs a QP may have outstanding as initiator (`max_qp_init_rd_atom`).
    pub(super) max_init_reads: u8,
    /// READs a QP may serve at once as responder (`max_qp_rd_atom`).
    pub(super) max_resp_reads: u8,
}

/// A device's READ depth attribute as a verbs `u8` (at least 1).
fn depth_attr(v: i32) -> u8 {
    u8::try_from(v.clamp(1, 255)).unwrap_or(1)
}

impl Device {
    pub(super) fn open(cfg: &RdmaConfig) -> Result<Device, Error> {
        let list = DeviceList::new()
            .map_err(|_| Error::Unsupported("no RDMA device list (libibverbs missing?)"))?;
        let mut chosen = None;
        for dev in list.iter() {
            let name = dev.name();
            if cfg.device.as_deref().is_some_and(|want| want != name) {
                continue;
            }
            let ctx = dev
                .open()
                .map_err(|e| verbs_err(&format!("open {name}"), e))?;
            let port = ctx
                .query_port(cfg.port)
                .map_err(|e| verbs_err(&format!("query {name} port"), e))?;
            if port.port_state() != PortState::Active && cfg.device.is_none() {
                continue;
            }
            chosen = Some((name, ctx, port));
            break;
        }
        let (name, ctx, port) = chosen.ok_or(Error::Unsupported(match cfg.device {
            Some(_) => "the configured RDMA device was not found",
            None => "no RDMA device with an active port",
        }))?;
        let (gid_index, gid, gid_type) = match cfg.gid_index {
            Some(i) => {
                let e = ctx
                    .query_gid_ex(cfg.port, i)
                    .map_err(|e| verbs_err(&format!("GID index {i}"), e))?;
                (i, e.gid().raw, e.gid_type())
            }
            None => {
                let mut best: Option<(u8, u32, [u8; 16], GidType)> = None;
                for i in 0..u32::try_from(port.gid_tbl_len()).unwrap_or(0) {
                    // Unpopulated entries fail to query or read as zero.
                    let Ok(e) = ctx.query_gid_ex(cfg.port, i) else {
                        continue;
                    };
                    let raw = e.gid().raw;
                    if raw == [0; 16] {
                        continue;
                    }
                    let rank = gid_rank(e.gid_type(), &raw);
                    if best.as_ref().is_none_or(|b| rank < b.0) {
                        best = Some((rank, i, raw, e.gid_type()));
                    }
                }
                let (_, i, raw, t) = best.ok_or_else(|| verbs_err(&name, "no usable GID"))?;
                (i, raw, t)
            }
        };
        let gid_index = u8::try_from(gid_index)
            .map_err(|_| invalid(format!("GID index {gid_index} above 255")))?;
        let attr = ctx
            .query_device()
            .map_err(|e| verbs_err(&format!("query {name}"), e))?;
        let max_init_reads = depth_attr(attr.max_qp_init_rd_atom());
        let max_resp_reads = depth_attr(attr.max_qp_rd_atom());
        let pd = ctx.alloc_pd().map_err(|e| verbs_err("ibv_alloc_pd", e))?;
        Ok(Device {
            pd,
            ctx,
            name,
            port: cfg.port,
            gid_index,
            gid,
            gid_type,
            lid: port.lid(),
            mtu: port.active_mtu(),
            max_init_reads,
            max_resp_reads,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gid_preference_is_rocev2_ipv4_first() {
        let v4 = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 2, 15];
        let link_local = [
            0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x50, 0x54, 0, 0xff, 0xfe, 0x12, 0x34, 0x56,
        ];
        assert!(is_ipv4_mapped(&v4));
        assert!(!is_ipv4_mapped(&link_local));
        assert!(gid_rank(GidType::RoceV2, &v4) < gid_rank(GidType::RoceV2, &link_local));
        assert!(gid_rank(GidType::RoceV2, &link_local) < gid_rank(GidType::RoceV1, &v4));
    }
}
