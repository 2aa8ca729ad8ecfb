//! The `netbench` binary: everything is in the library ([`netbench::main`]).

fn main() {
    netbench::main();
}
