//! `netbench bw --verb send` as perftest's `ib_send_bw`: the server has
//! receives posted in advance and answers nothing; the sender keeps up to
//! `--tx-depth` operations going and flow control is the transport's own
//! (rdma: the server's receive ring, `SYMPHONY_RDMA_RECV_SLOTS`, with
//! receiver-not-ready retries beyond it, and the send queue,
//! `SYMPHONY_RDMA_SEND_SLOTS`; tcp: the socket buffers; shm: the ring).
//!
//! When an operation completes:
//! - rdma (netbench built with `--features rdma`): at the work completion
//!   of its last SEND, the RC acknowledgement that the bytes are in a
//!   receive slot of the server, as `ib_send_bw` counts its SENDs;
//! - elsewhere (tcp, tcp-blocking, shm, or rdma reached only through the
//!   transport-neutral connection): nothing reports delivery, so an
//!   operation completes when the transport accepted its last message, and
//!   the run ends when the server answers the tally below (one round trip
//!   added to the run).
//!
//! After each phase (warm-up, measurement) every link asks its server how
//! many operations landed since the last query; a count other than the
//! number sent fails the run (the bytes themselves are checked by `lat`).

use dataplane::transport::Domain;

use super::{drain, stream_done, Links, Stream, Verb};
use crate::fail::{Fail, Res};
use crate::perf_proto::{self, Op, Reply, MAX_CHUNK};

/// Whether `st` is a SEND stream the server does not answer.
pub(super) fn is_send_stream(st: &Stream) -> bool {
    st.verb == Verb::Send && !st.bidirectional
}

/// Messages (SENDs on rdma) one operation of `size` bytes takes.
fn messages_per_op(size: u32) -> u64 {
    (u64::from(size).div_ceil(MAX_CHUNK as u64)).max(1)
}

/// SENDs link `conn` has posted that have not completed, where the
/// transport says (rdma built in); `None` elsewhere.
fn sends_in_flight<D: Domain>(conn: &mut D::Conn) -> Option<Res<u64>> {
    #[cfg(feature = "rdma")]
    if let Some(c) = super::verbs::<D>(conn) {
        return Some(c.sends_in_flight().map(u64::from).map_err(Fail::from));
    }
    let _ = conn;
    None
}

impl<D: Domain> Links<D> {
    /// Posts up to `room` unanswered SEND operations of `size` bytes on link `i`.
    pub(super) fn post_send_stream(&mut self, i: usize, size: u32, room: u64, stamps: &mut Vec<u64>) -> Res<()> {
        let per_op = messages_per_op(size);
        for _ in 0..room {
            let seq = self.links[i].started;
            // Answers are not expected; `drain` refuses anything but perf messages.
            self.send_op(i, seq, Op::Send, Reply::None, size, &mut |_, _, _| {})?;
            let t = self.now();
            let l = &mut self.links[i];
            l.started += 1;
            l.msgs_posted += per_op;
            if self.sends_delivered {
                l.inflight += 1;
            } else {
                stream_done(l, stamps, t, 1);
            }
        }
        Ok(())
    }

    /// Completes link `i`'s operations whose SENDs have all completed
    /// (rdma); whether there were any.
    pub(super) fn reap_send_stream(
        &mut self,
        i: usize,
        st: &Stream,
        stamps: &mut Vec<u64>,
    ) -> Res<bool> {
        let Some(in_flight) = sends_in_flight::<D>(&mut self.links[i].conn) else {
            return Ok(false);
        };
        let in_flight = in_flight?;
        let t = self.now();
        let l = &mut self.links[i];
        let landed = l.msgs_posted.saturating_sub(in_flight) / messages_per_op(st.size);
        let new = landed.saturating_sub(l.done);
        if new > 0 {
            stream_done(l, stamps, t, new as usize);
        }
        Ok(new > 0)
    }

    /// After a SEND stream's phase: asks every link's server how many
    /// operations landed and checks the count against the link's; returns
    /// when the last tally arrived (`None` for any other stream). On rdma it
    /// also waits for the query's own SEND to complete, so that the next
    /// phase starts with nothing in flight.
    pub(super) fn check_tally(&mut self, st: &Stream) -> Res<Option<u64>> {
        if !is_send_stream(st) {
            return Ok(None);
        }
        let n = perf_proto::encode_tally_query(&mut self.msg)?;
        for i in 0..self.links.len() {
            self.links[i].tally = None;
            self.send_msg(i, n, &mut |_, _, _| {})?;
        }
        let t0 = self.now();
        let mut spins = 0u32;
        for i in 0..self.links.len() {
            loop {
                let t = self.now();
                drain(&mut self.links[i], &mut self.buf, t, |_, _, _| {})?;
                let settled = match sends_in_flight::<D>(&mut self.links[i].conn) {
                    Some(in_flight) => in_flight? == 0,
                    None => true,
                };
                if settled && self.links[i].tally.is_some() {
                    break;
                }
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(1024)
                    && self.now().saturating_sub(t0) > self.op_timeout_ns
                {
                    return Err(Fail::runtime(format!(
                        "server {} did not answer the SEND tally within {:.1} s",
                        self.links[i].addr,
                        self.op_timeout_ns as f64 / 1e9
                    )));
                }
            }
            let l = &self.links[i];
            if l.tally != Some(l.started) {
                return Err(Fail::runtime(format!(
                    "server {} landed {} of the {} {}-byte SENDs sent on this link",
                    l.addr,
                    l.tally.unwrap_or(0),
                    l.started,
                    st.size
                )));
            }
        }
        Ok(Some(self.now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operation_is_as_many_sends_as_chunks() {
        assert_eq!(messages_per_op(2), 1);
        assert_eq!(messages_per_op(MAX_CHUNK as u32), 1);
        assert_eq!(messages_per_op(MAX_CHUNK as u32 + 1), 2);
        assert_eq!(messages_per_op(1 << 20), (1u64 << 20).div_ceil(MAX_CHUNK as u64));
        assert_eq!(messages_per_op(0), 1);
    }
}
