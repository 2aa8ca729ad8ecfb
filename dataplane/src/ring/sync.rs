//! The few synchronisation primitives the ring uses, swapped for loom's
//! model-checked versions under the `loom` feature.
//!
//! The ring code is written against one API in both builds: atomics with the
//! std method names, `Arc`, and an `UnsafeCell` whose contents are reached only
//! through `with`/`with_mut` closures (loom's shape, which lets loom check
//! every slot access for races).

#[cfg(feature = "loom")]
pub(crate) use loom::cell::UnsafeCell;
#[cfg(feature = "loom")]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
#[cfg(feature = "loom")]
pub(crate) use loom::sync::Arc;

#[cfg(not(feature = "loom"))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
#[cfg(not(feature = "loom"))]
pub(crate) use std::sync::Arc;

/// `core::cell::UnsafeCell` with loom's closure-based accessors.
#[cfg(not(feature = "loom"))]
#[derive(Debug)]
#[repr(transparent)]
pub(crate) struct UnsafeCell<T>(core::cell::UnsafeCell<T>);

#[cfg(not(feature = "loom"))]
impl<T> UnsafeCell<T> {
    /// Wraps `value`.
    pub(crate) const fn new(value: T) -> Self {
        UnsafeCell(core::cell::UnsafeCell::new(value))
    }

    /// Calls `f` with a shared pointer to the contents.
    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Calls `f` with a mutable pointer to the contents.
    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}
