use std::collections::HashMap;

use clap::Parser;

use super::*;

/// A role's command line: one option of its own plus the shared ones.
#[derive(Parser, Debug)]
#[command(name = "symphony-test")]
struct RoleArgs {
    /// A role option.
    #[arg(long, default_value_t = 4)]
    slots: u32,
    /// A repeatable one.
    #[arg(long)]
    model: Vec<String>,
    #[command(flatten)]
    common: CommonArgs,
}

fn argv(flags: &[&str]) -> Vec<String> {
    std::iter::once("symphony-test")
        .chain(flags.iter().copied())
        .map(String::from)
        .collect()
}

fn with_env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    move |k| map.get(k).cloned()
}

fn config_file(name: &str, text: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("symphony-shell-test-{}-{name}.toml", std::process::id()));
    std::fs::write(&p, text).unwrap();
    p
}

fn load_args(flags: &[&str], env: &[(&str, &str)]) -> Result<RoleArgs, ConfigError> {
    load_from(argv(flags), &with_env(env))
}

#[test]
fn flags_beat_the_environment_which_beats_the_file_which_beats_defaults() {
    let file = config_file(
        "precedence",
        "heartbeat_ms = 10\ndead_after_ms = 500\nslots = 7\nidle = \"spin\"\nexit_with_parent = true\nmodel = [\"a=1,2,50\", \"b=1,2,50\"]\n",
    );
    let path = file.to_str().unwrap();
    let env = [("SYMPHONY_HEARTBEAT_MS", "20"), ("SYMPHONY_DEAD_AFTER_MS", "600")];
    let a = load_args(&["--config", path, "--heartbeat-ms", "30"], &env).unwrap();
    assert_eq!(a.common.heartbeat_ms, 30, "the flag wins");
    assert_eq!(a.common.dead_after_ms, 600, "the environment beats the file");
    assert_eq!(a.slots, 7, "the file beats the default");
    assert_eq!(a.common.idle, IdleStrategy::Spin);
    assert!(a.common.exit_with_parent);
    assert_eq!(a.model, ["a=1,2,50", "b=1,2,50"]);
    assert_eq!(a.common.transport, TransportKind::Shm, "the default stays");
    // The config file may also come from the environment.
    let b = load_args(&[], &[("SYMPHONY_CONFIG", path), ("SYMPHONY_MODEL", "c=1,2,50;d=1,2,50")]).unwrap();
    assert_eq!((b.slots, b.common.heartbeat_ms), (7, 10));
    assert_eq!(b.model, ["c=1,2,50", "d=1,2,50"], "a list variable is ';'-separated");
    let c = load_args(&[], &[("SYMPHONY_EXIT_WITH_PARENT", "0")]).unwrap();
    assert!(!c.common.exit_with_parent);
    let _ = std::fs::remove_file(file);
}

#[test]
fn an_unknown_key_is_refused_naming_it_and_the_file() {
    let file = config_file("unknown", "slots = 3\nslotz = 4\n");
    let e = load_args(&["--config", file.to_str().unwrap()], &[]).unwrap_err();
    let text = e.to_string();
    assert!(matches!(&e, ConfigError::UnknownKey { key, .. } if key == "slotz"), "{e:?}");
    assert!(text.contains("unknown key `slotz`") && text.contains(file.to_str().unwrap()), "{text}");
    assert!(text.contains("heartbeat_ms"), "lists the valid keys: {text}");
    let _ = std::fs::remove_file(file);
}

#[test]
fn a_bad_transport_is_refused_listing_the_valid_ones_wherever_it_comes_from() {
    let valid = "unknown transport 'udp' (shm, tcp, tcp-blocking, rdma)";
    match load_args(&["--transport", "udp"], &[]) {
        Err(ConfigError::Cli(e)) => {
            assert!(e.use_stderr());
            assert!(e.to_string().contains(valid), "{e}");
        }
        other => panic!("{other:?}"),
    }
    let e = load_args(&[], &[("SYMPHONY_TRANSPORT", "udp")]).unwrap_err().to_string();
    assert!(e.contains("environment variable SYMPHONY_TRANSPORT") && e.contains(valid), "{e}");
    let file = config_file("transport", "transport = \"udp\"\n");
    let e = load_args(&["--config", file.to_str().unwrap()], &[]).unwrap_err().to_string();
    assert!(e.contains("key `transport`") && e.contains(file.to_str().unwrap()) && e.contains(valid), "{e}");
    let _ = std::fs::remove_file(file);
}

#[test]
fn bad_files_and_values_name_their_source() {
    let e = load_args(&["--config", "/nonexistent/symphony.toml"], &[]).unwrap_err();
    assert!(matches!(e, ConfigError::Read { .. }) && e.to_string().contains("/nonexistent/symphony.toml"));
    let file = config_file("not-toml", "slots = \n");
    let e = load_args(&["--config", file.to_str().unwrap()], &[]).unwrap_err();
    assert!(matches!(e, ConfigError::Parse { .. }), "{e:?}");
    let file2 = config_file("bad-type", "slots = \"many\"\nexit_with_parent = 3\n");
    let e = load_args(&["--config", file2.to_str().unwrap()], &[]).unwrap_err().to_string();
    assert!(e.contains("key `exit_with_parent`") || e.contains("key `slots`"), "{e}");
    let e = load_args(&[], &[("SYMPHONY_METRICS", "nowhere")]).unwrap_err().to_string();
    assert!(e.contains("SYMPHONY_METRICS") && e.contains("HOST:PORT"), "{e}");
    for f in [file, file2] {
        let _ = std::fs::remove_file(f);
    }
}

#[test]
fn help_is_not_an_error_and_shared_values_are_checked_once() {
    match load_args(&["--help"], &[]) {
        Err(ConfigError::Cli(e)) => assert!(!e.use_stderr()),
        other => panic!("{other:?}"),
    }
    let a = load_args(&["--heartbeat-ms", "100", "--dead-after-ms", "100"], &[]).unwrap();
    let e = a.common.resolve().unwrap_err().to_string();
    assert!(e.starts_with("--heartbeat-ms: 100 with --dead-after-ms 100"), "{e}");
    let a = load_args(&["--control-delay-us", "2.5", "--join-token-file", "/nonexistent/token"], &[]).unwrap();
    assert_eq!(a.common.control_delay_us, Some(2.5));
    assert!(a.common.resolve().unwrap_err().to_string().contains("/nonexistent/token"));
    assert!(load_args(&["--control-delay-us", "-1"], &[]).is_err());
    assert!(load_args(&["--log-format", "xml"], &[]).is_err());
}

#[test]
fn rdma_device_port_and_gid_are_flags_with_the_variables_as_fallback() {
    let a = load_args(&["--rdma-device", "mlx5_1", "--gid-index", "3"], &[("SYMPHONY_RDMA_PORT", "2")]).unwrap();
    assert_eq!(a.common.rdma.rdma_device.as_deref(), Some("mlx5_1"));
    assert_eq!(a.common.rdma.rdma_port, Some(2));
    assert_eq!(a.common.rdma.gid_index, Some(3));
    // A flag beats its variable; nothing given leaves the transport's own
    // choice (and the SYMPHONY_RDMA_* variables it reads) in place.
    let a = load_args(&["--rdma-device", "rxe0"], &[("SYMPHONY_RDMA_DEVICE", "mlx5_0")]).unwrap();
    assert_eq!(a.common.rdma.rdma_device.as_deref(), Some("rxe0"));
    let a = load_args(&[], &[]).unwrap();
    assert_eq!((a.common.rdma.rdma_device, a.common.rdma.rdma_port, a.common.rdma.gid_index), (None, None, None));
    // Ports count from 1.
    let e = load_args(&["--rdma-port", "0"], &[]).unwrap_err().to_string();
    assert!(e.contains("rdma-port"), "{e}");
}
