//! Deliberate bugs for mutation testing of the chaos harness: each one
//! breaks an invariant the harness claims to check, so a test can prove
//! the check catches it.
//!
//! Only a build with the `mutations` feature contains them; otherwise
//! [`fires`] is a constant `false` and every hook compiles away. The switch
//! is per thread (the harness runs a whole cluster on one thread), so tests
//! running in parallel do not see each other's mutations. Each mutation
//! fires once per [`set`], at the first opportunity after
//! [`ARM_AFTER`] opportunities, so it hits a cluster in full swing.

/// A deliberate bug.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mutation {
    /// A backend does not send one task's completion.
    BackendOmitsCompletion,
    /// The scheduler plans a batch onto a GPU that is still busy.
    SchedulerPlansOntoBusyGpu,
    /// A frontend answers one request twice.
    FrontendAnswersTwice,
}

impl Mutation {
    /// Every mutation.
    pub const ALL: [Mutation; 3] =
        [Mutation::BackendOmitsCompletion, Mutation::SchedulerPlansOntoBusyGpu, Mutation::FrontendAnswersTwice];

    /// The name used on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Mutation::BackendOmitsCompletion => "backend-omits-completion",
            Mutation::SchedulerPlansOntoBusyGpu => "scheduler-plans-onto-busy-gpu",
            Mutation::FrontendAnswersTwice => "frontend-answers-twice",
        }
    }

    /// Parses a name of [`Mutation::as_str`].
    pub fn parse(s: &str) -> Option<Mutation> {
        Mutation::ALL.into_iter().find(|m| m.as_str() == s)
    }
}

/// Opportunities let pass before a mutation fires.
pub const ARM_AFTER: u32 = 20;

#[cfg(feature = "mutations")]
mod active {
    use super::{Mutation, ARM_AFTER};
    use std::cell::Cell;

    thread_local! {
        static ACTIVE: Cell<Option<Mutation>> = const { Cell::new(None) };
        static SEEN: Cell<u32> = const { Cell::new(0) };
    }

    pub fn set(m: Option<Mutation>) {
        ACTIVE.with(|a| a.set(m));
        SEEN.with(|s| s.set(0));
    }

    pub fn fires(m: Mutation) -> bool {
        if ACTIVE.with(Cell::get) != Some(m) {
            return false;
        }
        let n = SEEN.with(|s| {
            let n = s.get();
            s.set(n.saturating_add(1));
            n
        });
        n == ARM_AFTER
    }
}

/// Switches `m` on for this thread (or every mutation off).
#[cfg(feature = "mutations")]
pub fn set(m: Option<Mutation>) {
    active::set(m);
}

/// Whether mutation `m` fires at this opportunity (once per [`set`]).
#[cfg(feature = "mutations")]
#[inline]
pub fn fires(m: Mutation) -> bool {
    active::fires(m)
}

/// Whether mutation `m` fires: never, in a build without `mutations`.
#[cfg(not(feature = "mutations"))]
#[inline(always)]
pub const fn fires(_m: Mutation) -> bool {
    false
}
