//! The facts of the machine a benchmark ran on: processor model, core
//! count, kernel and the thread-to-core layout the run used. Every
//! benchmark prints them (text and JSON) so that a figure is compared only
//! with figures from the same kind of machine: the project's two 2-core VM
//! types differ by 2x on the same code (docs/benchmarks.md).

use std::fmt::{self, Write as _};
use std::io::Read as _;

/// Where one busy thread (or process) of a run was placed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// What the thread is: "scheduler I/O", "ModelThread 0", "frontends", ...
    pub thread: String,
    /// The CPU ids it may run on; empty: wherever the kernel puts it.
    pub cpus: Vec<usize>,
}

impl Placement {
    /// `thread` pinned to `cpus` (empty: not pinned).
    pub fn new(thread: impl Into<String>, cpus: Vec<usize>) -> Self {
        Placement { thread: thread.into(), cpus }
    }

    /// `thread`, not pinned.
    pub fn unpinned(thread: impl Into<String>) -> Self {
        Placement::new(thread, Vec::new())
    }

    fn cpus_text(&self) -> String {
        if self.cpus.is_empty() {
            return "any".into();
        }
        let mut s = String::new();
        for (i, c) in self.cpus.iter().enumerate() {
            let _ = write!(s, "{}{c}", if i > 0 { "," } else { "" });
        }
        s
    }
}

/// The machine's facts and the layout of one run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineFacts {
    /// The processor's model name (`/proc/cpuinfo`), or "unknown".
    pub processor: String,
    /// Cores this process may use (`std::thread::available_parallelism`).
    pub cores: usize,
    /// The kernel release (`/proc/sys/kernel/osrelease`), or "unknown".
    pub kernel: String,
    /// The run's thread-to-core layout.
    pub layout: Vec<Placement>,
}

/// This machine's facts, with the run's `layout`.
pub fn facts(layout: Vec<Placement>) -> MachineFacts {
    MachineFacts {
        processor: read_bounded("/proc/cpuinfo").as_deref().and_then(processor_of).unwrap_or_else(|| "unknown".into()),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        kernel: read_bounded("/proc/sys/kernel/osrelease").map(|k| clean(k.trim())).filter(|k| !k.is_empty()).unwrap_or_else(|| "unknown".into()),
        layout,
    }
}

/// At most this much of a /proc file is read: the first processor's entry
/// of `/proc/cpuinfo` is near its start on any machine.
const READ_LIMIT: u64 = 64 * 1024;

/// The longest fact kept (a model name is some tens of characters).
const FACT_LIMIT: usize = 200;

fn read_bounded(path: &str) -> Option<String> {
    let mut text = String::new();
    let file = std::fs::File::open(path).ok()?;
    // Whatever the file holds, at most READ_LIMIT bytes are taken; a cut
    // multi-byte character makes the read fail and the fact "unknown".
    file.take(READ_LIMIT).read_to_string(&mut text).ok()?;
    Some(text)
}

/// The processor model from `/proc/cpuinfo` text: x86's `model name`, or
/// the first of the fields other architectures name it with.
fn processor_of(cpuinfo: &str) -> Option<String> {
    ["model name", "Model", "cpu model", "Processor", "cpu"].iter().find_map(|key| {
        cpuinfo.lines().find_map(|line| {
            let (k, v) = line.split_once(':')?;
            (k.trim() == *key && !v.trim().is_empty()).then(|| clean(v.trim()))
        })
    })
}

/// `s` with control characters dropped and cut to [`FACT_LIMIT`] characters.
fn clean(s: &str) -> String {
    s.chars().filter(|c| !c.is_control()).take(FACT_LIMIT).collect()
}

impl MachineFacts {
    /// One line: `machine: AMD EPYC, 2 cores, kernel 6.1.0; layout: scheduler=0 frontends=any`.
    pub fn text(&self) -> String {
        let mut s = format!("machine: {}, {} cores, kernel {}; layout:", self.processor, self.cores, self.kernel);
        if self.layout.is_empty() {
            s.push_str(" (none stated)");
        }
        for p in &self.layout {
            let _ = write!(s, " {}={}", p.thread, p.cpus_text());
        }
        s
    }

    /// A JSON object: `{"processor": "...", "cores": 2, "kernel": "...",
    /// "layout": [{"thread": "...", "cpus": [0]}, ...]}` (`cpus` empty: not
    /// pinned).
    pub fn to_json(&self) -> String {
        let mut s = String::from("{\"processor\": ");
        json_string(&mut s, &self.processor);
        let _ = write!(s, ", \"cores\": {}, \"kernel\": ", self.cores);
        json_string(&mut s, &self.kernel);
        s.push_str(", \"layout\": [");
        for (i, p) in self.layout.iter().enumerate() {
            s.push_str(if i > 0 { ", {\"thread\": " } else { "{\"thread\": " });
            json_string(&mut s, &p.thread);
            let _ = write!(s, ", \"cpus\": {:?}}}", p.cpus);
        }
        s.push_str("]}");
        s
    }
}

impl fmt::Display for MachineFacts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text())
    }
}

/// Appends `v` as a JSON string literal (RFC 8259 escapes).
fn json_string(out: &mut String, v: &str) {
    out.push('"');
    for c in v.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_name_comes_from_the_first_processor() {
        let x86 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel\t\t: 1\nmodel name\t: AMD EPYC 7B13\nprocessor\t: 1\nmodel name\t: other\n";
        assert_eq!(processor_of(x86).as_deref(), Some("AMD EPYC 7B13"));
        // No `model name` (arm64 /proc/cpuinfo of some kernels): the next key that names it.
        assert_eq!(processor_of("processor : 0\nModel : Raspberry Pi 4\n").as_deref(), Some("Raspberry Pi 4"));
        assert_eq!(processor_of("processor : 0\nBogoMIPS : 50\n"), None);
        assert_eq!(processor_of(""), None);
    }

    #[test]
    fn hostile_text_is_cut_and_cleaned() {
        let long = format!("model name : {}\u{7}x\n", "a".repeat(10_000));
        let p = processor_of(&long).unwrap_or_default();
        assert_eq!(p.chars().count(), FACT_LIMIT);
        assert!(!p.contains('\u{7}'));
    }

    #[test]
    fn json_and_text_name_every_fact() {
        let f = MachineFacts {
            processor: "Intel \"Xeon\" \\ 8\u{1}".into(),
            cores: 16,
            kernel: "6.1.0".into(),
            layout: vec![Placement::new("scheduler I/O", vec![0]), Placement::unpinned("frontends"), Placement::new("backends", vec![3, 4])],
        };
        assert_eq!(
            f.to_json(),
            "{\"processor\": \"Intel \\\"Xeon\\\" \\\\ 8\\u0001\", \"cores\": 16, \"kernel\": \"6.1.0\", \"layout\": [{\"thread\": \"scheduler I/O\", \"cpus\": [0]}, {\"thread\": \"frontends\", \"cpus\": []}, {\"thread\": \"backends\", \"cpus\": [3, 4]}]}"
        );
        assert_eq!(f.text(), "machine: Intel \"Xeon\" \\ 8\u{1}, 16 cores, kernel 6.1.0; layout: scheduler I/O=0 frontends=any backends=3,4");
        let none = MachineFacts { layout: Vec::new(), ..f };
        assert!(none.text().ends_with("layout: (none stated)"));
        assert!(none.to_json().ends_with("\"layout\": []}"));
    }

    #[test]
    fn this_machine_has_facts() {
        let f = facts(vec![Placement::unpinned("test")]);
        assert!(f.cores >= 1);
        assert!(!f.processor.is_empty() && !f.kernel.is_empty());
        assert_eq!(f.layout.len(), 1);
    }
}
