//! Emulated GPUs: a batch of `b` occupies its device for exactly `l(b)` of
//! the model's profile, starting at `max(now, exec_at, device free)`.
//!
//! Timing and device state are the scheduler's one emulated GPU set
//! ([`scheduler_core::gpu::GpuSet`]): any number of devices share its heap of
//! finish times, so a process emulating a whole rack costs one heap, not a
//! core or a thread per GPU. This executor adds what a backend needs on
//! top: one batch per device, and outputs computed when the batch finishes
//! (that is when a real GPU's device-to-host copy lands), with
//! [`crate::output`].

use std::sync::Arc;

use dataplane::mem::Region;
use dataplane::time::Instant;
use scheduler_core::gpu::GpuSet;

use super::{check_job, ExecError, ExecModel, Executor, Finished, InputRef, Job, OutputRef};
use crate::output::OutputHasher;

/// The batch a device holds, as far as its outputs go.
#[derive(Debug)]
struct DeviceJob {
    model: u32,
    /// The batch's inputs, copied at submit (capacity `max_batch`).
    inputs: Vec<InputRef>,
    output: OutputRef,
}

/// Many emulated GPUs on one [`GpuSet`].
#[derive(Debug)]
pub struct EmulatedExecutor {
    staging: Arc<Region>,
    models: Vec<ExecModel>,
    max_batch: u32,
    /// What each device computes; its timeline is in `gpus`.
    jobs: Vec<DeviceJob>,
    /// The devices; a batch's tag is its job tag.
    gpus: GpuSet<u64>,
    /// One output, built before it is copied into the region.
    out_scratch: Vec<u8>,
    busy_rejections: u64,
}

/// Bytes hashed per copy out of the staging region.
const CHUNK: usize = 4096;

impl EmulatedExecutor {
    /// `devices` emulated GPUs running `models` (indexed by model id) on
    /// batches of at most `max_batch`, with inputs and outputs in `staging`.
    pub fn new(staging: Arc<Region>, devices: u32, max_batch: u32, models: Vec<ExecModel>) -> Self {
        let max_out = models.iter().map(|m| m.output_len).max().unwrap_or(0);
        let jobs = (0..devices)
            .map(|_| DeviceJob {
                model: 0,
                inputs: Vec::with_capacity(max_batch as usize),
                output: OutputRef::default(),
            })
            .collect::<Vec<_>>();
        EmulatedExecutor {
            staging,
            models,
            max_batch,
            jobs,
            gpus: GpuSet::new(devices),
            out_scratch: vec![0; max_out as usize],
            busy_rejections: 0,
        }
    }

    /// Submissions refused because the device was busy (should stay 0).
    pub fn busy_rejections(&self) -> u64 {
        self.busy_rejections
    }

    /// When `device` is next free (the finish of its last or current batch).
    pub fn free_at(&self, device: u32) -> Option<Instant> {
        self.gpus.free_at(device)
    }

    /// Multiplies later batches' time on `device` by `factor` (the
    /// slow-GPU fault; 1 restores the profile). False for an unknown device
    /// or a factor that is not positive and finite.
    pub fn set_slowdown(&mut self, device: u32, factor: f64) -> bool {
        self.gpus.set_slowdown(device, factor)
    }

    fn compute_outputs(&mut self, device: usize) -> bool {
        let d = &self.jobs[device];
        let Some(model) = self.models.get(d.model as usize) else {
            return false;
        };
        let out_len = model.output_len as usize;
        let mut chunk = [0u8; CHUNK];
        for (i, input) in d.inputs.iter().enumerate() {
            let mut h = OutputHasher::new(d.model);
            let mut done = 0u64;
            while done < u64::from(input.len) {
                let n = (u64::from(input.len) - done).min(CHUNK as u64) as usize;
                if self
                    .staging
                    .read_at(input.offset + done, &mut chunk[..n])
                    .is_err()
                {
                    return false;
                }
                h.update(&chunk[..n]);
                done += n as u64;
            }
            let out = &mut self.out_scratch[..out_len];
            h.fill(out);
            let at = d.output.offset + i as u64 * u64::from(d.output.stride);
            if self.staging.write_at(at, out).is_err() {
                return false;
            }
        }
        true
    }
}

impl Executor for EmulatedExecutor {
    fn devices(&self) -> u32 {
        self.gpus.devices()
    }

    fn max_batch(&self) -> u32 {
        self.max_batch
    }

    fn output_len(&self, model: u32) -> Option<u32> {
        self.models.get(model as usize).map(|m| m.output_len)
    }

    fn is_idle(&self, device: u32) -> bool {
        self.gpus.is_idle(device)
    }

    fn submit(&mut self, now: Instant, job: &Job<'_>) -> Result<(), ExecError> {
        let model = self
            .models
            .get(job.model as usize)
            .ok_or(ExecError::NoSuchModel(job.model))?;
        let d = self
            .jobs
            .get_mut(job.device as usize)
            .ok_or(ExecError::NoSuchDevice(job.device))?;
        if !self.gpus.is_idle(job.device) {
            self.busy_rejections += 1;
            return Err(ExecError::DeviceBusy { device: job.device });
        }
        check_job(job, self.staging.len(), self.max_batch, model.output_len)?;
        let l = model.profile.latency(job.inputs.len() as u32);
        self.gpus
            .submit(job.device, now.max(job.exec_at), l, job.tag)
            .map_err(|_| ExecError::NoSuchDevice(job.device))?;
        d.model = job.model;
        d.inputs.clear();
        d.inputs.extend_from_slice(job.inputs);
        d.output = job.output;
        Ok(())
    }

    fn poll(&mut self, now: Instant, out: &mut [Finished]) -> usize {
        let mut n = 0;
        while n < out.len() {
            let Some(done) = self.gpus.pop_finished(now) else {
                break;
            };
            let ok = self.compute_outputs(done.device as usize);
            out[n] = Finished {
                tag: done.tag,
                device: done.device,
                batch: self.jobs[done.device as usize].inputs.len() as u32,
                start: done.start,
                finish: done.finish,
                ok,
            };
            n += 1;
        }
        n
    }

    fn next_wakeup(&self) -> Option<Instant> {
        self.gpus.poll_at()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::expected_output;
    use dataplane::time::Duration;
    use scheduler_core::profile::LatencyProfile;

    fn exec(devices: u32) -> (Arc<Region>, EmulatedExecutor) {
        let region = Region::anonymous(1 << 16).unwrap();
        let models = vec![ExecModel {
            profile: LatencyProfile::linear(1.0, 5.0, 32).unwrap(),
            output_len: 20,
        }];
        let e = EmulatedExecutor::new(region.clone(), devices, 8, models);
        (region, e)
    }

    #[test]
    fn occupies_the_device_for_exactly_l_of_b_and_refuses_a_second_batch() {
        let (region, mut e) = exec(2);
        region.write_at(0, b"abc").unwrap();
        region.write_at(100, b"defg").unwrap();
        let inputs = [
            InputRef { offset: 0, len: 3 },
            InputRef {
                offset: 100,
                len: 4,
            },
        ];
        let job = Job {
            tag: 7,
            device: 1,
            model: 0,
            exec_at: Instant::from_nanos(1_000),
            inputs: &inputs,
            output: OutputRef {
                offset: 4096,
                stride: 32,
            },
        };
        e.submit(Instant::ZERO, &job).unwrap();
        assert!(matches!(
            e.submit(Instant::ZERO, &job),
            Err(ExecError::DeviceBusy { device: 1 })
        ));
        assert_eq!(e.busy_rejections(), 1);
        assert!(e.is_idle(0) && !e.is_idle(1));
        let l2 = Duration::from_millis(7);
        assert_eq!(e.next_wakeup(), Some(Instant::from_nanos(1_000) + l2));
        let mut out = [Finished::default(); 4];
        assert_eq!(
            e.poll(Instant::from_nanos(1_000) + l2 - Duration(1), &mut out),
            0
        );
        assert_eq!(e.poll(Instant::from_nanos(50_000_000), &mut out), 1);
        assert_eq!(out[0].start, Instant::from_nanos(1_000));
        assert_eq!(out[0].finish, Instant::from_nanos(1_000) + l2);
        assert_eq!(
            (out[0].tag, out[0].device, out[0].batch, out[0].ok),
            (7, 1, 2, true)
        );
        let mut want = [0u8; 20];
        let mut got = [0u8; 20];
        expected_output(0, b"defg", &mut want);
        region.read_at(4096 + 32, &mut got).unwrap();
        assert_eq!(got, want);
        // Next batch on the same device, planned before it was free: starts
        // when it frees (never overlaps), here at submit time `now`.
        let job2 = Job {
            exec_at: Instant::ZERO,
            ..job
        };
        e.submit(Instant::from_nanos(50_000_000), &job2).unwrap();
        assert_eq!(e.free_at(1), Some(Instant::from_nanos(57_000_000)));
    }

    #[test]
    fn rejects_bad_jobs_without_changing_the_device() {
        let (_r, mut e) = exec(1);
        let inputs = [InputRef {
            offset: (1 << 16) - 2,
            len: 3,
        }];
        let mut job = Job {
            tag: 0,
            device: 0,
            model: 0,
            exec_at: Instant::ZERO,
            inputs: &inputs,
            output: OutputRef {
                offset: 0,
                stride: 20,
            },
        };
        assert!(matches!(
            e.submit(Instant::ZERO, &job),
            Err(ExecError::BadJob(_))
        ));
        job.inputs = &[];
        assert!(matches!(
            e.submit(Instant::ZERO, &job),
            Err(ExecError::BadJob(_))
        ));
        job.model = 3;
        assert!(matches!(
            e.submit(Instant::ZERO, &job),
            Err(ExecError::NoSuchModel(3))
        ));
        job.model = 0;
        job.device = 5;
        assert!(matches!(
            e.submit(Instant::ZERO, &job),
            Err(ExecError::NoSuchDevice(5))
        ));
        assert!(e.is_idle(0));
        assert_eq!(e.next_wakeup(), None);
    }
}
