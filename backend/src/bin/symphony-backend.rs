//! `symphony-backend`: see `backend::daemon`.

fn main() -> std::process::ExitCode {
    backend::daemon::main_with_args(std::env::args().collect())
}
