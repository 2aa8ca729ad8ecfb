//! A GPU stalling past the scheduler's batch grace, in the deterministic
//! harness (virtual time, the `sim` network, the real nodes): the
//! scheduler gives the stalled batches up, takes their late reports and
//! learns from them, the backend skips the plans it could not start
//! before they were given up, and every request still ends exactly once.

use dataplane::time::Duration;
use tools::chaos::{run, ChaosConfig, FaultClass, FaultSet};

#[test]
fn a_stalled_gpu_is_learned_from_late_and_its_stale_plans_are_skipped() {
    let (mut late, mut skipped) = (0, 0);
    for seed in 1..=4 {
        let cfg = ChaosConfig::new(seed, FaultSet::only(FaultClass::Stall), Duration::from_millis(1500));
        let r = run(cfg).unwrap();
        assert!(r.ok(), "seed {seed}: {:?} unaccounted {}\n  replay: {}", r.violations, r.unaccounted, r.replay);
        assert!(r.accepted > 0, "seed {seed}: no traffic");
        eprintln!(
            "seed {seed}: accepted {} succeeded {} late {} failed {:?} late reports {} skipped {} speeds {:?}",
            r.accepted, r.succeeded, r.late, r.failed, r.late_batch_reports, r.plans_skipped, r.gpu_speed
        );
        late += r.late_batch_reports;
        skipped += r.plans_skipped;
    }
    assert!(late > 0, "no batch was reported after it was given up");
    assert!(skipped > 0, "no stale plan was skipped");
}
