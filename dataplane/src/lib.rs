//! Mechanisms with no scheduling policy in them: monotonic time, SPSC rings,
//! pinned polling loops and idle strategies, timers, registered memory, wire
//! messages and transports.
#![warn(missing_docs)]

pub mod heap;
pub mod ids;
pub mod idle;
pub mod mem;
pub mod mutation;
pub mod reference;
pub mod spsc;
pub mod stats;
pub mod time;
pub mod timer;
pub mod transport;
pub mod waitset;
pub mod wire;
pub mod control;
pub mod join;
pub mod capability;
pub mod reconnect;
pub mod machine;
