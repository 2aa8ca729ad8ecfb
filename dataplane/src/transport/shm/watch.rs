//! The host's side of a doorbell: which link each flagged slot is, and
//! the eventfd in the host's wait set.

use super::Doorbell;
use crate::transport::Connection;
use crate::waitset::WaitSet;

/// Token of the doorbell's eventfd in the wait set.
pub const DOORBELL_TOKEN: u64 = u64::MAX - 2;
/// No link in a slot.
const NO_KEY: u64 = u64::MAX;

/// The doorbell a host's shm links share (see [`Doorbell`]): subscribes
/// the links, watches the eventfd, and turns flagged slots into the links'
/// keys, so that a pass visits only the links whose peers published. A
/// host with links of several domains subscribes those of the first
/// doorbell it meets; the others keep waking through their own fds.
#[derive(Debug, Default)]
pub struct DoorbellWatch {
    bell: Option<Doorbell>,
    /// Whether the eventfd is in the wait set.
    registered: bool,
    /// Link key by slot (NO_KEY: none), as of the last sync.
    keys: Vec<u64>,
    /// The table before the sync under way.
    old_keys: Vec<u64>,
    /// Links subscribed since the last [`take_ready`](Self::take_ready):
    /// drained once (their peers may have published before seeing the
    /// subscription).
    fresh: Vec<u64>,
}

impl DoorbellWatch {
    /// Nothing watched.
    pub fn new() -> Self {
        DoorbellWatch::default()
    }

    /// Starts listing the live links (then [`watch`](Self::watch) each,
    /// then [`end_sync`](Self::end_sync)).
    pub fn begin_sync(&mut self) {
        std::mem::swap(&mut self.keys, &mut self.old_keys);
        self.keys.clear();
        self.keys.resize(crate::transport::shm_ring::doorbell::BELL_BITS, NO_KEY);
    }

    /// Subscribes the live link `key` if its transport has this host's
    /// doorbell.
    pub fn watch<C: Connection>(&mut self, key: u64, conn: &C) {
        let Some(bell) = conn.doorbell() else { return };
        if !self.bell.as_ref().is_none_or(|b| b.same(bell)) {
            return;
        }
        if self.bell.is_none() {
            self.bell = Some(bell.clone());
        }
        let Some(slot) = conn.subscribe_doorbell() else { return };
        let Some(k) = self.keys.get_mut(slot as usize) else { return };
        *k = key;
        if self.old_keys.get(slot as usize) != Some(&key) {
            self.fresh.push(key);
        }
    }

    /// Ends a sync: puts the eventfd in `set` the first time.
    pub fn end_sync(&mut self, set: &mut WaitSet) {
        if let (Some(bell), false) = (&self.bell, self.registered) {
            self.registered = set.add_keyed(bell.fd(), DOORBELL_TOKEN).is_ok();
        }
    }

    /// After the wait set's `ready_now` filled `ready`: takes the
    /// doorbell's token out (resetting the eventfd) and adds the keys of
    /// the links flagged since the last call and of those just subscribed.
    pub fn take_ready(&mut self, ready: &mut Vec<u64>) {
        let Some(bell) = &self.bell else { return };
        if let Some(i) = ready.iter().position(|&t| t == DOORBELL_TOKEN) {
            ready.swap_remove(i);
            bell.clear();
        }
        let keys = &self.keys;
        bell.take_pending(|slot| {
            // A slot no live link holds (a hostile or departed peer): ignored.
            if let Some(&k) = keys.get(slot as usize).filter(|&&k| k != NO_KEY) {
                ready.push(k);
            }
        });
        ready.append(&mut self.fresh);
    }

    /// Before sleeping: false if a link was flagged meanwhile or was
    /// just subscribed (do not sleep). True without a doorbell.
    pub fn arm(&self) -> bool {
        let Some(bell) = &self.bell else { return true };
        // Links subscribed just before the sleep may hold bytes their
        // peers published before they saw the subscription.
        self.fresh.is_empty() && bell.arm()
    }

    /// After the sleep.
    pub fn disarm(&self) {
        if let Some(bell) = &self.bell {
            bell.disarm();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::Duration;
    use crate::transport::shm::ShmDomain;
    use crate::transport::shm_ring::BellMemory;
    use crate::transport::{Domain, Listener};
    use crate::wire;

    /// A wait set holding every link's socket (key = its index) and a
    /// doorbell watch subscribed to all of them.
    fn subscribed(ours: &[super::super::ShmConn]) -> (WaitSet, DoorbellWatch) {
        let mut set = WaitSet::new().expect("wait set");
        let mut bells = DoorbellWatch::new();
        bells.begin_sync();
        for (key, conn) in ours.iter().enumerate() {
            set.add_keyed(conn.wait_fd().expect("fd"), key as u64).expect("add");
            bells.watch(key as u64, conn);
        }
        bells.end_sync(&mut set);
        (set, bells)
    }

    /// `n` links accepted by `host` from connections `peer` opened:
    /// (host's ends, peer's ends).
    fn links(host: &ShmDomain, peer: &ShmDomain, n: usize) -> (Vec<super::super::ShmConn>, Vec<super::super::ShmConn>) {
        let mut listener = host.listen("").expect("listen");
        let addr = listener.local_addr();
        let t = Duration::from_millis(5000);
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for _ in 0..n {
            std::thread::scope(|s| {
                let acc = s.spawn(|| listener.accept(t).expect("accept"));
                theirs.push(peer.connect(&addr, t).expect("connect"));
                ours.push(acc.join().expect("accept thread"));
            });
        }
        (ours, theirs)
    }

    fn heartbeat() -> Vec<u8> {
        let mut msg = [0u8; 64];
        let n = wire::encode(&mut msg, &wire::Heartbeat { seq: 1, role: 4, id: 2 }).expect("encode");
        msg[..n].to_vec()
    }

    /// Three links subscribed to the host's doorbell, their sockets in the
    /// wait set too: a message on one wakes the sleeping host once,
    /// through the doorbell alone (no byte on any link's socket), and the
    /// pass that follows is told that link only.
    #[test]
    fn a_message_wakes_the_host_through_the_doorbell_and_flags_its_link_only() {
        let (host, peer) = (ShmDomain::new().expect("host"), ShmDomain::new().expect("peer"));
        let (mut ours, mut theirs) = links(&host, &peer, 3);
        let (mut set, mut bells) = subscribed(&ours);
        let mut ready = Vec::new();
        bells.take_ready(&mut ready);
        ready.sort_unstable();
        assert_eq!(ready, [0, 1, 2], "fresh subscriptions are drained once");
        let mut buf = [0u8; 256];
        for conn in ours.iter_mut() {
            assert_eq!(conn.try_recv(&mut buf).expect("poll"), None);
            assert!(conn.arm_wait(), "nothing pending");
        }
        assert!(bells.arm());
        assert_eq!(set.wait(Duration::from_millis(20)), 0, "woke with nothing to do");
        bells.disarm();

        let msg = heartbeat();
        for round in 0..3 {
            assert!(bells.arm(), "round {round}: nothing flagged yet");
            theirs[1].send(&msg).expect("send");
            theirs[1].progress().expect("progress");
            // Once woken, the host is awake: a second message costs no
            // wake-up (nor a flag lost).
            theirs[1].send(&msg).expect("send");
            theirs[1].progress().expect("progress");
            assert_eq!(set.wait(Duration::from_millis(5000)), 1, "round {round}: one wake-up, the doorbell's");
            bells.disarm();
            ready.clear();
            set.ready_now(&mut ready);
            bells.take_ready(&mut ready);
            assert_eq!(ready, [1], "round {round}: the link that got the message, once");
            for _ in 0..2 {
                assert_eq!(ours[1].try_recv(&mut buf).expect("recv"), Some(msg.len()));
            }
            assert_eq!(ours[1].try_recv(&mut buf).expect("recv"), None);
            ready.clear();
            set.ready_now(&mut ready);
            assert!(ready.is_empty(), "round {round}: the eventfd was reset and no socket was written: {ready:?}");
        }
    }

    /// Two producer threads on two links, each sending bursts with seeded
    /// random pauses (spins, yields, sleeps) and waiting until the host
    /// has read a burst before the next (so nothing rings again for a
    /// stranded burst; the second producer ends early, the first then
    /// runs alone), and a host that sleeps on the doorbell whenever a pass
    /// finds nothing, as the scheduler daemon does: every message arrives,
    /// and none waits for the host's timer. The host's sleeps last up to
    /// 5 s, so a lost wake-up or a flag the host never looks at shows as a
    /// message seconds late (bounded: the test gives up after 60 s).
    #[test]
    fn two_producers_never_strand_a_message_behind_the_hosts_sleep() {
        const SENDS: [u64; 2] = [3000, 1000];
        let (host, peer) = (ShmDomain::new().expect("host"), ShmDomain::new().expect("peer"));
        let (mut ours, theirs) = links(&host, &peer, 2);
        let (mut set, mut bells) = subscribed(&ours);
        let start = std::time::Instant::now();
        let producers: Vec<_> = theirs
            .into_iter()
            .enumerate()
            .map(|(p, mut conn)| {
                std::thread::spawn(move || {
                    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (p as u64 + 1);
                    let mut next = move || {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        rng
                    };
                    let mut msg = [0u8; 64];
                    let mut sent = 0;
                    while sent < SENDS[p] {
                        for _ in 0..(1 + next() % 8).min(SENDS[p] - sent) {
                            let at = start.elapsed().as_nanos() as u64;
                            let n = wire::encode(&mut msg, &wire::Heartbeat { seq: at, role: 4, id: p as u32 }).expect("encode");
                            // A full ring and queue: the host is behind; wait for it.
                            while let Err(e) = conn.send(&msg[..n]) {
                                assert!(matches!(e, crate::transport::Error::QueueFull), "send: {e:?}");
                                conn.progress().expect("progress");
                                std::thread::yield_now();
                            }
                            sent += 1;
                        }
                        conn.progress().expect("progress");
                        let read = |c: &super::super::ShmConn| c.send_progress().is_some_and(|s| s.taken == s.accepted);
                        while !read(&conn) {
                            assert!(start.elapsed() < std::time::Duration::from_secs(60), "the host never read producer {p}'s burst");
                            conn.progress().expect("progress");
                            std::thread::yield_now();
                        }
                        match next() % 16 {
                            0 => std::thread::sleep(std::time::Duration::from_micros(200 + next() % 800)),
                            1..=4 => std::thread::yield_now(),
                            k => (0..k * 20).for_each(|_| std::hint::spin_loop()),
                        }
                    }
                    // Stays connected until the host has read everything.
                    while conn.progress().is_ok() && conn.is_connected() {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                })
            })
            .collect();
        let (mut got, mut worst, mut sleeps) = (0u64, 0u64, 0u64);
        let mut ready = Vec::new();
        let mut buf = [0u8; 256];
        while got < SENDS.iter().sum() {
            assert!(start.elapsed() < std::time::Duration::from_secs(60), "stuck after {got} messages");
            ready.clear();
            set.ready_now(&mut ready);
            bells.take_ready(&mut ready);
            let mut any = false;
            for &key in &ready {
                let Some(conn) = ours.get_mut(key as usize) else { continue };
                while let Some(n) = conn.try_recv(&mut buf).expect("recv") {
                    let Ok(wire::Message::Heartbeat(h)) = wire::decode(&buf[..n]) else { panic!("not a heartbeat") };
                    worst = worst.max((start.elapsed().as_nanos() as u64).saturating_sub(h.seq));
                    got += 1;
                    any = true;
                }
            }
            if any || !ours.iter().all(|c| c.arm_wait()) {
                continue;
            }
            if bells.arm() {
                sleeps += 1;
                set.wait(Duration::from_millis(5000));
            }
            bells.disarm();
        }
        drop(ours);
        for p in producers {
            p.join().expect("producer");
        }
        assert!(sleeps > 10, "the host slept {sleeps} times: the test proved little");
        assert!(worst < 1_000_000_000, "a message waited {} ms: stranded behind a sleep", worst / 1_000_000);
    }

    /// A peer writing garbage into the doorbell (any bit, any sleep word):
    /// unknown slots are ignored, known ones cost a visit, and the host's
    /// next arm and take go on working.
    #[test]
    fn garbage_in_the_doorbell_flags_only_known_links() {
        let (host, peer) = (ShmDomain::new().expect("host"), ShmDomain::new().expect("peer"));
        let (ours, _theirs) = links(&host, &peer, 2);
        let mut set = WaitSet::new().expect("wait set");
        let mut bells = DoorbellWatch::new();
        bells.begin_sync();
        for (key, conn) in ours.iter().enumerate() {
            bells.watch(10 + key as u64, conn);
        }
        bells.end_sync(&mut set);
        let mut ready = Vec::new();
        bells.take_ready(&mut ready);
        let bell = bells.bell.clone().expect("a doorbell");
        let shared = bell.inner.bell.bell();
        for w in shared.pending.0.iter() {
            w.store(u64::MAX, std::sync::atomic::Ordering::SeqCst);
        }
        shared.sleep.0.store(0xdead_beef, std::sync::atomic::Ordering::SeqCst);
        ready.clear();
        bells.take_ready(&mut ready);
        ready.sort_unstable();
        assert_eq!(ready, [10, 11], "every bit set, only the live links visited");
        assert!(bells.arm(), "the bitmap was cleared; the garbled sleep word is overwritten");
        bells.disarm();
    }
}
