//! `bench-cluster --layout auto`: which CPU each busy thread of a run gets.
//! The busy threads are the scheduler daemon's (its ModelThreads, RankThread
//! and I/O thread on the pinned engine; one thread on the inline engine),
//! the frontends process's generator and the backends process's loop (each
//! peer process is one thread). The lag targets (p99.9 <= 100 µs at 2 M
//! tasks/s) need a core per busy thread (docs/benchmarks.md, "where the
//! dispatch lag goes"); a host with fewer cores than busy threads is left to
//! the kernel, as before this planner.

use dataplane::machine::Placement;
use scheduler::daemon::engine::EngineKind;

/// Where a run's threads go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayoutPlan {
    /// The scheduler's engine.
    pub engine: EngineKind,
    /// The scheduler's `--pin-cores`: ModelThreads, then the RankThread,
    /// then the I/O thread (pinned engine); the one thread (inline). Empty:
    /// not pinned.
    pub scheduler: Vec<usize>,
    /// The frontends process's CPU (None: not pinned).
    pub frontends: Option<usize>,
    /// The backends process's CPU (None: not pinned).
    pub backends: Option<usize>,
    /// Why this plan, in words.
    pub why: String,
}

/// Peer processes that keep a core busy beside the scheduler.
const BUSY_PEERS: usize = 2;

/// The plan for a host whose usable CPUs are `cpus` (in order) and a
/// pinned engine of `model_threads` ModelThreads. Every busy thread gets a
/// CPU of its own when there are enough for the pinned engine's threads
/// and both peers; else, when the inline engine's one thread and both
/// peers fit, those three; else nothing is pinned.
pub fn plan(cpus: &[usize], model_threads: usize) -> LayoutPlan {
    let model_threads = model_threads.max(1);
    let pinned_threads = model_threads + 2; // + RankThread + I/O thread
    let n = cpus.len();
    if n >= pinned_threads + BUSY_PEERS {
        return LayoutPlan {
            engine: EngineKind::Pinned,
            scheduler: cpus[..pinned_threads].to_vec(),
            frontends: Some(cpus[pinned_threads]),
            backends: Some(cpus[pinned_threads + 1]),
            why: format!("{n} CPUs: a core for each of {model_threads} ModelThread(s), the RankThread, the I/O thread and both peer processes"),
        };
    }
    if n > BUSY_PEERS {
        return LayoutPlan {
            engine: EngineKind::Inline,
            scheduler: cpus[..1].to_vec(),
            frontends: Some(cpus[1]),
            backends: Some(cpus[2]),
            why: format!("{n} CPUs: fewer than the pinned engine's {pinned_threads} threads and 2 peers; the inline engine's thread and each peer get one"),
        };
    }
    LayoutPlan {
        engine: EngineKind::Inline,
        scheduler: Vec::new(),
        frontends: None,
        backends: None,
        why: format!("{n} CPUs for 3 busy processes: nothing pinned, the kernel shares the cores"),
    }
}

/// The layout `--engines` and `--pin-cores` state (no `--layout auto`):
/// the scheduler as pinned there (ids that do not parse are left to the
/// daemon's own check), the peers where the kernel puts them.
pub fn stated(engine: EngineKind, pin_cores: &str) -> LayoutPlan {
    let scheduler = if pin_cores == "none" { Vec::new() } else { pin_cores.split(',').filter_map(|c| c.trim().parse().ok()).collect() };
    LayoutPlan { engine, scheduler, frontends: None, backends: None, why: "as --engines and --pin-cores state; the peers not pinned".into() }
}

impl LayoutPlan {
    /// The plan as `--pin-cores`' value.
    pub fn pin_cores(&self) -> String {
        if self.scheduler.is_empty() {
            "none".into()
        } else {
            self.scheduler.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
        }
    }

    /// Every busy thread and its CPU, for the machine facts.
    pub fn placements(&self, model_threads: usize) -> Vec<Placement> {
        let cpu = |c: Option<&usize>| c.map_or_else(Vec::new, |c| vec![*c]);
        let mut v = Vec::new();
        match self.engine {
            EngineKind::Pinned => {
                for i in 0..model_threads.max(1) {
                    v.push(Placement::new(format!("scheduler ModelThread {i}"), cpu(self.scheduler.get(i))));
                }
                v.push(Placement::new("scheduler RankThread", cpu(self.scheduler.get(model_threads.max(1)))));
                v.push(Placement::new("scheduler I/O", cpu(self.scheduler.get(model_threads.max(1) + 1))));
            }
            EngineKind::Inline => v.push(Placement::new("scheduler (inline engine)", cpu(self.scheduler.first()))),
        }
        v.push(Placement::new("frontends generator", cpu(self.frontends.as_ref())));
        v.push(Placement::new("backends", cpu(self.backends.as_ref())));
        v
    }
}

/// The CPUs this process may run on, in order (its affinity mask); 0..n
/// when the mask cannot be read.
pub fn usable_cpus() -> Vec<usize> {
    // SAFETY: an all-zero cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable cpu_set_t of the size passed; pid
    // 0 is the calling thread.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect();
    }
    // SAFETY: CPU_ISSET reads the set, for ids below CPU_SETSIZE.
    (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect()
}

/// Pins the calling thread (and the threads it starts after this) to `cpu`.
pub fn pin_self(cpu: usize) -> std::io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("CPU {cpu} is beyond the affinity mask")));
    }
    // SAFETY: an all-zero cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below CPU_SETSIZE (checked above).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 is the
    // calling thread.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn busy_cpus(p: &LayoutPlan) -> Vec<usize> {
        let mut v = p.scheduler.clone();
        v.extend(p.frontends);
        v.extend(p.backends);
        v
    }

    #[test]
    fn two_cores_pin_nothing() {
        let p = plan(&[0, 1], 1);
        assert_eq!(p.engine, EngineKind::Inline);
        assert!(busy_cpus(&p).is_empty());
        assert_eq!(p.pin_cores(), "none");
        assert!(p.placements(1).iter().all(|t| t.cpus.is_empty()));
    }

    #[test]
    fn sixteen_cores_give_every_busy_thread_its_own() {
        let cpus: Vec<usize> = (0..16).collect();
        for model_threads in [1, 2, 4] {
            let p = plan(&cpus, model_threads);
            assert_eq!(p.engine, EngineKind::Pinned);
            assert_eq!(p.scheduler.len(), model_threads + 2, "ModelThreads, RankThread, I/O");
            let mut used = busy_cpus(&p);
            assert_eq!(used.len(), model_threads + 4);
            used.sort_unstable();
            used.dedup();
            assert_eq!(used.len(), model_threads + 4, "one core each: {p:?}");
            let placed = p.placements(model_threads);
            assert_eq!(placed.len(), model_threads + 4);
            assert!(placed.iter().all(|t| t.cpus.len() == 1), "{placed:?}");
        }
        assert_eq!(plan(&cpus, 1).pin_cores(), "0,1,2");
    }

    #[test]
    fn sixty_four_cores_follow_the_affinity_mask() {
        // A mask with holes (a cgroup's cpuset): only its CPUs are used.
        let cpus: Vec<usize> = (0..128).step_by(2).collect();
        assert_eq!(cpus.len(), 64);
        let p = plan(&cpus, 8);
        assert_eq!(p.engine, EngineKind::Pinned);
        assert!(busy_cpus(&p).iter().all(|c| c % 2 == 0));
        assert_eq!(p.scheduler.len(), 10);
        assert_eq!((p.frontends, p.backends), (Some(20), Some(22)));
    }

    #[test]
    fn too_few_for_the_pinned_engine_pins_the_inline_one() {
        let p = plan(&[0, 1, 2, 3], 1);
        assert_eq!(p.engine, EngineKind::Inline);
        assert_eq!((p.scheduler.as_slice(), p.frontends, p.backends), (&[0][..], Some(1), Some(2)));
        // The planner agrees with the engine's own choice on every count.
        for n in 1..=16 {
            let cpus: Vec<usize> = (0..n).collect();
            for m in 1..=4 {
                assert_eq!(plan(&cpus, m).engine, EngineKind::auto(n, m, BUSY_PEERS), "{n} cores, {m} ModelThreads");
            }
        }
    }

    #[test]
    fn this_host_has_usable_cpus() {
        let cpus = usable_cpus();
        assert!(!cpus.is_empty());
        assert!(cpus.windows(2).all(|w| w[0] < w[1]));
    }
}
