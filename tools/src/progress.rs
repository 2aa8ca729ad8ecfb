//! A one-line progress bar on stderr, drawn only when stderr is a terminal
//! (so logs and CI output stay clean).

use std::io::{IsTerminal, Write};

/// Progress of a bounded search.
pub struct Progress {
    enabled: bool,
    label: String,
}

impl Progress {
    /// A bar labelled `label`; `quiet` disables it.
    pub fn new(label: &str, quiet: bool) -> Self {
        Progress { enabled: !quiet && std::io::stderr().is_terminal(), label: label.to_string() }
    }

    /// Step `done` of at most `total`, with a note.
    pub fn update(&self, done: u32, total: u32, note: &str) {
        if !self.enabled {
            return;
        }
        let width = 30usize;
        let filled = ((done as usize * width) / total.max(1) as usize).min(width);
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r{} [{}{}] {done}/{total} {note}\x1b[K", self.label, "#".repeat(filled), " ".repeat(width - filled));
        let _ = err.flush();
    }

    /// Clears the line.
    pub fn finish(&self) {
        if self.enabled {
            let _ = write!(std::io::stderr(), "\r\x1b[K");
        }
    }
}
