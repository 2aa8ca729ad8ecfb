//! A domain's registrations for the software transports: the key table
//! (capabilities, bounds, in-flight counts) plus process-local base
//! addresses, shared by the domain and all its connections.
//!
//! The key table may live in a file that peers map read-write (shm: they
//! count their READs in flight there), so a peer can rewrite any of its
//! words. What decides whether this process touches its own memory (the
//! key's generation, the length, the access rights) is therefore also kept
//! here, in private memory, and every access is checked against that copy:
//! a peer that widens a length or revives a key can make the shared table
//! lie to other readers, never make the owner read or write past a region.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use super::{Error, Registration};
use crate::mem::{Access, AccessToken, KeyTable, Region, RegionDirectory};

/// The owner's own record of one registration (see the module docs).
#[derive(Debug, Default)]
struct Private {
    /// The live key (0: none); written last on registration.
    key: AtomicU32,
    len: AtomicU64,
    access: AtomicU8,
}

/// Key table + region directory + the private copy of what bounds access.
#[derive(Debug)]
pub(crate) struct Registry {
    pub(crate) table: KeyTable,
    pub(crate) dir: RegionDirectory,
    private: Box<[Private]>,
}

impl Registry {
    pub(crate) fn new(table: KeyTable) -> Self {
        let dir = RegionDirectory::new(table.capacity());
        let private = (0..table.capacity()).map(|_| Private::default()).collect();
        Registry { table, dir, private }
    }

    /// Registers `region`; `name` travels in the table (shm file path).
    pub(crate) fn register(
        &self,
        region: &Arc<Region>,
        access: Access,
        name: &[u8],
    ) -> Result<Registration, Error> {
        let key = self
            .table
            .register(region.len() as u64, access, name, |index| {
                self.dir.insert(index, region.clone());
            })?;
        if let Some(p) = self.private.get((key & 0xffff) as usize) {
            p.len.store(region.len() as u64, Ordering::Relaxed);
            p.access.store(access.0, Ordering::Relaxed);
            // Publishes len and access (acquire loads the key first).
            p.key.store(key, Ordering::Release);
        }
        Ok(Registration::new(key, region.clone(), access, 0))
    }

    /// Deregisters (Busy while accesses are in flight).
    pub(crate) fn deregister(&self, reg: &Registration) -> Result<(), Error> {
        self.table.deregister(reg.key())?;
        self.forget(reg.key() & 0xffff);
        Ok(())
    }

    /// Drops the private record and the base address of entry `index`
    /// (the key table freed it).
    fn forget(&self, index: u32) {
        if let Some(p) = self.private.get(index as usize) {
            p.key.store(0, Ordering::Release);
        }
        self.dir.remove(index);
    }

    /// Checks an access and returns its token and the address of its first byte.
    pub(crate) fn acquire(
        &self,
        key: u32,
        offset: u64,
        len: u32,
        need: Access,
    ) -> Result<(AccessToken, *mut u8), Error> {
        // The shared table decides liveness and counts the access in flight
        // (so deregistration waits for it); the private record decides
        // whether the access fits the region (see the module docs).
        let token = self.table.acquire(key, offset, len as u64, need)?;
        let fits = self.private.get(token.index() as usize).map_or(Err(Error::BadKey), |p| {
            if p.key.load(Ordering::Acquire) != key {
                Err(Error::BadKey)
            } else if !Access(p.access.load(Ordering::Relaxed)).contains(need) {
                Err(Error::AccessDenied)
            } else if offset
                .checked_add(len as u64)
                .is_none_or(|end| end > p.len.load(Ordering::Relaxed))
            {
                Err(Error::OutOfBounds)
            } else {
                Ok(())
            }
        });
        let base = self.dir.base(token);
        if let Err(e) = fits {
            self.table.release(token);
            return Err(e);
        }
        if base.is_null() {
            self.table.release(token);
            return Err(Error::BadKey);
        }
        // SAFETY: `offset + len` is within the length recorded privately at
        // registration, which is the region's length (checked just above,
        // not trusting the shared table), so this stays in bounds.
        Ok((token, unsafe { base.add(offset as usize) }))
    }

    pub(crate) fn release(&self, token: AccessToken) {
        self.table.release(token);
    }

    /// Frees every entry with nothing in flight (domain shutdown); returns
    /// how many stayed busy.
    pub(crate) fn close_all(&self) -> usize {
        let busy = self.table.close_all();
        for i in 0..self.table.capacity() {
            if !self.table.is_used(i) {
                self.forget(i);
            }
        }
        busy
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::{KeyTable, Region};
    use memmap2::MmapOptions;

    /// A registry whose key table lies in memory a "peer" can write (as an
    /// shm registry file is), and a pointer to that memory.
    fn shared_registry(cap: u32) -> (Registry, *mut u8) {
        let map = MmapOptions::new()
            .len(KeyTable::bytes_for(cap))
            .map_anon()
            .expect("anonymous map");
        let raw = memmap2::MmapRaw::from(map);
        let ptr = raw.as_mut_ptr();
        let table = KeyTable::in_mapping(raw, 0, cap).expect("table");
        (Registry::new(table), ptr)
    }

    /// Byte offset of entry `index`'s `len` word (`state: u32, inflight:
    /// u32, len: u64`, repr(C)).
    fn len_word(index: u32) -> usize {
        index as usize * std::mem::size_of::<crate::mem::KeyEntry>() + 8
    }

    #[test]
    fn a_peer_widening_a_shared_length_does_not_widen_the_owners_access() {
        let (reg, shared) = shared_registry(4);
        let region = Region::anonymous(4096).expect("region");
        let r = reg.register(&region, Access::ALL, b"").expect("register");
        let index = r.key() & 0xffff;
        // The peer rewrites the length in the table it maps read-write.
        // SAFETY: the word lies inside the 4-entry table mapping and is an
        // AtomicU64 in the table; written atomically as the peer would.
        let word = unsafe { &*(shared.add(len_word(index)) as *const AtomicU64) };
        assert_eq!(word.load(Ordering::SeqCst), 4096, "layout as assumed");
        word.store(1 << 40, Ordering::SeqCst);
        for need in [Access::REMOTE_READ, Access::LOCAL_WRITE] {
            let past = reg.acquire(r.key(), 0, 8192, need).map(|(t, _)| t);
            assert!(matches!(past, Err(Error::OutOfBounds)), "{need:?}: {past:?}");
            let tail = reg.acquire(r.key(), 4096, 1, need).map(|(t, _)| t);
            assert!(matches!(tail, Err(Error::OutOfBounds)), "{need:?}: {tail:?}");
        }
        // Inside the real region, access still works and is counted.
        let (token, _) = reg.acquire(r.key(), 0, 4096, Access::REMOTE_READ).expect("in bounds");
        reg.release(token);
        reg.deregister(&r).expect("deregister");
    }

    #[test]
    fn a_peer_reviving_an_old_key_or_rights_in_the_shared_table_is_refused() {
        let (reg, shared) = shared_registry(4);
        let region = Region::anonymous(4096).expect("region");
        let r = reg.register(&region, Access::LOCAL_WRITE, b"").expect("register");
        let index = r.key() & 0xffff;
        // SAFETY: entry `index`'s state word, an AtomicU32 at its start.
        let state = unsafe {
            &*(shared.add(index as usize * std::mem::size_of::<crate::mem::KeyEntry>()) as *const AtomicU32)
        };
        // The peer grants REMOTE_READ on a LOCAL_WRITE-only registration.
        let s = state.load(Ordering::SeqCst);
        state.store(s | (Access::ALL.0 as u32) << 8, Ordering::SeqCst);
        let denied = reg.acquire(r.key(), 0, 16, Access::REMOTE_READ).map(|(t, _)| t);
        assert!(matches!(denied, Err(Error::AccessDenied)), "{denied:?}");
        // After deregistration the peer puts the old generation back live.
        state.store(s, Ordering::SeqCst);
        reg.deregister(&r).expect("deregister");
        state.store(s, Ordering::SeqCst);
        let revived = reg.acquire(r.key(), 0, 16, Access::LOCAL_WRITE).map(|(t, _)| t);
        assert!(matches!(revived, Err(Error::BadKey)), "{revived:?}");
    }
}
