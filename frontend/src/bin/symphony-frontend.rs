//! `symphony-frontend`: see `frontend::daemon`.

fn main() -> std::process::ExitCode {
    frontend::daemon::main_with_args(std::env::args().collect())
}
