//! Serving acceptance checks over the in-process stack and `symphony up`,
//! in one test binary (each binary costs CI a link): per-stage latency
//! (issue 14), admission and cancellation (issue 17), `/stats` = `/metrics`,
//! model control under load and TLS through `up` (issue 16), late answers
//! and resent batches the scheduler gave up (issue 54).

mod admission;
mod fail_back;
mod frontend_join;
mod late_answers;
mod model_control;
mod overload;
mod stages;
mod up_tls;
