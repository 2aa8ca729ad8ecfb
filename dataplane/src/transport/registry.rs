//! A domain's registrations for the software transports: the key table
//! (capabilities, bounds, in-flight counts) plus process-local base
//! addresses, shared by the domain and all its connections.

use std::sync::Arc;

use super::{Error, Registration};
use crate::mem::{Access, AccessToken, KeyTable, Region, RegionDirectory};

/// Key table + region directory.
#[derive(Debug)]
pub(crate) struct Registry {
    pub(crate) table: KeyTable,
    pub(crate) dir: RegionDirectory,
}

impl Registry {
    pub(crate) fn new(table: KeyTable) -> Self {
        let dir = RegionDirectory::new(table.capacity());
        Registry { table, dir }
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
        Ok(Registration::new(key, region.clone(), access, 0))
    }

    /// Deregisters (Busy while accesses are in flight).
    pub(crate) fn deregister(&self, reg: &Registration) -> Result<(), Error> {
        self.table.deregister(reg.key())?;
        self.dir.remove(reg.key() & 0xffff);
        Ok(())
    }

    /// Checks an access and returns its token and the address of its first byte.
    pub(crate) fn acquire(
        &self,
        key: u32,
        offset: u64,
        len: u32,
        need: Access,
    ) -> Result<(AccessToken, *mut u8), Error> {
        let token = self.table.acquire(key, offset, len as u64, need)?;
        let base = self.dir.base(token);
        if base.is_null() {
            self.table.release(token);
            return Err(Error::BadKey);
        }
        // SAFETY: `offset + len` is within the registered length, which is
        // the region's length (checked by `acquire`), so this stays in bounds.
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
                self.dir.remove(i);
            }
        }
        busy
    }
}
