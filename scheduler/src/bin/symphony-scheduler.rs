//! The scheduler daemon; see `scheduler::daemon`.

fn main() -> std::process::ExitCode {
    scheduler::daemon::main_with_args(std::env::args().collect())
}
