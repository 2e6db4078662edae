//! `tollgate`: command line, logging, configuration loading, and exit codes.
//!
//! Exit status: 0 normal end (also after a SIGTERM/SIGINT drain), 2 configuration error, 1 any
//! other start-up failure, with a one-line message naming the cause. `tollgate limits` has its
//! own ([`LimitArgs`]).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use tollgate::app::Server;
use tollgate::config::{self, ConfigError};

/// jemalloc, not glibc's malloc. Each request allocates blocks of a few KB, larger than
/// glibc's per-thread cache holds, so every one went through an arena. mimalloc was as fast
/// but used twice the memory when idle. BENCHMARKS.md has the figures.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "tollgate",
    version,
    about = "A rate-limiting reverse proxy: token-bucket limits inbound, leaky-bucket pacing outbound, state in Redis"
)]
struct Cli {
    /// configuration file
    #[arg(long, env = "TOLLGATE_CONFIG", default_value = "proxy.yaml")]
    config: PathBuf,
    /// log line format (filter with RUST_LOG, e.g. RUST_LOG=tollgate=debug)
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// validate the configuration, print a summary, exit 0 (or 2 with every problem)
    Check(CheckArgs),
    /// read or reset one client's limit through a running tollgate's admin listener
    Limits {
        #[command(subcommand)]
        action: LimitsAction,
    },
}

/// `--config`, also taken after `check`. Not a global flag, so that `limits`, which asks a
/// running tollgate, does not list it; `check` talks to a person, whatever `--log-format`.
#[derive(clap::Args)]
struct CheckArgs {
    /// configuration file [default: proxy.yaml]
    #[arg(long, env = "TOLLGATE_CONFIG")]
    config: Option<PathBuf>,
}

#[derive(Subcommand)]
enum LimitsAction {
    /// print the client's state as JSON: what its next request would get
    Show(LimitArgs),
    /// forget the client's state on every instance sharing the store
    Reset(LimitArgs),
}

/// Which client of which limit, and where to ask. Exit status: 0 done, 1 the admin listener
/// could not be asked, 2 a malformed request, 3 no such route or limit, 4 the token is missing
/// or wrong, 5 the store did not answer.
#[derive(clap::Args)]
struct LimitArgs {
    /// the admin listener
    #[arg(long, env = "TOLLGATE_ADMIN", default_value = "http://127.0.0.1:9901")]
    admin: String,
    /// the route's name
    #[arg(long)]
    route: String,
    /// the limit's name
    #[arg(long)]
    limit: String,
    /// the client, as the console shows it: 192.0.2.7, %ip=192.0.2.7 (sent no key), a%20b,
    /// 192.0.2.7|gold, %sha1=... (a long key)
    #[arg(long)]
    key: String,
    /// the admin token
    #[arg(long, env = "TOLLGATE_ADMIN_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

#[derive(Clone, Copy, PartialEq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn main() -> ExitCode {
    let mut cli = Cli::parse();
    let checking = match cli.command.take() {
        Some(Command::Limits { action }) => return limits(action),
        Some(Command::Check(args)) => {
            // (placed after `check`, `--config` wins over one placed before)
            cli.config = args.config.unwrap_or(cli.config);
            true
        }
        None => false,
    };
    init_logging(cli.log_format);
    // the proxy's own lines stay JSON with `--log-format json`, its last words too; `check`
    // talks to a person
    let say = Say {
        json: cli.log_format == LogFormat::Json && !checking,
    };
    let loaded = match config::load(&cli.config) {
        Ok(loaded) => loaded,
        Err(err) => return config_failure(&err, say),
    };
    for warning in &loaded.warnings {
        if checking {
            eprintln!("warning: {warning}");
        } else {
            // through the log, so that `--log-format json` lines stay JSON
            tracing::warn!("{warning}");
        }
    }
    if checking {
        let summary = loaded.config.summary();
        let end = if summary.ends_with('\n') { "" } else { "\n" };
        let text = format!("{summary}{end}{}: ok\n", cli.config.display());
        // A reader that stops early, such as `| head`, is no failure of the check.
        let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes());
        return ExitCode::SUCCESS;
    }
    match serve(loaded.config, cli.config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            say.error(&format!("tollgate: {}", tollgate::error_line(err.as_ref())));
            ExitCode::from(1)
        }
    }
}

/// `tollgate limits show|reset`: asks the admin listener, prints its JSON answer.
fn limits(action: LimitsAction) -> ExitCode {
    use tollgate::console::client::{ask, encoded, exit_status, pretty, Ask};
    let (method, args) = match action {
        LimitsAction::Show(args) => (http::Method::GET, args),
        LimitsAction::Reset(args) => (http::Method::DELETE, args),
    };
    let path = format!(
        "/api/limits/{}/{}?key={}",
        encoded(&args.route),
        encoded(&args.limit),
        encoded(&args.key)
    );
    let asked = Ask {
        admin: &args.admin,
        method,
        path,
        token: args.token.as_deref(),
    };
    let answer = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
        .and_then(|runtime| runtime.block_on(ask(asked)));
    match answer {
        Ok((status, body)) => {
            let pretty = pretty(body);
            if status.is_success() {
                println!("{pretty}");
            } else {
                eprintln!("tollgate: {status}: {pretty}");
            }
            ExitCode::from(exit_status(status))
        }
        Err(why) => {
            eprintln!("tollgate: {why}");
            ExitCode::from(1)
        }
    }
}

/// How a failure is told on stderr: a plain line, or a JSON log line (`--log-format json`).
#[derive(Clone, Copy)]
struct Say {
    json: bool,
}

impl Say {
    fn error(self, line: &str) {
        if self.json {
            tracing::error!("{line}");
        } else {
            eprintln!("{line}");
        }
    }
}

fn config_failure(err: &ConfigError, say: Say) -> ExitCode {
    match err {
        ConfigError::Invalid(problems) => {
            for p in problems {
                say.error(&p.to_string());
            }
            say.error(&format!(
                "tollgate: {} problem(s) in the configuration",
                problems.len()
            ));
            ExitCode::from(2)
        }
        other => {
            say.error(&format!("tollgate: {other}"));
            ExitCode::from(1)
        }
    }
}

fn serve(config: tollgate::config::Config, path: PathBuf) -> anyhow::Result<()> {
    // worker 0: the server's own thread; the server starts the other workers (app::workers)
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        // Take over SIGHUP before anything is listening: its default action kills the process,
        // and a reload signal sent right after start-up must not. (Tokio keeps its handler
        // installed for the life of the process once registered.)
        let _ = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
        let shutdown = shutdown_signal();
        let server = Server::bind(config).await?;
        let watching = server.reloader().watch(path);
        let result = server.run(shutdown).await;
        watching.abort();
        result
    })
}

/// Completes on SIGTERM or SIGINT; a second one exits at once. The handlers are installed when this is called, not when
/// the future is first polled, so a signal that arrives during start-up is not lost (nor
/// kills the process with the default action).
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    async move {
        let (Ok(mut term), Ok(mut int)) = (term, int) else {
            tracing::error!("cannot listen for SIGTERM/SIGINT");
            return std::future::pending().await;
        };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
        }
        // a second one ends the drain at once (Ctrl-C twice)
        tokio::spawn(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            tracing::warn!("second signal: exiting without waiting for the drain");
            std::process::exit(0);
        });
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        // redis-rs's own lines off by default: a Cluster node that is down makes it warn on
        // every reconnect attempt (hundreds of lines a second), and with every node out it
        // logs each failed recovery as an error (several a second); tollgate's breaker logs
        // the outage once when it opens and once when it closes
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,redis=off"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Text => builder
            .event_format(tollgate::logging::TextLines::default())
            .init(),
        LogFormat::Json => builder.json().init(),
    }
}
