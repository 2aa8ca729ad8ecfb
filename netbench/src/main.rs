//! netbench: incast one-sided READ tail-latency benchmark (being built; see docs/architecture.md).
fn main() {
    eprintln!("netbench: not built yet");
    std::process::exit(2);
}
