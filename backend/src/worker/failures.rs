//! The log line of a batch that failed on its executor: without it a
//! client sees only "model execution failed on its backend" and the
//! operator only `symphony_backend_tasks_failed_total` (issue 54).

/// Distinct (model, reason) pairs logged; later new ones are only counted
/// (a reason can name a batch size, so the pairs are not few by nature).
const MAX_LOGGED: usize = 64;

/// The (model, reason) pairs already logged.
#[derive(Debug, Default)]
pub(super) struct FailureLog {
    logged: Vec<(u32, String)>,
}

impl FailureLog {
    /// A batch of `batch` tasks of `model` failed for `reason` (the
    /// executor's latest error): logs it the first time this model fails
    /// for this reason, up to [`MAX_LOGGED`] pairs. Returns whether it
    /// logged.
    pub(super) fn failed(&mut self, model: u32, batch: u32, reason: Option<&str>) -> bool {
        let reason = reason.unwrap_or("the executor gave no reason");
        if self.logged.len() >= MAX_LOGGED || self.logged.iter().any(|(m, r)| *m == model && r == reason) {
            return false;
        }
        self.logged.push((model, reason.to_string()));
        tracing::warn!(model, batch, reason, "a batch failed on the executor; its tasks are answered with an execution error (logged once per model and reason)");
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_model_and_reason_is_logged_once_and_the_pairs_are_bounded() {
        let mut log = FailureLog::default();
        assert!(log.failed(0, 72, Some("model a: batch 72 above max_batch_size 8")));
        assert!(!log.failed(0, 72, Some("model a: batch 72 above max_batch_size 8")));
        assert!(log.failed(1, 72, Some("model a: batch 72 above max_batch_size 8")));
        assert!(log.failed(0, 1, None));
        assert!(!log.failed(0, 1, None));
        for i in 0..2 * MAX_LOGGED as u32 {
            log.failed(2, i, Some(&format!("reason {i}")));
        }
        assert_eq!(log.logged.len(), MAX_LOGGED);
        assert!(!log.failed(3, 1, Some("yet another")));
    }
}
