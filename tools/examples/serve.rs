//! Serves the KServe v2 HTTP and gRPC APIs over the in-process cluster.
//!
//! `cargo run -p tools --example serve -- --port 0 --print-port`
//! prints `GRPC_PORT <n>` then `PORT <n>` on stdout once listening, then serves until stdin
//! closes or SIGTERM/ctrl-c.

use clap::Parser;
use tools::inproc::server::{LocalConfig, LocalServer};
use frontend::models::ModelCatalog;
use scheduler::zoo::{parse_model_arg, Zoo, ZooSelection};
use std::io::Write;
use std::net::SocketAddr;

#[derive(Parser)]
struct Args {
    /// Port on 127.0.0.1 (0 picks one).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Print `PORT <n>` on stdout when listening.
    #[arg(long)]
    print_port: bool,
    /// Zoo table: 1080ti or a100.
    #[arg(long, default_value = "a100")]
    zoo: String,
    /// Models of the zoo: all, strong, weak, none, or names (comma-separated).
    #[arg(long, default_value = "ResNet50,DenseNet121")]
    models: String,
    /// Extra models NAME=ALPHA_MS,BETA_MS,SLO_MS.
    #[arg(long = "model")]
    extra: Vec<String>,
    /// Narrowest schedulable window of the in-process scheduler, ms (its
    /// timer's lateness bound).
    #[arg(long, default_value_t = 5.0)]
    timer_slack_ms: f64,
    /// Emulated GPUs.
    #[arg(long, default_value_t = 2)]
    gpus: u32,
    /// Staging slots (requests in flight at most).
    #[arg(long, default_value_t = 4096)]
    slots: u32,
    /// Largest request body, bytes.
    #[arg(long, default_value_t = 1 << 20)]
    max_body: usize,
    /// Exit when stdin reaches end of file (for harnesses).
    #[arg(long)]
    exit_on_stdin_eof: bool,
    /// TLS certificate (PEM) for HTTP and gRPC, with --tls-key.
    #[arg(long)]
    tls_cert: Option<std::path::PathBuf>,
    /// TLS private key (PEM).
    #[arg(long)]
    tls_key: Option<std::path::PathBuf>,
    /// File holding the admin token that model load/unload and the
    /// repository index need (default: none, and they are refused).
    #[arg(long)]
    admin_token_file: Option<std::path::PathBuf>,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let zoo = Zoo::parse(&args.zoo)?;
    let mut specs = match args.models.as_str() {
        "none" => Vec::new(),
        sel => ZooSelection::parse(sel)
            .select(zoo.models())
            ?,
    };
    for m in &args.extra {
        specs.push(parse_model_arg(m)?);
    }
    let mut cfg = LocalConfig::new(ModelCatalog::with_default_tensors(&specs));
    cfg.addr = SocketAddr::from(([127, 0, 0, 1], args.port));
    cfg.cluster.gpus = args.gpus;
    cfg.cluster.timer_slack = dataplane::time::Duration::from_millis_f64(args.timer_slack_ms);
    cfg.slots = args.slots;
    cfg.http.max_body = args.max_body;
    cfg.tls = frontend::tls::from_options(args.tls_cert.as_ref(), args.tls_key.as_ref())?;
    if let Some(p) = &args.admin_token_file {
        let admin = frontend::api::AdminCredential::new(&std::fs::read(p)?).ok_or("the admin token is too short")?;
        cfg.http.admin = Some(admin);
        cfg.grpc.admin = Some(admin);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        ?;
    rt.block_on(async move {
        let server = LocalServer::start(cfg).await?;
        if args.print_port {
            println!("GRPC_PORT {}", server.grpc_addr().port());
            println!("PORT {}", server.addr().port());
            let _ = std::io::stdout().flush();
        }
        eprintln!("serving {} models on http://{} and grpc {}", specs.len(), server.addr(), server.grpc_addr());
        let stdin_eof = async {
            if args.exit_on_stdin_eof {
                let _ = tokio::task::spawn_blocking(|| {
                    std::io::copy(&mut std::io::stdin(), &mut std::io::sink())
                })
                .await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate() => {}
            _ = stdin_eof => {}
        }
        let c = server.service().staging().counters().snapshot();
        eprintln!("stopping: {c:?}");
        server.stop().await;
        Ok::<(), Box<dyn std::error::Error>>(())
    })
}

#[cfg(unix)]
async fn terminate() {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut s) => {
            s.recv().await;
        }
        Err(_) => std::future::pending().await,
    }
}
