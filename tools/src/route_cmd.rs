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
use scheduler::routes::{RouteError, RouteTable, DEFAULT_ROUTES_KEY};

/// Why `symphony route` stopped.
#[derive(Debug, thiserror::Error)]
pub enum RouteCmdError {
    /// An option is invalid.
    #[error("{0}")]
    Usage(String),
    /// The store refused or could not be reached.
    #[error(transparent)]
    Store(#[from] RoutesStoreError),
    /// FILE cannot be read.
    #[error("{}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// FILE is not a routing table.
    #[error("{}: {source}", path.display())]
    Decode {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        source: RouteError,
    },
    /// No runtime for the etcd client.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Where the table is stored.
#[derive(clap::Args, Debug)]
pub struct StoreArgs {
    /// etcd client endpoints, comma separated.
    #[arg(long, value_delimiter = ',', required = true)]
    etcd: Vec<String>,
    /// The table's key.
    #[arg(long, default_value = DEFAULT_ROUTES_KEY)]
    key: String,
    #[command(flatten)]
    tls: EtcdTlsArgs,
}

/// What to do.
#[derive(clap::Subcommand, Debug)]
pub enum RouteAction {
    /// Print the stored routing table.
    Show {
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Store a table (FILE, JSON) or move models (--move MODEL=GROUP, repeatable).
    Set {
        #[command(flatten)]
        store: StoreArgs,
        /// Move MODEL to GROUP in the stored table (one revision for all moves given).
        #[arg(long = "move", value_name = "MODEL=GROUP")]
        moves: Vec<String>,
        /// A whole table to store.
        file: Option<PathBuf>,
    },
}

/// The store at `a.etcd`, over TLS when the `--etcd-*` flags say so (the
/// same flags and rules as the scheduler's and the frontend's).
fn store(a: &StoreArgs) -> Result<Etcd, RouteCmdError> {
    let tls = a.tls.load().map_err(|(flag, why)| RouteCmdError::Usage(format!("--{flag}: {why}")))?;
    let cfg = EtcdConfig {
        endpoints: a.etcd.clone(),
        key: a.key.clone(),
        lease_ttl: Duration::from_millis(1000),
        op_timeout: Duration::from_millis(3000),
    };
    Ok(Etcd::with_tls(cfg, tls)?)
}

/// Runs `symphony route`.
pub fn run(action: &RouteAction) -> Result<(), RouteCmdError> {
    match action {
        RouteAction::Show { store: at } => {
            let key = &at.key;
            let table = store(at)?.get_routes(key)?;
            match table {
                Some(t) => println!("{}", String::from_utf8_lossy(&t.encode())),
                None => println!("no routing table under {key}"),
            }
            Ok(())
        }
        RouteAction::Set { store: at, moves, file } => {
            let key = &at.key;
            let mut s = store(at)?;
            let table = match (file, moves.is_empty()) {
                (Some(f), true) => {
                    let bytes = std::fs::read(f).map_err(|source| RouteCmdError::Read { path: f.clone(), source })?;
                    RouteTable::decode(&bytes).map_err(|source| RouteCmdError::Decode { path: f.clone(), source })?
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
