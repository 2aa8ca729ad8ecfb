//! For unit tests that drive one node by hand over the sim transport: the
//! test plays the node's peers with [`SimPeer`]s (ends of
//! [`SimNet::link`]s) and moves the clock with [`SimNet::settle`].

use super::{SimConn, SimNet};
use crate::time::Instant;
use crate::transport::{Connection, Error};
use crate::wire::{self, FixedMessage, WireError};

/// A peer's end of a link, played by a test: encodes and sends wire
/// messages, takes what has arrived.
#[derive(Debug)]
pub struct SimPeer {
    /// The link end (for raw sends or checks).
    pub link: SimConn,
    buf: Vec<u8>,
}

impl SimPeer {
    /// Plays the peer at `link`.
    pub fn new(link: SimConn) -> Self {
        SimPeer { link, buf: vec![0; wire::MAX_MESSAGE_LEN] }
    }

    /// Encodes and sends one fixed-size message.
    pub fn send<M: FixedMessage>(&mut self, msg: &M) -> Result<(), Error> {
        self.send_encoded(|buf| wire::encode(buf, msg))
    }

    /// Sends what `encode` writes into a buffer of
    /// [`wire::MAX_MESSAGE_LEN`] bytes (for variable-length messages).
    pub fn send_encoded(&mut self, encode: impl FnOnce(&mut [u8]) -> Result<usize, WireError>) -> Result<(), Error> {
        let n = encode(&mut self.buf)?;
        self.link.send(&self.buf[..n])
    }

    /// Every message that has arrived by now, raw, in order.
    pub fn take_all(&mut self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        while let Ok(Some(n)) = self.link.try_recv(&mut self.buf) {
            out.push(self.buf[..n].to_vec());
        }
        out
    }

    /// Plays the scheduler's opening of a registration: a
    /// [`wire::Challenge`] with `nonce` that asks for no token.
    pub fn challenge(&mut self, nonce: [u8; wire::NONCE_LEN]) -> Result<(), Error> {
        self.send(&wire::Challenge::new(nonce, false))
    }

    /// The first [`wire::Join`] among the messages that have arrived by
    /// now (the others are dropped): the answer to [`challenge`](Self::challenge).
    pub fn take_join(&mut self) -> Option<wire::Join> {
        self.take_all().iter().find_map(|m| match wire::decode(m) {
            Ok(wire::Message::Join(j)) => Some(j),
            _ => None,
        })
    }

    /// Whether the next receive reports the peer gone (nothing left to
    /// read and the other end closed).
    pub fn disconnected(&mut self) -> bool {
        matches!(self.link.try_recv(&mut self.buf), Err(Error::PeerDisconnected))
    }
}

impl SimNet {
    /// Moves the clock to `now`, then calls `poll` (a node's `poll(now)`)
    /// until it reports no progress. False if it still made progress after
    /// `max_polls` calls (a node that never goes quiet).
    pub fn settle(&self, now: Instant, max_polls: usize, mut poll: impl FnMut(Instant) -> bool) -> bool {
        self.set_now(now);
        (0..max_polls).any(|_| !poll(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::sim::FaultConfig;
    use crate::wire::{Heartbeat, Message, Role};

    #[test]
    fn a_peer_sends_and_takes_wire_messages_and_sees_a_departure() {
        let net = SimNet::new(1, FaultConfig::same_instant());
        let (a, b) = net.link(1, 2).unwrap();
        let (mut a, mut b) = (SimPeer::new(a), SimPeer::new(b));
        a.send(&Heartbeat { seq: 1, role: Role::Frontend as u32, id: 0 }).unwrap();
        a.send_encoded(|buf| wire::encode_models(buf, &[3, 4])).unwrap();
        let got = b.take_all();
        assert_eq!(got.len(), 2);
        assert!(matches!(wire::decode(&got[0]).unwrap(), Message::Heartbeat(h) if h.seq == 1));
        assert!(matches!(wire::decode(&got[1]).unwrap(), Message::Models(..)));
        assert!(b.take_all().is_empty() && !b.disconnected());
        drop(a);
        assert!(b.disconnected());
    }

    #[test]
    fn a_peer_plays_the_scheduler_s_challenge_and_takes_the_join() {
        let net = SimNet::new(1, FaultConfig::same_instant());
        let (a, b) = net.link(1, 2).unwrap();
        let (mut sched, mut peer) = (SimPeer::new(a), SimPeer::new(b));
        sched.challenge([7; wire::NONCE_LEN]).unwrap();
        let got = peer.take_all();
        assert!(matches!(wire::decode(&got[0]).unwrap(), Message::Challenge(c) if c.nonce == [7; wire::NONCE_LEN]));
        assert_eq!(sched.take_join(), None);
        peer.send(&Heartbeat { seq: 1, role: Role::Frontend as u32, id: 4 }).unwrap();
        peer.send(&wire::Join::new(Role::Frontend, 4, 0, "fe4")).unwrap();
        assert_eq!(sched.take_join().map(|j| (j.id, j.endpoint().to_string())), Some((4, "fe4".to_string())));
    }

    #[test]
    fn settle_moves_the_clock_and_polls_until_quiet() {
        let net = SimNet::new(1, FaultConfig::same_instant());
        let t = Instant::from_nanos(50);
        let mut busy = 3;
        let mut seen = Vec::new();
        assert!(net.settle(t, 10, |now| {
            seen.push(now);
            busy -= 1;
            busy > 0
        }));
        assert_eq!((net.now(), seen.len()), (t, 3));
        assert!(!net.settle(t, 5, |_| true), "never quiet");
    }
}
