//! `symphony route`: reads and writes the routing table of several active
//! scheduler groups (issue 19) in etcd.
//!
//! - `symphony route show --etcd EP`: prints the stored table (JSON).
//! - `symphony route set --etcd EP FILE`: stores FILE's table; its
//!   revision must follow the stored one (1 on an empty store).
//! - `symphony route set --etcd EP --move MODEL=GROUP`: the stored table
//!   with MODEL owned by GROUP, at the next revision.
//!
//! Writes compare the stored revision (see `Etcd::put_routes`): two
//! concurrent writers never lose a move; the loser is told to retry.

use std::path::PathBuf;

use dataplane::time::Duration;
use scheduler::election::{Etcd, EtcdConfig, EtcdTlsArgs, RoutesStoreError};
use scheduler::routes::{RouteTable, DEFAULT_ROUTES_KEY};

/// Why `symphony route` stopped.
#[derive(Debug, thiserror::Error)]
pub enum RouteCmdError {
    /// An option is invalid.
    #[error("{0}")]
    Usage(String),
    /// The store refused or could not be reached.
    #[error(transparent)]
    Store(#[from] RoutesStoreError),
    /// FILE is unreadable.
    #[error("{0}: {1}")]
    File(String, String),
    /// No runtime for the etcd client.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// What to do.
#[derive(clap::Subcommand, Debug)]
pub enum RouteAction {
    /// Print the stored routing table.
    Show {
        /// etcd client endpoints, comma separated.
        #[arg(long, value_delimiter = ',', required = true)]
        etcd: Vec<String>,
        /// The table's key.
        #[arg(long, default_value = DEFAULT_ROUTES_KEY)]
        key: String,
        #[command(flatten)]
        tls: EtcdTlsArgs,
    },
    /// Store a table (FILE, JSON) or move models (--move MODEL=GROUP, repeatable).
    Set {
        /// etcd client endpoints, comma separated.
        #[arg(long, value_delimiter = ',', required = true)]
        etcd: Vec<String>,
        /// The table's key.
        #[arg(long, default_value = DEFAULT_ROUTES_KEY)]
        key: String,
        #[command(flatten)]
        tls: EtcdTlsArgs,
        /// Move MODEL to GROUP in the stored table (one revision for all moves given).
        #[arg(long = "move", value_name = "MODEL=GROUP")]
        moves: Vec<String>,
        /// A whole table to store.
        file: Option<PathBuf>,
    },
}

/// The store at `endpoints`, over TLS when the `--etcd-*` flags say so (the
/// same flags and rules as the scheduler's and the frontend's).
fn store(endpoints: &[String], key: &str, tls: &EtcdTlsArgs) -> Result<Etcd, RouteCmdError> {
    let tls = tls.load().map_err(|(flag, why)| RouteCmdError::Usage(format!("--{flag}: {why}")))?;
    let cfg = EtcdConfig {
        endpoints: endpoints.to_vec(),
        key: key.into(),
        lease_ttl: Duration::from_millis(1000),
        op_timeout: Duration::from_millis(3000),
    };
    Ok(Etcd::with_tls(cfg, tls)?)
}

/// Runs `symphony route`.
pub fn run(action: &RouteAction) -> Result<(), RouteCmdError> {
    match action {
        RouteAction::Show { etcd, key, tls } => {
            let table = store(etcd, key, tls)?.get_routes(key)?;
            match table {
                Some(t) => println!("{}", String::from_utf8_lossy(&t.encode())),
                None => println!("no routing table under {key}"),
            }
            Ok(())
        }
        RouteAction::Set { etcd, key, tls, moves, file } => {
            let mut s = store(etcd, key, tls)?;
            let table = match (file, moves.is_empty()) {
                (Some(f), true) => {
                    let bytes = std::fs::read(f).map_err(|e| RouteCmdError::File(f.display().to_string(), e.to_string()))?;
                    RouteTable::decode(&bytes).map_err(|e| RouteCmdError::File(f.display().to_string(), e.to_string()))?
                }
                (None, false) => {
                    let Some(current) = s.get_routes(key)? else {
                        return Err(RouteCmdError::Usage(format!("no routing table under {key}: store one first with `route set FILE`")));
                    };
                    let mut next = current.clone();
                    for m in moves {
                        let Some((model, group)) = m.split_once('=') else {
                            return Err(RouteCmdError::Usage(format!("--move {m}: expected MODEL=GROUP")));
                        };
                        next = next.with_move(model, group).map_err(RoutesStoreError::from)?;
                    }
                    next.revision = current.revision + 1;
                    next
                }
                _ => return Err(RouteCmdError::Usage("give either FILE or --move MODEL=GROUP".into())),
            };
            s.put_routes(key, &table)?;
            eprintln!("stored revision {} under {key}", table.revision);
            Ok(())
        }
    }
}
